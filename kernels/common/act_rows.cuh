// The row walk of the activation ops (swiglu, gelu_tanh): out = act(x) row by row, written where the
// caller says (a column slice of a wider buffer: the mlp columns of the single blocks' cat buffer);
// with a prefix, out = cat([prefix, act(x)], -1): the prefix's columns copied in the same pass (the
// single block's whole cat buffer, its attention output first).
//
// Layout: rows of x (row stride x_row_stride; an act reads its columns of one row), of the prefix
// (prefix_width values, row stride prefix_row_stride) and of out (prefix_width + width values, row
// stride out_row_stride). A unit is kElems consecutive output columns of one row (the first
// prefix_units copy the prefix, the rest act on x): 16 bytes on the vector path (kVector: width and
// prefix_width multiples of kElems, 16-byte aligned pointers and row strides), one element on the
// scalar path. Each input byte is read once (a streaming load:
// nothing reads x again), each output byte written once. A CTA's blockDim.x threads take one unit
// each of a piece of one row: a row is blocks_per_row pieces, CTA b takes piece b (row
// b / blocks_per_row), then b + gridDim.x, ... (the grid is capped by the host). No reduction: the
// vector and scalar paths give the same bits.
#pragma once

namespace ditops {

// Launch parameters. Plain data, shared by the host ops (src/ops/common/act_rows) and the kernels.
struct ActRowsParams {
  const void* x;       // T rows, row stride x_row_stride (elements)
  const void* prefix;  // T rows of prefix_width, row stride prefix_row_stride; nullptr without
  void* out;           // T rows of prefix_width + width, row stride out_row_stride (elements)
  long long rows;
  long long x_row_stride;
  long long prefix_row_stride;
  long long out_row_stride;
  long long width;           // act(x)'s columns (swiglu: N, x holds 2 N)
  long long prefix_width;    // Kp
  long long prefix_units;    // the units of the prefix's columns: prefix_width / kElems (vector) or prefix_width
  long long units;           // units per row: prefix_units + width / kElems (vector) or + width (scalar)
  long long blocks_per_row;  // ceil(units / blockDim.x)
  long long blocks;          // rows * blocks_per_row
};

}  // namespace ditops

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

#include "common/memory.cuh"
#include "common/types.cuh"

namespace ditops {

// Act: `static Word<16> vector<T>(const T* x, long long width)` (the 16 bytes of out whose first column
// is x's) and `static T scalar<T>(const T* x, long long width)` (one element). kPdl:
// griddepcontrol.wait before the first read, launch_dependents after the last store.
template <typename T, bool kVector, bool kPdl, typename Act>
__device__ __forceinline__ void act_rows(const ActRowsParams& p) {
  using namespace ditops::kernel;
  constexpr int kElems = kVector ? 16 / static_cast<int>(sizeof(T)) : 1;
  if constexpr (kPdl) pdl_wait();
  for (long long b = blockIdx.x; b < p.blocks; b += gridDim.x) {  // uniform per CTA
    const long long row = b / p.blocks_per_row;
    const long long unit = (b - row * p.blocks_per_row) * blockDim.x + threadIdx.x;
    if (unit >= p.units) continue;
    T* out = static_cast<T*>(p.out) + row * p.out_row_stride + unit * kElems;
    if (unit < p.prefix_units) {  // a copy of the prefix's columns
      const T* prefix = static_cast<const T*>(p.prefix) + row * p.prefix_row_stride + unit * kElems;
      if constexpr (kVector)
        store_word<16>(out, load_word_streaming(prefix));
      else
        *out = *prefix;
      continue;
    }
    const T* x = static_cast<const T*>(p.x) + row * p.x_row_stride + (unit - p.prefix_units) * kElems;
    if constexpr (kVector)
      store_word<16>(out, Act::template vector<T>(x, p.width));
    else
      *out = Act::template scalar<T>(x, p.width);
  }
  if constexpr (kPdl) pdl_launch_dependents();
}

}  // namespace ditops

#endif  // __CUDACC__ || __CUDACC_RTC__
