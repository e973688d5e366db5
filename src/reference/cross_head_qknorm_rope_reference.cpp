// CPU reference of cross_head_qknorm_rope: the portable oracle every CUDA implementation is
// compared with. It follows docs/cross_head_qknorm_rope.md operation by operation; every fp32
// operation is one IEEE binary32 operation (compiled with -ffp-contract=off; the FMAs of the
// order are explicit std::fma):
//   sum of squares: 128 virtual threads, thread t folding the 4-element vectors t, t + 128, ...
//     with p = fma(x, x, p); warp trees (offsets 16 .. 1); (w0 + w2) + (w1 + w3);
//   rstd = rsqrt(sum / N + eps), correctly rounded here (1 / sqrt in double, rounded once): the
//     GPU's rsqrtf may differ by 1 fp32 ulp, the only legitimate reference/GPU difference;
//   y = w * (rstd * x) (rstd * x without a weight), rounded to the activation dtype (rounded) or
//     not (fp32); RoPE pairs first = a*C - c*S, second = c*C + a*S; halves (LTX-2's addcmul_)
//     first = fma(-S, c, a*C), second = fma(S, a, c*C); then one rounding at the store.
// The call is assumed validated by the facade (match_cross_head_qknorm_rope).
#include <cmath>
#include <cstdint>
#include <vector>

#include "ditops/cross_head_qknorm_rope.h"
#include "reference/half.h"

namespace ditops {
namespace {

constexpr int kThreads = 128;
constexpr int kWarp = 32;

// The sum of squares of one row in the order of PyTorch's fused RMSNorm row kernel.
float row_sum_of_squares(const std::vector<float>& x) {
  const int vectors = static_cast<int>(x.size() / 4);
  float warps[kThreads / kWarp] = {};
  for (int w = 0; w < kThreads / kWarp; ++w) {
    float lanes[kWarp];
    for (int lane = 0; lane < kWarp; ++lane) {
      float p = 0.f;
      for (int v = w * kWarp + lane; v < vectors; v += kThreads)
        for (int e = 0; e < 4; ++e) p = std::fma(x[4 * v + e], x[4 * v + e], p);
      lanes[lane] = p;
    }
    for (int offset = kWarp / 2; offset >= 1; offset /= 2)
      for (int lane = 0; lane < offset; ++lane) lanes[lane] = lanes[lane] + lanes[lane + offset];
    warps[w] = lanes[0];
  }
  return (warps[0] + warps[2]) + (warps[1] + warps[3]);
}

float rope_first(float a, float c, float cs, float sn) { return a * cs - c * sn; }
float rope_second(float a, float c, float cs, float sn) { return c * cs + a * sn; }
// split (LTX-2's addcmul_): the second product exact inside one FMA
float rope_first_fma(float a, float c, float cs, float sn) { return std::fma(-sn, c, a * cs); }
float rope_second_fma(float a, float c, float cs, float sn) { return std::fma(sn, a, c * cs); }

void rows(const CrossHeadQkNormRopeCall& call, const TensorView& t, const TensorView& weight, const CrossHeadRows& r) {
  const DType act = call.q.dtype;
  const int64_t N = r.width, D = call.options.head_dim, half = D / 2;
  const bool rounded = call.options.rounding == QkRounding::rounded;
  const CrossHeadRope rope = call.options.rope;
  std::vector<float> x(static_cast<size_t>(N)), y(static_cast<size_t>(N));
  for (int64_t b = 0; b < r.batch; ++b)
    for (int64_t s = 0; s < r.tokens; ++s) {
      const int64_t base = b * r.batch_stride + s * r.token_stride;
      for (int64_t n = 0; n < N; ++n) x[n] = ref::load_act(t.data, base + n, act);
      const float mean = row_sum_of_squares(x) / static_cast<float>(N);
      const float rstd = static_cast<float>(1.0 / std::sqrt(static_cast<double>(mean + call.options.eps)));
      for (int64_t n = 0; n < N; ++n) {
        const float normed = rstd * x[n];
        const float weighted = weight.data ? ref::load_act(weight.data, n, act) * normed : normed;
        y[n] = rounded ? ref::round_to(act, weighted) : weighted;
      }
      for (int64_t n = 0; n < N; ++n) {
        float out = y[n];
        if (rope != CrossHeadRope::none) {
          const int64_t h = n / D, d = n % D;
          int64_t j, first, second;
          if (rope == CrossHeadRope::interleaved) {
            j = d / 2;
            first = n - d % 2;
            second = first + 1;
          } else {
            j = d % half;
            first = d < half ? n : n - half;
            second = first + half;
          }
          const float cs = r.cos[b * r.cos_strides[0] + s * r.cos_strides[1] + h * r.cos_strides[2] + j * r.cos_strides[3]];
          const float sn = r.sin[b * r.sin_strides[0] + s * r.sin_strides[1] + h * r.sin_strides[2] + j * r.sin_strides[3]];
          const bool split = rope == CrossHeadRope::split;
          out = n == first ? (split ? rope_first_fma : rope_first)(y[first], y[second], cs, sn)
                           : (split ? rope_second_fma : rope_second)(y[first], y[second], cs, sn);
        }
        ref::store_act(t.data, base + n, act, out);
      }
    }
}

}  // namespace

void cross_head_qknorm_rope_reference(const CrossHeadQkNormRopeCall& call) {
  if (call.q.device.kind != DeviceKind::cpu)
    throw Error("cross_head_qknorm_rope.reference: the tensors must be on the cpu but are on " +
                device_name(call.q.device));
  rows(call, call.q, call.q_weight, call.q_rows);
  rows(call, call.k, call.k_weight, call.k_rows);
}

}  // namespace ditops
