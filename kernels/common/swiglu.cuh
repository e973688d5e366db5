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

// SwiGLU of two packed words of 16-bit T (two gate values, the two up values of the same columns).
template <typename T>
__device__ __forceinline__ u32 swiglu_word(u32 gate, u32 up) {
  T g0, g1, u0, u1;
  g0.bits = static_cast<unsigned short>(gate);
  g1.bits = static_cast<unsigned short>(gate >> 16);
  const u32 act = pack2<T>(silu(to_float(g0)), silu(to_float(g1)));
  g0.bits = static_cast<unsigned short>(act);
  g1.bits = static_cast<unsigned short>(act >> 16);
  u0.bits = static_cast<unsigned short>(up);
  u1.bits = static_cast<unsigned short>(up >> 16);
  return pack2<T>(__fmul_rn(to_float(g0), to_float(u0)), __fmul_rn(to_float(g1), to_float(u1)));
}

}  // namespace ditops::kernel
