// GELU(tanh) of the rows of x, written where the caller says: out = F.gelu(x, approximate="tanh").
//
// Numerics contract (docs/gelu_tanh.md): bit_exact against the eager chain on CUDA,
// F.gelu(x, approximate="tanh") (ditops.eager.gelu_tanh): common/gelu.cuh's steps with nvcc's fma
// (ATen's GeluCUDAKernelImpl in fp32), rounded to T (T = float: no rounding). No reduction: every
// path gives the same bits.
//
// Layout: rows of x (N values, row stride x_row_stride: e.g. the mlp columns of a fused projection)
// and of out (N values, row stride out_row_stride >= N: e.g. the mlp columns of the single blocks'
// cat buffer, so that torch.cat([attn, gelu(mlp)], -1) loses its second pass over them). A unit is
// kElems consecutive columns of one row: 16 bytes on the vector path (kVector: N a multiple of
// kElems, 16-byte aligned pointers and row strides), one element on the scalar path. Each input
// byte is read once (a streaming load: nothing reads x again), each output byte written once. A
// CTA's blockDim.x threads take one unit each of a piece of one row: a row is blocks_per_row
// pieces, CTA b takes piece b (row b / blocks_per_row), then b + gridDim.x, ... (grid capped by the host).
#pragma once

namespace ditops {

// Launch parameters. Plain data, shared by the host op (src/ops/gelu_tanh) and the kernel.
struct GeluTanhParams {
  const void* x;  // T rows of N, row stride x_row_stride (elements)
  void* out;      // T rows of N, row stride out_row_stride (elements)
  long long rows;
  long long x_row_stride;
  long long out_row_stride;
  long long units;           // units per row: N / kElems (vector) or N (scalar)
  long long blocks_per_row;  // ceil(units / blockDim.x)
  long long blocks;          // rows * blocks_per_row
};

}  // namespace ditops

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

#include "common/gelu.cuh"
#include "common/memory.cuh"
#include "common/types.cuh"

namespace ditops {

// T: kernel::bf16, kernel::f16 or float. kVector: the 16-byte path. kPdl: griddepcontrol.wait
// before the first read, launch_dependents after the last store.
template <typename T, bool kVector, bool kPdl>
__device__ void gelu_tanh_body(const GeluTanhParams& p) {
  using namespace ditops::kernel;
  constexpr int kElems = kVector ? 16 / static_cast<int>(sizeof(T)) : 1;
  if constexpr (kPdl) pdl_wait();
  for (long long b = blockIdx.x; b < p.blocks; b += gridDim.x) {  // uniform per CTA
    const long long row = b / p.blocks_per_row;
    const long long unit = (b - row * p.blocks_per_row) * blockDim.x + threadIdx.x;
    if (unit >= p.units) continue;
    const long long col = unit * kElems;
    const T* x = static_cast<const T*>(p.x) + row * p.x_row_stride + col;
    T* out = static_cast<T*>(p.out) + row * p.out_row_stride + col;
    if constexpr (kVector) {
      Word<16> w = load_word_streaming(x);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        if constexpr (sizeof(T) == 2)
          w.w[i] = gelu_tanh_word<T, true>(w.w[i]);
        else
          w.w[i] = __float_as_uint(gelu_tanh<true>(__uint_as_float(w.w[i])));
      }
      store_word<16>(out, w);
    } else {
      *out = from_float<T>(gelu_tanh<true>(to_float(*x)));
    }
  }
  if constexpr (kPdl) pdl_launch_dependents();
}

}  // namespace ditops

#endif  // __CUDACC__ || __CUDACC_RTC__
