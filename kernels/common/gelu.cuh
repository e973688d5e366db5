// GELU(tanh) as eager PyTorch computes F.gelu(x, approximate="tanh") on CUDA, shared by the
// gelu_tanh op and fp8_rowwise_quant's act=gelu_tanh: ATen's GeluCUDAKernelImpl in fp32 (opmath),
//   x_cube = (x * x) * x
//   inner  = kBeta * (x + kKappa * x_cube)   kBeta = fp32(double(M_SQRT2 * M_2_SQRTPI) * 0.5),
//                                            kKappa = fp32(0.044715)
//   0.5f * x * (1 + tanhf(inner)), rounded to T.
// nvcc contracts `x + kKappa * x_cube` into one fma when it builds PyTorch (--fmad=true), and the
// code spells that fma out. The sm_90 SASS of torch 2.11.0+cu130's
// vectorized GELU(tanh) kernel (libtorch_cuda.so) is FMUL, FMUL, FFMA(x_cube, 0.044715, x), FMUL by
// kBeta, CUDA 13's inline tanhf, FMUL 0.5 x, FADD 1, FMUL: the fma form, and this code compiles to the
// same sequence. tanhf is CUDA's (no fast math: PyTorch's build and our NVRTC flags).
#pragma once

#include "common/types.cuh"

namespace ditops::kernel {

// ATen's GELU(tanh) in fp32, before the rounding to T.
__device__ __forceinline__ float gelu_tanh(float x) {
  constexpr float kBeta = static_cast<float>(1.41421356237309504880 * 1.12837916709551257390 * 0.5);
  constexpr float kKappa = static_cast<float>(0.044715);
  const float x_cube = __fmul_rn(__fmul_rn(x, x), x);
  const float inner = __fmul_rn(kBeta, __fmaf_rn(kKappa, x_cube, x));
  return __fmul_rn(__fmul_rn(0.5f, x), __fadd_rn(1.0f, tanhf(inner)));
}

// A packed word of two 16-bit T values through GELU(tanh), each rounded back to T.
template <typename T>
__device__ __forceinline__ u32 gelu_tanh_word(u32 word) {
  T lo, hi;
  lo.bits = static_cast<unsigned short>(word);
  hi.bits = static_cast<unsigned short>(word >> 16);
  return pack2<T>(gelu_tanh(to_float(lo)), gelu_tanh(to_float(hi)));
}

}  // namespace ditops::kernel
