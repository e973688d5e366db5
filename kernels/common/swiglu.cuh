// SwiGLU as eager PyTorch computes F.silu(gate) * up on CUDA, shared by the swiglu op and
// fp8_rowwise_quant's act=swiglu:
// * SiLU is ATen's silu CUDA kernel in fp32 (opmath): x / (1 + expf(-x)), IEEE division, CUDA's
//   expf (no fast math: PyTorch's build and our NVRTC flags), rounded to T;
// * the product is ATen's mul of two T tensors: the fp32 product (exact for bf16 and f16
//   operands) rounded to T. For T = float both roundings are the identity.
#pragma once

#include "common/types.cuh"

namespace ditops::kernel {

// ATen's SiLU in fp32, before the rounding to T.
__device__ __forceinline__ float silu(float x) { return __fdiv_rn(x, __fadd_rn(1.0f, expf(-x))); }

// One gate and its up value: silu(gate) rounded to T, times up in fp32, rounded to T.
template <typename T>
__device__ __forceinline__ T swiglu_value(T gate, T up) {
  return from_float<T>(__fmul_rn(round_to<T>(silu(to_float(gate))), to_float(up)));
}

// SiLU of a packed word of two 16-bit T values, each rounded to T.
template <typename T>
__device__ __forceinline__ u32 silu_word(u32 word) {
  T x0, x1;
  x0.bits = static_cast<unsigned short>(word);
  x1.bits = static_cast<unsigned short>(word >> 16);
  return pack2<T>(silu(to_float(x0)), silu(to_float(x1)));
}

// The product half of SwiGLU: two packed activations (T) times the two up values, each in fp32,
// rounded to T.
template <typename T>
__device__ __forceinline__ u32 swiglu_mul_word(u32 act, u32 up) {
  T a0, a1, u0, u1;
  a0.bits = static_cast<unsigned short>(act);
  a1.bits = static_cast<unsigned short>(act >> 16);
  u0.bits = static_cast<unsigned short>(up);
  u1.bits = static_cast<unsigned short>(up >> 16);
  return pack2<T>(__fmul_rn(to_float(a0), to_float(u0)), __fmul_rn(to_float(a1), to_float(u1)));
}

// SwiGLU of two packed words of 16-bit T (two gate values, the two up values of the same columns).
template <typename T>
__device__ __forceinline__ u32 swiglu_word(u32 gate, u32 up) {
  return swiglu_mul_word<T>(silu_word<T>(gate), up);
}

}  // namespace ditops::kernel
