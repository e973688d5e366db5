// CPU twin of kernels/common/aten_layer_norm.cuh: the row statistics (mean, rstd) of aten's
// vectorized_layer_norm_kernel<BFloat16, float> (PyTorch 2.11), in the same operation order:
// 128 virtual threads pushing 4-element vectors into Welford states, the shfl_down tree inside
// each virtual warp, the inter-warp combine (0,2), (1,3), (0,1), rstd = rsqrt(m2 / N + eps).
// docs/layernorm_modulate.md, "Numerics", states the order step by step.
//
// Where the GPU uses MUFU approximations the CPU uses correctly rounded operations:
//   * rcp4 (MUFU.RCP + one Newton step) -> IEEE 1/x. On the counts the statistics use (positive
//     integers up to 2^24) the two agree exactly: test_layernorm_modulate proves it for every
//     count up to 2^16 and every rcp.approx seed within 2 ulp of 1/x.
//   * rsqrt.approx.f32 (MUFU.RSQ, not IEEE, documented max relative error 2^-22.9) -> 1/sqrt
//     evaluated in long double and rounded once. So the CPU rstd can differ from the GPU rstd by
//     up to 2 fp32 ulp; the mean (and m2) are identical. CPU-vs-GPU is therefore `close`; the
//     GPU kernels are bit_exact against the eager chain, which is checked on the device.
// Compiled with -ffp-contract=off: every FMA below is an explicit std::fmaf.
#pragma once

#include <cstdint>

namespace ditops::ref {

struct WelfordState {
  float mean = 0.0f;
  float m2 = 0.0f;
  float count = 0.0f;
};

struct RowStats {
  float mean = 0.0f;
  float rstd = 0.0f;
};

// IEEE 1/x (equal to the GPU's rcp4 on Welford counts, see above).
float rcp4(float x);
// One Welford push, aten's cuWelfordOnlineSum with nvcc's contraction.
void welford_push(WelfordState& s, float value);
// aten's cuWelfordCombine(dataB = self, dataA = other) with nvcc's contraction.
WelfordState welford_combine(const WelfordState& self_b, const WelfordState& other_a);
// 32 lane states folded as shfl_down offsets 16..1 do; returns lane 0's state. `lanes` is
// clobbered.
WelfordState warp_fold_down(WelfordState (&lanes)[32]);
// Correctly rounded 1/sqrt(x) (long double, one rounding), with CUDA's subnormal scaling
// applied first so the structure mirrors the GPU (the scaling is exact).
float aten_rsqrtf(float x);

// The final Welford state of a row of n values (n % 4 == 0, n > 0), before the division.
WelfordState aten_row_welford(const float* x, int64_t n);
// mean and rstd of a row of n fp32 values (n % 4 == 0, n > 0).
RowStats aten_row_stats(const float* x, int64_t n, float eps);
// The same for a row of bf16 values given as raw bits.
RowStats aten_row_stats_bf16(const uint16_t* x, int64_t n, float eps);

}  // namespace ditops::ref
