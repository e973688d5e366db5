// The RoPE cos/sin tables of FLUX's position embedders: for each row s of ids and each rotary pair j
// of the concatenated axes (axis a, pair k = j - pair_start[a]):
//   angle = (double)ids[s, a] * (1.0 / pow(theta, (double)(2k) * inv_dim[a]))
//   cos[s, 2j] = cos[s, 2j + 1] = (float)cos(angle); sin likewise.
//
// Numerics contract (docs/rope_tables.md): bit_exact against the eager chain on CUDA
// (ditops.eager.rope_tables: diffusers' get_1d_rotary_pos_embed with float64 frequencies): every
// step in double with one IEEE rounding each, as ATen's CUDA kernels do (the true-divide by the
// scalar d is a product with the scalar's reciprocal, inv_dim = 1.0 / d computed on the host in
// double: the same bits), CUDA's double pow, cos and sin, each result rounded to float once.
// cos and sin are separate calls; a compiler that merges them into sincos must give the same bits
// (the first device run's torch.equal checks it). No reduction: every thread's values are its own.
//
// Layout: a unit is one (row, pair): it reads one f32 position and writes two floats of cos and two
// of sin. Threads walk the units with a grid stride.
#pragma once

namespace ditops {

// Launch parameters. Plain data, shared by the host op (src/ops/rope_tables) and the kernel.
struct RopeTablesParams {
  const float* ids;  // [rows, >= axes], strides ids_row_stride, ids_col_stride (elements)
  float* cos;        // [rows, width] contiguous
  float* sin;        // [rows, width] contiguous
  long long rows;
  long long ids_row_stride;
  long long ids_col_stride;
  long long width;  // D: 2 * pairs
  long long pairs;  // D / 2
  long long units;  // rows * pairs
  int axes;         // 1..4
  long long pair_start[5];  // the first pair of axis a; pair_start[axes] = pairs
  double inv_dim[4];        // 1.0 / d_a, rounded once (eager's reciprocal of the CPU scalar)
  double theta;
};

}  // namespace ditops

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

#include "common/memory.cuh"

namespace ditops {

// kPdl: griddepcontrol.wait before the first read, launch_dependents after the last store.
template <bool kPdl>
__device__ void rope_tables_body(const RopeTablesParams& p) {
  if constexpr (kPdl) kernel::pdl_wait();
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long u = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; u < p.units; u += stride) {
    const long long s = u / p.pairs;
    const long long j = u - s * p.pairs;
    int a = 0;
    while (a + 1 < p.axes && j >= p.pair_start[a + 1]) ++a;
    const long long k = j - p.pair_start[a];
    // explicit round-to-nearest operations: nothing for the compiler to contract or reassociate
    const double e = __dmul_rn(static_cast<double>(2 * k), p.inv_dim[a]);
    const double f = __ddiv_rn(1.0, pow(p.theta, e));
    const double pos = static_cast<double>(p.ids[s * p.ids_row_stride + a * p.ids_col_stride]);
    const double angle = __dmul_rn(pos, f);
    const float c = __double2float_rn(cos(angle));
    const float sn = __double2float_rn(sin(angle));
    const long long at = s * p.width + 2 * j;
    p.cos[at] = c;
    p.cos[at + 1] = c;
    p.sin[at] = sn;
    p.sin[at + 1] = sn;
  }
  if constexpr (kPdl) kernel::pdl_launch_dependents();
}

}  // namespace ditops

#endif  // __CUDACC__ || __CUDACC_RTC__
