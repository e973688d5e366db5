// GELU(tanh) of the rows of x, written where the caller says: out = F.gelu(x, approximate="tanh").
//
// Numerics contract (docs/gelu_tanh.md): bit_exact against the eager chain on CUDA,
// F.gelu(x, approximate="tanh") (ditops.eager.gelu_tanh): common/gelu.cuh's steps with nvcc's fma
// (ATen's GeluCUDAKernelImpl in fp32), rounded to T (T = float: no rounding).
//
// Layout: common/act_rows.cuh's walk over rows of x (N values, row stride x_row_stride: e.g. the mlp
// columns of a fused projection) and of out (N values, row stride out_row_stride >= N: e.g. the mlp
// columns of the single blocks' cat buffer, so that torch.cat([attn, gelu(mlp)], -1) loses its second
// pass over them); a unit reads 16 bytes of x (one streaming load) and writes 16 bytes of out.
#pragma once

#include "common/act_rows.cuh"

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

#include "common/gelu.cuh"

namespace ditops {

namespace gelu_tanh_detail {

using namespace ditops::kernel;

struct GeluTanhAct {
  template <typename T>
  static __device__ __forceinline__ Word<16> vector(const T* x, long long) {
    Word<16> w = load_word_streaming(x);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if constexpr (sizeof(T) == 2)
        w.w[i] = gelu_tanh_word<T>(w.w[i]);
      else
        w.w[i] = __float_as_uint(gelu_tanh(__uint_as_float(w.w[i])));
    }
    return w;
  }
  template <typename T>
  static __device__ __forceinline__ T scalar(const T* x, long long) {
    return from_float<T>(gelu_tanh(to_float(*x)));
  }
};

}  // namespace gelu_tanh_detail

// T: kernel::bf16, kernel::f16 or float. kVector: the 16-byte path. kPdl: griddepcontrol.wait
// before the first read, launch_dependents after the last store.
template <typename T, bool kVector, bool kPdl>
__device__ void gelu_tanh_body(const ActRowsParams& p) {
  act_rows<T, kVector, kPdl, gelu_tanh_detail::GeluTanhAct>(p);
}

}  // namespace ditops

#endif  // __CUDACC__ || __CUDACC_RTC__
