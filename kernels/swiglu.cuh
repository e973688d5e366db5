// SwiGLU of the rows of x = [gate | up]: out = silu(x[..., :N]) * x[..., N:].
//
// Numerics contract (docs/swiglu.md): bit_exact against the eager chain on CUDA,
// F.silu(x[..., :N]) * x[..., N:] (ditops.eager.swiglu): common/swiglu.cuh's steps, ATen's silu in
// fp32 rounded to T, then the fp32 product rounded to T (T = float: no rounding in between, as
// eager's fp32 chain).
//
// Layout: common/act_rows.cuh's walk over rows of x (2N values, row stride x_row_stride) and of out
// (N values, row stride out_row_stride >= N: a column slice of a wider buffer, e.g. the mlp columns
// of a cat buffer); a unit reads 16 bytes of the gate columns and 16 of the up columns N further on
// (two streaming loads) and writes 16 bytes of out.
#pragma once

#include "common/act_rows.cuh"

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

#include "common/swiglu.cuh"

namespace ditops {

namespace swiglu_detail {

using namespace ditops::kernel;

struct SwigluAct {
  // 16 bytes of gate and of up (the same columns) through SwiGLU.
  template <typename T>
  static __device__ __forceinline__ Word<16> vector(const T* gate, long long width) {
    const Word<16> g = load_word_streaming(gate), u = load_word_streaming(gate + width);
    Word<16> out;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if constexpr (sizeof(T) == 2) {
        out.w[i] = swiglu_word<T>(g.w[i], u.w[i]);
      } else {
        out.w[i] = __float_as_uint(swiglu_value<float>(__uint_as_float(g.w[i]), __uint_as_float(u.w[i])));
      }
    }
    return out;
  }
  template <typename T>
  static __device__ __forceinline__ T scalar(const T* gate, long long width) {
    return swiglu_value<T>(*gate, gate[width]);
  }
};

}  // namespace swiglu_detail

// T: kernel::bf16, kernel::f16 or float. kVector: the 16-byte path. kPdl: griddepcontrol.wait
// before the first read, launch_dependents after the last store.
template <typename T, bool kVector, bool kPdl>
__device__ void swiglu_body(const ActRowsParams& p) {
  act_rows<T, kVector, kPdl, swiglu_detail::SwigluAct>(p);
}

}  // namespace ditops

#endif  // __CUDACC__ || __CUDACC_RTC__
