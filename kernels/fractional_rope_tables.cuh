// The RoPE cos/sin tables of fractional positions (LTX-2's LTX2AudioVideoRotaryPosEmbed): for row
// (b, p) and table column j past the pad, with pair jj = (j - pad) (split) or (j - pad) / 2
// (interleaved), frequency k = jj / A and axis a = jj % A:
//   mid   = (start + end) * 0.5f                  coords [B, A, P, 2] bounds; coords [B, A, P]: mid itself
//   g     = mid * inv_max[a]                      eager's divide by a CPU scalar: its reciprocal, then *
//   v     = g * 2 - 1                             two fp32 kernels in eager: g * 2 exact, then - 1
//   cos[b, p, j] = cosf(v * freqs[k]), sin[b, p, j] = sinf(v * freqs[k]); pad columns: 1 and 0.
//
// Numerics contract (docs/fractional_rope_tables.md): bit_exact against the eager chain on CUDA
// (ditops.eager.fractional_rope_tables: the module's forward after its float64 frequencies, which
// the caller passes as fp32 freqs): every step one IEEE fp32 operation as ATen's kernels round it
// (inv_max[a] = 1.0f / max_pos[a] in fp32, as ATen's host computes the reciprocal of a scalar),
// CUDA's cosf and sinf (no fast math). No reduction: every thread's values are its own.
//
// Layout: cos and sin [rows, width] f32 contiguous (rows = B * P, b-major). A thread owns 4
// consecutive columns (its CTA's column block, threadIdx.x) of rows r, r + row_blocks, ... (r its
// CTA's row block; a 1-D grid of row_blocks x column_blocks CTAs): per row it
// computes the A axes' v once, then 4 angles, cosf and sinf, and one 16-byte store into each table
// (kVector: width % 4 == 0 and 16-byte aligned tables; else element stores). The axis count and the
// layout are template parameters: a column's frequency and axis come from a division by a constant.
#pragma once

namespace ditops {

constexpr int kFractionalRopeMaxAxes = 3;

// Launch parameters. Plain data, shared by the host op (src/ops/fractional_rope_tables) and the kernel.
struct FractionalRopeTablesParams {
  const float* coords;  // [B, A, P(, 2)], strides below (elements)
  const float* freqs;   // [F] contiguous
  float* cos;           // [B * P, width] contiguous
  float* sin;           // likewise
  long long positions;  // P
  long long rows;       // B * P
  int width;            // the tables' columns
  int pad;              // leading columns of cos 1, sin 0
  int column_blocks;    // CTAs across a row (blockIdx.x % column_blocks); rows: blockIdx.x / column_blocks
  int row_blocks;       // gridDim.x / column_blocks: the row stride
  long long stride_b, stride_a, stride_p, stride_e;  // coords' strides (stride_e: the bound's; 0 without)
  int bounds;           // coords hold [start, end) bounds (the midpoint is the position)
  float inv_max[kFractionalRopeMaxAxes];  // fp32(1 / max_pos[a])
};

}  // namespace ditops

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

#include "common/memory.cuh"

namespace ditops {

namespace fractional_rope_detail {

// Axis a's v = (pos / max_pos) * 2 - 1 of row (b, pos), each step one rounding as eager's kernels.
__device__ __forceinline__ float axis_value(const FractionalRopeTablesParams& p, long long b, long long pos, int a) {
  const float* c = p.coords + b * p.stride_b + a * p.stride_a + pos * p.stride_p;
  // explicit round-to-nearest operations: nothing for the compiler to contract
  const float mid = p.bounds ? __fmul_rn(__fadd_rn(c[0], c[p.stride_e]), 0.5f) : c[0];
  const float g = __fmul_rn(mid, p.inv_max[a]);
  return __fadd_rn(__fmul_rn(g, 2.0f), -1.0f);
}

}  // namespace fractional_rope_detail

// kAxes: A (1..3). kInterleaved: each value twice. kVector: 16-byte stores (width % 4 == 0, aligned
// tables). kPdl: griddepcontrol.wait before the first read, launch_dependents after the last store.
template <int kAxes, bool kInterleaved, bool kVector, bool kPdl>
__device__ void fractional_rope_tables_body(const FractionalRopeTablesParams& p) {
  using namespace fractional_rope_detail;
  if constexpr (kPdl) kernel::pdl_wait();
  const int row_block = static_cast<int>(blockIdx.x) / p.column_blocks;
  const int column_block = static_cast<int>(blockIdx.x) - row_block * p.column_blocks;
  const int j0 = (column_block * static_cast<int>(blockDim.x) + static_cast<int>(threadIdx.x)) * 4;
  if (j0 < p.width) {
    for (long long row = row_block; row < p.rows; row += p.row_blocks) {
      const long long b = row / p.positions, pos = row - b * p.positions;
      const float v0 = axis_value(p, b, pos, 0);
      const float v1 = kAxes > 1 ? axis_value(p, b, pos, 1) : 0.0f;
      const float v2 = kAxes > 2 ? axis_value(p, b, pos, 2) : 0.0f;
      float c[4], s[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int j = j0 + e;
        c[e] = 1.0f;
        s[e] = 0.0f;
        if (j >= p.pad && j < p.width) {
          const int jj = kInterleaved ? (j - p.pad) >> 1 : j - p.pad;
          const int k = jj / kAxes, a = jj - k * kAxes;
          const float v = a == 0 ? v0 : (a == 1 ? v1 : v2);
          const float x = __fmul_rn(v, p.freqs[k]);
          c[e] = cosf(x);
          s[e] = sinf(x);
        }
      }
      float* cos_row = p.cos + row * p.width;
      float* sin_row = p.sin + row * p.width;
      if constexpr (kVector) {
        kernel::Word<16> wc, ws;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          wc.w[e] = __float_as_uint(c[e]);
          ws.w[e] = __float_as_uint(s[e]);
        }
        kernel::store_word<16>(cos_row + j0, wc);
        kernel::store_word<16>(sin_row + j0, ws);
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (j0 + e < p.width) {
            cos_row[j0 + e] = c[e];
            sin_row[j0 + e] = s[e];
          }
      }
    }
  }
  if constexpr (kPdl) kernel::pdl_launch_dependents();
}

}  // namespace ditops

#endif  // __CUDACC__ || __CUDACC_RTC__
