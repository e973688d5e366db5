// CPU reference of fp8_linear (include/ditops/fp8_linear.h): the portable implementation and the
// op test driver's reference.
//
// Order, fixed and documented: x quantized to e4m3 by fp8_static_quant_reference when 16-bit;
// per output acc = 0.0f, then acc += float(xq[m, k]) * float(w[n, k]) for k = 0 .. K-1 (every
// product exact in fp32: two 4-bit significands), y = acc * (x_scale * w_scale), y += bias[n],
// out = bf16 RNE of y. Compiled without FP contraction (CMake), so no FMA merges these steps.
#include <algorithm>
#include <cstdint>
#include <thread>
#include <vector>

#include "ditops/fp8_linear.h"
#include "ditops/fp8_static_quant.h"
#include "reference/fp8_fp4.h"
#include "reference/half.h"

namespace ditops {
namespace {

constexpr int64_t kTokenBlock = 16;  // independent accumulators per weight row: a row is read once per block

void run_columns(const Fp8LinearCall& c, const std::vector<float>& xq, float scale, int64_t first, int64_t last) {
  const int64_t K = c.k, N = c.n;
  const uint8_t* w = static_cast<const uint8_t*>(c.w.data);
  const uint16_t* bias = c.has_bias ? static_cast<const uint16_t*>(c.bias.data) : nullptr;
  uint16_t* out = static_cast<uint16_t*>(c.out.data);
  std::vector<float> row(static_cast<size_t>(K));
  for (int64_t n = first; n < last; ++n) {
    for (int64_t k = 0; k < K; ++k) row[k] = ref::e4m3_to_float(w[n * K + k]);
    for (int64_t m0 = 0; m0 < c.m; m0 += kTokenBlock) {
      const int64_t count = std::min(kTokenBlock, c.m - m0);
      float acc[kTokenBlock] = {};
      // xq is [K, M]: the block's tokens are adjacent per k (empty for K = 0: no pointer into it)
      const float* xk = K > 0 ? xq.data() + m0 : nullptr;
      for (int64_t k = 0; k < K; ++k, xk += c.m)
        for (int64_t i = 0; i < count; ++i) acc[i] += xk[i] * row[k];
      for (int64_t i = 0; i < count; ++i) {
        float y = acc[i] * scale;
        if (bias) y += ref::bf16_to_float(bias[n]);
        out[(m0 + i) * N + n] = ref::float_to_bf16_rne(y);
      }
    }
  }
}

}  // namespace

void fp8_linear_reference(const Fp8LinearCall& c) {
  if (c.x.device.kind != DeviceKind::cpu)
    throw Error("fp8_linear.reference: the tensors must be on the cpu but are on " + device_name(c.x.device));
  if (c.m == 0 || c.n == 0) return;  // the extents of an empty call may overflow a product
  const int64_t M = c.m, K = c.k;
  std::vector<uint8_t> bytes(static_cast<size_t>(M * K));
  if (c.x.dtype == DType::f8e4m3fn) {
    std::copy_n(static_cast<const uint8_t*>(c.x.data), M * K, bytes.data());
  } else {
    Fp8StaticQuantOptions q;
    q.fp8_reciprocal = c.options.fp8_reciprocal;
    const Fp8StaticQuantCall quant = match_fp8_static_quant(
        c.x, c.x_scale, TensorView::contiguous(bytes.data(), DType::f8e4m3fn, c.x.device, {M, K}), q);
    fp8_static_quant_reference(quant);
  }
  std::vector<float> xq(bytes.size());  // transposed to [K, M]
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) xq[k * M + m] = ref::e4m3_to_float(bytes[m * K + k]);
  const float scale = *static_cast<const float*>(c.x_scale.data) * *static_cast<const float*>(c.w_scale.data);

  // Threads over output columns for model-sized calls (each column's order is the same).
  int64_t work = 0;  // saturated: only compared with the threading threshold
  if (__builtin_mul_overflow(c.m * c.n, K, &work)) work = INT64_MAX;
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  threads = static_cast<int>(std::min<int64_t>({threads, std::max<int64_t>(1, work / (1 << 22)), c.n}));
  if (threads <= 1) {
    run_columns(c, xq, scale, 0, c.n);
    return;
  }
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back(run_columns, std::cref(c), std::cref(xq), scale, c.n * t / threads, c.n * (t + 1) / threads);
  for (auto& th : pool) th.join();
}

}  // namespace ditops
