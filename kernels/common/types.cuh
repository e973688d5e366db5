// Scalar types and exact conversions for device code. No CUDA headers: the kernels compile under
// NVRTC with nothing but the embedded sources, and under nvcc unchanged.
#pragma once

namespace ditops::kernel {

using i32 = int;
using i64 = long long;
using u32 = unsigned int;
using u64 = unsigned long long;

// 16-bit floating-point storage; arithmetic is always done in fp32.
struct bf16 {
  unsigned short bits;
};
struct f16 {
  unsigned short bits;
};
// float8_e4m3fn storage (common/fp8.cuh converts it).
struct e4m3 {
  unsigned char bits;
};

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(bf16 x) {
  return __int_as_float(static_cast<int>(static_cast<u32>(x.bits) << 16));  // exact
}
__device__ __forceinline__ float to_float(f16 x) {
  float out;
  asm("cvt.f32.f16 %0, %1;" : "=f"(out) : "h"(x.bits));  // exact
  return out;
}

// Round-to-nearest-even conversion of an fp32 value to T (NaN stays NaN, overflow to inf).
template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ bf16 from_float<bf16>(float x) {
  bf16 out;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(out.bits) : "f"(x));
  return out;
}
template <>
__device__ __forceinline__ f16 from_float<f16>(float x) {
  f16 out;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(out.bits) : "f"(x));
  return out;
}

// Two fp32 values to E4M3 (round to nearest even, saturating to +-448; NaN stays NaN), packed in
// the low 16 bits: lo in bits 0..7, hi in bits 8..15 (sm_89+).
__device__ __forceinline__ u32 e4m3x2_rn_satfinite(float lo, float hi) {
  unsigned short packed;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(packed) : "f"(hi), "f"(lo));
  return packed;
}

// inv = 1 / *input_scale for static fp8 quantization, the scale read on the device (no host
// sync): kDivFull false is IEEE division (div.rn), what eager `x.float() * (1.0 / input_scale)`
// computes; kDivFull true is PTX div.full.f32 (<= 2 ulp), what Triton lowers `1.0 / scale` to
// (SGLang's static_quant_fp8). No scale is refused here (IEEE: 0 -> inf, NaN -> NaN, inf -> 0;
// then the product and the saturating conversion decide the byte, as in eager). Shared by
// layernorm_modulate_fp8 and token_cat_fp8 (moved here unchanged from layernorm_modulate.cuh).
template <bool kDivFull>
__device__ __forceinline__ float fp8_inverse(const float* input_scale) {
  float s;
  asm("ld.global.nc.f32 %0, [%1];" : "=f"(s) : "l"(input_scale));
  if constexpr (kDivFull) {
    float inv;
    asm("div.full.f32 %0, %1, %2;" : "=f"(inv) : "f"(1.0f), "f"(s));
    return inv;
  } else {
    return __fdiv_rn(1.0f, s);
  }
}

// x rounded to T and back: the value a 16-bit store followed by a reload would give.
template <typename T>
__device__ __forceinline__ float round_to(float x) {
  return to_float(from_float<T>(x));
}

// Packed bf16x2 multiply and add with one rounding (RNE) per lane: mul.rn/add.rn.bf16x2 on sm_90+,
// the exact fp32 operation and an RNE conversion elsewhere (identical whenever the fp32 result is
// exact; callers state why it is, or why the double rounding cannot differ, for their operands).
__device__ __forceinline__ u32 bf16x2_from_floats(float lo, float hi) {
  u32 out;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(out) : "f"(hi), "f"(lo));
  return out;
}
__device__ __forceinline__ float bf16x2_lo(u32 w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16x2_hi(u32 w) { return __uint_as_float(w & 0xFFFF0000u); }

__device__ __forceinline__ u32 mul_rn_bf16x2(u32 a, u32 b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  u32 out;
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(out) : "r"(a), "r"(b));
  return out;
#else
  return bf16x2_from_floats(__fmul_rn(bf16x2_lo(a), bf16x2_lo(b)), __fmul_rn(bf16x2_hi(a), bf16x2_hi(b)));
#endif
}
__device__ __forceinline__ u32 add_rn_bf16x2(u32 a, u32 b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  u32 out;
  asm("add.rn.bf16x2 %0, %1, %2;" : "=r"(out) : "r"(a), "r"(b));
  return out;
#else
  return bf16x2_from_floats(__fadd_rn(bf16x2_lo(a), bf16x2_lo(b)), __fadd_rn(bf16x2_hi(a), bf16x2_hi(b)));
#endif
}

// The same for f16x2 (mul.rn/add.rn.f16x2 exist from sm_53).
__device__ __forceinline__ u32 f16x2_from_floats(float lo, float hi) {
  u32 out;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(out) : "f"(hi), "f"(lo));
  return out;
}
__device__ __forceinline__ u32 mul_rn_f16x2(u32 a, u32 b) {
  u32 out;
  asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(out) : "r"(a), "r"(b));
  return out;
}
__device__ __forceinline__ u32 add_rn_f16x2(u32 a, u32 b) {
  u32 out;
  asm("add.rn.f16x2 %0, %1, %2;" : "=r"(out) : "r"(a), "r"(b));
  return out;
}

// Two fp32 values rounded to T (RNE) and packed (lo in bits 0..15).
template <typename T>
__device__ __forceinline__ u32 pack2(float lo, float hi);
template <>
__device__ __forceinline__ u32 pack2<bf16>(float lo, float hi) {
  return bf16x2_from_floats(lo, hi);
}
template <>
__device__ __forceinline__ u32 pack2<f16>(float lo, float hi) {
  return f16x2_from_floats(lo, hi);
}

}  // namespace ditops::kernel
