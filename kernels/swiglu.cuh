// SwiGLU of the rows of x = [gate | up]: out = silu(x[..., :N]) * x[..., N:].
//
// Numerics contract (docs/swiglu.md): bit_exact against the eager chain on CUDA,
// F.silu(x[..., :N]) * x[..., N:] (ditops.eager.swiglu): common/swiglu.cuh's steps, ATen's silu in
// fp32 rounded to T, then the fp32 product rounded to T (T = float: no rounding in between, as
// eager's fp32 chain). No reduction: every path gives the same bits.
//
// Layout: rows of x (2N values, row stride x_row_stride) and of out (N values, row stride
// out_row_stride >= N: a column slice of a wider buffer, e.g. the mlp columns of a cat buffer).
// A unit is kElems consecutive output columns of one row: 16 bytes on the vector path (kVector:
// N a multiple of kElems, 16-byte aligned pointers and row strides), one element on the scalar
// path. Each input byte is read once (x as a streaming load: nothing reads it again), each output
// byte written once. A CTA's blockDim.x threads take one unit each of a piece of one row: a row is
// blocks_per_row pieces, CTA b takes piece b (row b / blocks_per_row), then b + gridDim.x, ... (the
// grid is capped by the host).
#pragma once

namespace ditops {

// Launch parameters. Plain data, shared by the host op (src/ops/swiglu) and the kernel.
struct SwigluParams {
  const void* x;  // T rows of 2 N, row stride x_row_stride (elements)
  void* out;      // T rows of N, row stride out_row_stride (elements)
  long long rows;
  long long x_row_stride;
  long long out_row_stride;
  long long width;  // N
  long long units;  // units per row: N / kElems (vector) or N (scalar)
  long long blocks_per_row;  // ceil(units / blockDim.x)
  long long blocks;          // rows * blocks_per_row
};

}  // namespace ditops

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

#include "common/memory.cuh"
#include "common/swiglu.cuh"
#include "common/types.cuh"

namespace ditops {

namespace swiglu_detail {

using namespace ditops::kernel;

// 16 bytes of gate and of up (the same columns) through SwiGLU.
template <typename T>
__device__ __forceinline__ Word<16> swiglu_vector(const Word<16>& gate, const Word<16>& up) {
  Word<16> out;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (sizeof(T) == 2) {
      out.w[i] = swiglu_word<T>(gate.w[i], up.w[i]);
    } else {
      out.w[i] = __float_as_uint(swiglu_value<float>(__uint_as_float(gate.w[i]), __uint_as_float(up.w[i])));
    }
  }
  return out;
}

}  // namespace swiglu_detail

// T: kernel::bf16, kernel::f16 or float. kVector: the 16-byte path. kPdl: griddepcontrol.wait
// before the first read, launch_dependents after the last store.
template <typename T, bool kVector, bool kPdl>
__device__ void swiglu_body(const SwigluParams& p) {
  using namespace swiglu_detail;
  constexpr int kElems = kVector ? 16 / static_cast<int>(sizeof(T)) : 1;
  if constexpr (kPdl) pdl_wait();
  for (long long b = blockIdx.x; b < p.blocks; b += gridDim.x) {  // uniform per CTA
    const long long row = b / p.blocks_per_row;
    const long long unit = (b - row * p.blocks_per_row) * blockDim.x + threadIdx.x;
    if (unit >= p.units) continue;
    const long long col = unit * kElems;
    const T* gate = static_cast<const T*>(p.x) + row * p.x_row_stride + col;
    T* out = static_cast<T*>(p.out) + row * p.out_row_stride + col;
    if constexpr (kVector) {
      const Word<16> g = load_word_streaming(gate), u = load_word_streaming(gate + p.width);
      store_word<16>(out, swiglu_vector<T>(g, u));
    } else {
      *out = swiglu_value<T>(*gate, gate[p.width]);
    }
  }
  if constexpr (kPdl) pdl_launch_dependents();
}

}  // namespace ditops

#endif  // __CUDACC__ || __CUDACC_RTC__
