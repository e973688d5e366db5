// Static e4m3 quantization and e4m3 decoding shared by the FP8 kernels (token_cat_fp8,
// fp8_static_quant, fp8_linear): the same instructions wherever a 16-bit value becomes e4m3, so
// a fused quantization gives the bytes the standalone quantizer gives.
//
//   q = cvt.rn.satfinite.e4m3(x * inv)      inv = common/types.cuh fp8_inverse (ieee | div_full)
//
// One mul.rn per element (no FMA to contract), then the RNE conversion that saturates finite
// values and infinities to +-448; a NaN product stays NaN (0x7F).
#pragma once

#include "common/memory.cuh"
#include "common/types.cuh"

namespace ditops::kernel {

// Four e4m3 bytes of x[0..3] * inv (byte i = element i).
__device__ __forceinline__ u32 e4m3x4_scaled(float x0, float x1, float x2, float x3, float inv) {
  return e4m3x2_rn_satfinite(__fmul_rn(x0, inv), __fmul_rn(x1, inv)) |
         (e4m3x2_rn_satfinite(__fmul_rn(x2, inv), __fmul_rn(x3, inv)) << 16);
}

// Eight 16-bit elements (one 16-byte word, T = bf16 or f16) quantized to eight e4m3 bytes: *lo
// holds elements 0-3, *hi elements 4-7.
template <typename T>
__device__ __forceinline__ void e4m3x8_scaled(const Word<16>& src, float inv, u32* lo, u32* hi) {
  *lo = e4m3x4_scaled(to_float(word_element<T>(src, 0)), to_float(word_element<T>(src, 1)),
                      to_float(word_element<T>(src, 2)), to_float(word_element<T>(src, 3)), inv);
  *hi = e4m3x4_scaled(to_float(word_element<T>(src, 4)), to_float(word_element<T>(src, 5)),
                      to_float(word_element<T>(src, 6)), to_float(word_element<T>(src, 7)), inv);
}

// Two e4m3 values (the low and high byte of `pair`) as f16x2, exactly: every e4m3 value, the
// subnormals included, is an f16 value (sm_89+).
__device__ __forceinline__ u32 f16x2_from_e4m3x2(u32 pair) {
  u32 out;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(out) : "h"(static_cast<unsigned short>(pair)));
  return out;
}

// Four e4m3 bytes of a word as fp32 (exact), byte i to out[i].
__device__ __forceinline__ void e4m3x4_to_float(u32 bytes, float (&out)[4]) {
  const u32 lo = f16x2_from_e4m3x2(bytes & 0xFFFFu), hi = f16x2_from_e4m3x2(bytes >> 16);
  f16 h;
  h.bits = static_cast<unsigned short>(lo);
  out[0] = to_float(h);
  h.bits = static_cast<unsigned short>(lo >> 16);
  out[1] = to_float(h);
  h.bits = static_cast<unsigned short>(hi);
  out[2] = to_float(h);
  h.bits = static_cast<unsigned short>(hi >> 16);
  out[3] = to_float(h);
}

}  // namespace ditops::kernel
