// CPU twin of aten's vectorized LayerNorm statistics; contract in aten_layer_norm.h.
#include "reference/aten_layer_norm.h"

#include <cmath>
#include <vector>

#include "reference/half.h"

namespace ditops::ref {

namespace {
constexpr int kThreads = 128;  // aten's block: 4 warps of 32
constexpr int kWarp = 32;
constexpr int kWarps = kThreads / kWarp;
}  // namespace

float rcp4(float x) { return 1.0f / x; }

void welford_push(WelfordState& s, float value) {
  const float delta = value - s.mean;
  const float count = s.count + 1.0f;
  const float r = rcp4(count);
  const float mean = std::fmaf(delta, r, s.mean);
  s.m2 = std::fmaf(delta, value - mean, s.m2);
  s.mean = mean;
  s.count = count;
}

WelfordState welford_combine(const WelfordState& self_b, const WelfordState& other_a) {
  const float n = other_a.count + self_b.count;
  const float coef = rcp4(n > 0.0f ? n : 1.0f);
  const float delta = self_b.mean - other_a.mean;
  const float nb = coef * self_b.count;
  const float d2 = delta * delta;
  const float na = other_a.count * coef;
  const float s = other_a.m2 + self_b.m2;
  WelfordState out;
  out.mean = std::fmaf(other_a.mean, na, nb * self_b.mean);
  out.m2 = std::fmaf(nb, other_a.count * d2, s);
  out.count = n;
  if (!(n > 0.0f)) {
    out.mean = 0.0f;
    out.m2 = 0.0f;
  }
  return out;
}

WelfordState warp_fold_down(WelfordState (&lanes)[32]) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    // shfl_down: lane i reads lane i + offset, or itself past lane 31. All lanes read before any
    // writes, as a warp-wide shuffle does. Only lanes < offset feed lane 0 later, but the others
    // are computed too so the array holds what each physical lane would.
    WelfordState other[kWarp];
    for (int i = 0; i < kWarp; ++i) other[i] = lanes[i + offset < kWarp ? i + offset : i];
    for (int i = 0; i < kWarp; ++i) lanes[i] = welford_combine(lanes[i], other[i]);
  }
  return lanes[0];
}

float aten_rsqrtf(float x) {
  if (std::isnan(x) || x < 0.0f) return std::nanf("");
  if (x == 0.0f) return std::copysign(INFINITY, x);
  if (std::isinf(x)) return 0.0f;
  float scale = 1.0f;
  if (x < 1.17549435e-38f) {  // CUDA's subnormal path: x * 2^24, result * 2^12 (both exact)
    x *= 16777216.0f;
    scale = 4096.0f;
  }
  const long double r = 1.0L / std::sqrt(static_cast<long double>(x));
  return static_cast<float>(r) * scale;
}

WelfordState aten_row_welford(const float* x, int64_t n) {
  const int64_t n_vec = n / 4;
  WelfordState thread[kThreads];
  for (int t = 0; t < kThreads; ++t)
    for (int64_t v = t; v < n_vec; v += kThreads)
      for (int e = 0; e < 4; ++e) welford_push(thread[t], x[4 * v + e]);
  WelfordState warp[kWarps];
  for (int w = 0; w < kWarps; ++w) {
    WelfordState lanes[kWarp];
    for (int l = 0; l < kWarp; ++l) lanes[l] = thread[w * kWarp + l];
    warp[w] = warp_fold_down(lanes);
  }
  // Shared-memory tree: offset 2 (warp 0 += warp 2, warp 1 += warp 3), then offset 1.
  const WelfordState w0 = welford_combine(warp[0], warp[2]);
  const WelfordState w1 = welford_combine(warp[1], warp[3]);
  return welford_combine(w0, w1);
}

RowStats aten_row_stats(const float* x, int64_t n, float eps) {
  const WelfordState total = aten_row_welford(x, n);
  RowStats out;
  out.mean = total.mean;
  out.rstd = aten_rsqrtf(total.m2 / static_cast<float>(n) + eps);
  return out;
}

RowStats aten_row_stats_bf16(const uint16_t* x, int64_t n, float eps) {
  std::vector<float> row(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) row[static_cast<size_t>(i)] = bf16_to_float(x[i]);
  return aten_row_stats(row.data(), n, eps);
}

}  // namespace ditops::ref
