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
// Layout: cos and sin [rows, width] f32 contiguous (rows = B * P, b-major); a unit is 4 consecutive
// columns of one row (one 16-byte store into each table when width % 4 == 0 and the tables are
// 16-byte aligned, else element stores). Threads walk the units with a grid stride.
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
  long long width;      // the tables' columns
  long long pad;        // leading columns of cos 1, sin 0
  long long units;      // rows * ceil(width / 4)
  long long units_per_row;
  long long stride_b, stride_a, stride_p, stride_e;  // coords' strides (stride_e: the bound's; 0 without)
  int axes;             // A: 1..3
  int interleaved;      // each pair's value twice (interleaved) or once (split)
  int bounds;           // coords hold [start, end) bounds (the midpoint is the position)
  float inv_max[kFractionalRopeMaxAxes];  // fp32(1 / max_pos[a])
};

}  // namespace ditops

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

#include "common/memory.cuh"

namespace ditops {

namespace fractional_rope_detail {

// The table value's angle at column j of row (b, p); j >= pad.
__device__ __forceinline__ float angle(const FractionalRopeTablesParams& p, long long b, long long pos,
                                       long long j) {
  const long long jj = p.interleaved ? (j - p.pad) >> 1 : j - p.pad;
  const long long k = jj / p.axes;
  const int a = static_cast<int>(jj - k * p.axes);
  const float* c = p.coords + b * p.stride_b + a * p.stride_a + pos * p.stride_p;
  // explicit round-to-nearest operations: nothing for the compiler to contract
  const float mid = p.bounds ? __fmul_rn(__fadd_rn(c[0], c[p.stride_e]), 0.5f) : c[0];
  const float g = __fmul_rn(mid, p.inv_max[a]);
  const float v = __fadd_rn(__fmul_rn(g, 2.0f), -1.0f);
  return __fmul_rn(v, p.freqs[k]);
}

}  // namespace fractional_rope_detail

// kVector: 16-byte stores (width % 4 == 0, aligned tables). kPdl: griddepcontrol.wait before the
// first read, launch_dependents after the last store.
template <bool kVector, bool kPdl>
__device__ void fractional_rope_tables_body(const FractionalRopeTablesParams& p) {
  using namespace fractional_rope_detail;
  if constexpr (kPdl) kernel::pdl_wait();
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long u = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; u < p.units; u += stride) {
    const long long row = u / p.units_per_row;
    const long long j0 = (u - row * p.units_per_row) * 4;
    const long long b = row / p.positions, pos = row - b * p.positions;
    float c[4], s[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const long long j = j0 + e;
      c[e] = 1.0f;
      s[e] = 0.0f;
      if (j >= p.pad && j < p.width) {
        const float x = angle(p, b, pos, j);
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
  if constexpr (kPdl) kernel::pdl_launch_dependents();
}

}  // namespace ditops

#endif  // __CUDACC__ || __CUDACC_RTC__
