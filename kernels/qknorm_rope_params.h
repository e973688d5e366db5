// Launch parameters of the fused QK RMSNorm + RoPE kernel. Plain data, shared by the host op and
// the device code (built by the host, passed by value as a __grid_constant__ kernel argument).
#pragma once

namespace ditops {

// Heads one warp processes per unit = this many iterations x (32 / (head_dim / 8)) heads.
// The cos/sin slice of a lane depends only on the token, so a unit loads it once and reuses it
// for every head of the unit. H200, FLUX 4608x24 cold: 36.5 us (93.5 % of a copy) with units of
// 4 against 41.9 us one head per lane (docs/tuning/qknorm_rope.md; bench/experiments/qknorm_tune.cu).
constexpr int kQkChunkHeadIterations = 4;

// The sum-of-squares order, a kernel template parameter (QkNormOrder on the host;
// docs/qknorm_rope.md §1): aten's fused RMSNorm, SGLang's warp, x.float().pow(2).mean(-1).
enum : int { kQkSumAten = 0, kQkSumWarp = 1, kQkSumAtenMean = 2 };

struct QkNormRopeParams {
  void* q;                      // [T, Hq, D]
  void* k_shifted;              // k base moved back by Hq head strides: head h >= Hq of the
                                // combined (q | k) head index addresses k[:, h - Hq]
  const void* q_weight;         // [D]
  const void* k_weight;         // [D]
  const void* cos_sin_cache;    // [P, width], row stride cache_row_stride
  const void* positions;        // [T], stride positions_stride
  long long num_tokens;
  long long q_token_stride;     // elements
  long long k_token_stride;     // elements
  long long head_stride;        // elements, shared by q and k
  long long cache_row_stride;   // elements
  long long positions_stride;   // elements
  int num_q_heads;
  int num_heads;                // Hq + Hk
  // Work decomposition: a unit is (token, chunk of unit_iterations * heads-per-warp consecutive
  // heads); warps grid-stride over units. The advance of a warp's unit cursor is
  // pre-divided on the host so the loop has no division: unit += unit_token_step * chunks +
  // unit_chunk_step.
  int unit_iterations;          // 1..kQkChunkHeadIterations: small problems use short units
  int chunks_per_token;
  int unit_chunk_step;
  long long unit_token_step;
  float eps;
};

}  // namespace ditops
