// Per-stream QK RMSNorm + RoPE of a dual-stream attention into the joint [stream 1; stream 2]
// Q/K/V, V copied (include/ditops/joint_qknorm_rope.h).
//
// Numerics contract: each q and k head is qknorm_rope's (kernels/qknorm_rope.cuh,
// normalize_rotate_store with the same template arguments: the sum-of-squares order, the norm's
// rounding, the RoPE arithmetic), read from its stream's row and stored to its joint row; v is
// copied bit for bit. So the result is bit for bit qknorm_rope run in place on the concatenation
// with each stream's weights, which is the model's chain (norms, cat, RoPE) where qknorm_rope's
// rounded mode is.
//
// Layout: qknorm_rope's (8 channels per lane, 32 / (D / 8) heads per warp iteration). A unit is
// (joint row b * J + j, kind q | k | v, a chunk of unit_iterations iterations of heads); each
// kind's heads are chunked alone, so every unit is one kind (a v unit copies, with no shuffles and
// no cos/sin) and one stream (the row's). Warps grid-stride over units with a cursor that
// advances without division.
#pragma once

#include "qknorm_rope.cuh"

namespace ditops {

// One stream's q, k, v (element strides) and its norms' weights.
struct JointQkStream {
  const void* q;
  const void* k;
  const void* v;
  const void* q_weight;  // [D]
  const void* k_weight;  // [D]
  long long q_batch_stride, k_batch_stride, v_batch_stride;
  long long q_token_stride, k_token_stride, v_token_stride;
};

struct JointQkNormRopeParams {
  JointQkStream first, second;  // rows j < tokens1, and j - tokens1 after
  void* q;                      // [B, J, H, D] contiguous
  void* k;
  void* v;
  const void* cos_sin_cache;    // [P, width], row stride cache_row_stride
  const void* positions;        // [J], stride positions_stride
  long long batch;
  long long joint_tokens;       // J = tokens1 + tokens2
  long long tokens1;
  long long head_stride;        // elements, of the six inputs
  long long cache_row_stride;
  long long positions_stride;
  int heads;                    // H
  int unit_iterations;          // 1..kQkChunkHeadIterations
  int chunks_per_kind;          // ceil(H / (unit_iterations * heads per warp iteration))
  int chunks_per_row;           // 3 * chunks_per_kind
  // The cursor's advance, pre-divided on the host: chunk += unit_chunk_step (a carry adds a row),
  // j += unit_token_step (minus J with a carry into b), b += unit_batch_step.
  int unit_chunk_step;
  long long unit_token_step;
  long long unit_batch_step;
  float eps;
};

}  // namespace ditops

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

namespace ditops {

namespace qk_detail {

// Row (b, t) of one kind (0 q, 1 k, 2 v) of a stream. Fields are picked by value: a stream chosen
// at run time by reference would make the compiler address the parameter space generically.
template <typename Act>
__device__ __forceinline__ const Act* joint_source_row(const JointQkStream& s, int kind, long long b, long long t) {
  const void* base = kind == 0 ? s.q : kind == 1 ? s.k : s.v;
  const long long batch_stride = kind == 0 ? s.q_batch_stride : kind == 1 ? s.k_batch_stride : s.v_batch_stride;
  const long long token_stride = kind == 0 ? s.q_token_stride : kind == 1 ? s.k_token_stride : s.v_token_stride;
  return static_cast<const Act*>(base) + b * batch_stride + t * token_stride;
}

}  // namespace qk_detail

template <typename Act, typename CacheT, typename PosT, int D, int R, bool kNeox, bool kFullWidth,
          bool kRounded, int kSumOrder, bool kRoundTwice, bool kPdl, bool kAligned, bool kComplex = false>
__device__ void joint_qknorm_rope_body(const JointQkNormRopeParams& p) {
  using namespace qk_detail;
  using Shape = QkLaneShape<D, R, kNeox>;
  constexpr int kChunk = kQkChunkHeadIterations;
  const int unit_heads = p.unit_iterations * Shape::kHeadsPerWarp;

  const int lane = threadIdx.x & 31;
  const int slot = lane / Shape::kLanesPerHead;
  const int head_lane = lane % Shape::kLanesPerHead;
  const bool rotary_lane = head_lane < Shape::kRotaryLanes;
  const long long warp = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const long long row0 = warp / p.chunks_per_row;
  int chunk = static_cast<int>(warp - row0 * p.chunks_per_row);
  // 32-bit b and j (the host refuses more than 2^30 joint rows), dst computed after the loads:
  // ptxas -v at sm_90a, FLUX's key, 64 registers: 8 bytes of spill, 52 with both in 64 bits.
  int b = static_cast<int>(row0 / p.joint_tokens);
  int j = static_cast<int>(row0 - static_cast<long long>(b) * p.joint_tokens);

  if constexpr (kPdl) pdl_wait();

  // b, j and the chunk are warp-uniform, so are the branches and shuffles below.
  while (b < p.batch) {
    const int kind = chunk >= p.chunks_per_kind ? (chunk >= 2 * p.chunks_per_kind ? 2 : 1) : 0;
    const int head0 = (chunk - kind * p.chunks_per_kind) * unit_heads;
    const bool second = j >= p.tokens1;
    const Act* src = (second ? joint_source_row<Act>(p.second, kind, b, j - p.tokens1)
                             : joint_source_row<Act>(p.first, kind, b, j)) +
                     head_lane * kElemsPerLane;

    Word<16> raw[kChunk];  // all loads of the unit first
#pragma unroll
    for (int i = 0; i < kChunk; ++i) {
      const int head = head0 + i * Shape::kHeadsPerWarp + slot;
      if (i < p.unit_iterations && head < p.heads) {
        load_packed<Act, kAligned, false>(src + head * p.head_stride, raw[i]);
      } else {
#pragma unroll
        for (int w = 0; w < 4; ++w) raw[i].w[w] = 0u;  // +0.0 in fp16 and bf16
      }
    }
    Act* dst = static_cast<Act*>(kind == 0 ? p.q : kind == 1 ? p.k : p.v) +
               ((b * p.joint_tokens + j) * p.heads) * D + head_lane * kElemsPerLane;
    if (kind == 2) {
#pragma unroll
      for (int i = 0; i < kChunk; ++i) {
        const int head = head0 + i * Shape::kHeadsPerWarp + slot;
        if (i < p.unit_iterations && head < p.heads) {
          Act out[kElemsPerLane];
#pragma unroll
          for (int e = 0; e < kElemsPerLane; ++e) out[e] = word_element<Act>(raw[i], e);
          store_elements<Act, kElemsPerLane, kAligned>(dst + head * D, out);
        }
      }
    } else {
      Word<16> wword;
      const void* weights = second ? (kind == 0 ? p.second.q_weight : p.second.k_weight)
                                   : (kind == 0 ? p.first.q_weight : p.first.k_weight);
      load_packed<Act, kAligned, true>(static_cast<const Act*>(weights) + head_lane * kElemsPerLane, wword);
      float c[kElemsPerLane], sn[kElemsPerLane];
      if (rotary_lane) {
        const long long pos = static_cast<long long>(static_cast<const PosT*>(p.positions)[j * p.positions_stride]);
        const CacheT* cache_row = static_cast<const CacheT*>(p.cos_sin_cache) + pos * p.cache_row_stride;
        load_lane_cache<CacheT, R, kNeox, kFullWidth, kAligned, Shape::kHalfRotaryLanes>(cache_row, head_lane, c, sn);
      }
#pragma unroll
      for (int i = 0; i < kChunk; ++i) {
        // A whole iteration past the last head is skipped (warp-uniform); single heads past the
        // end compute on zeros (shuffles need every lane) and skip their store.
        if (i < p.unit_iterations && head0 + i * Shape::kHeadsPerWarp < p.heads) {
          const int head = head0 + i * Shape::kHeadsPerWarp + slot;
          float x[kElemsPerLane];
          Act weight[kElemsPerLane];  // unpacked per head: the packed word holds 4 registers, not 8
#pragma unroll
          for (int e = 0; e < kElemsPerLane; ++e) {
            x[e] = to_float(word_element<Act>(raw[i], e));
            weight[e] = word_element<Act>(wword, e);
          }
          normalize_rotate_store<Act, CacheT, D, R, kNeox, kFullWidth, kRounded, kSumOrder, kRoundTwice, kAligned,
                                 kComplex>(p.eps, dst + head * D, x, c, sn, head < p.heads, slot, head_lane, weight);
        }
      }
    }

    chunk += p.unit_chunk_step;
    int advance = static_cast<int>(p.unit_token_step);
    if (chunk >= p.chunks_per_row) {
      chunk -= p.chunks_per_row;
      ++advance;
    }
    j += advance;  // advance <= J: at most one carry
    b += static_cast<int>(p.unit_batch_step);
    if (j >= p.joint_tokens) {
      j -= p.joint_tokens;
      ++b;
    }
  }

  if constexpr (kPdl) pdl_launch_dependents();
}

}  // namespace ditops

#endif  // __CUDACC__ || __CUDACC_RTC__
