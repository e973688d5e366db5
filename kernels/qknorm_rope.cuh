// Fused in-place per-head QK RMSNorm + RoPE.
//
// Numerics contract (docs/qknorm_rope.md is the full statement):
// * Inputs are converted exactly to fp32. The sum of squares (kSumOrder): kQkSumAten replicates
//   aten's vectorized RMSNorm (virtual threads of 4 elements accumulating with fp32 FMA from +0,
//   shfl_down tree inside 32 virtual threads, then the inter-warp tree); kQkSumWarp SGLang's
//   per-head order (D/32 elements per virtual thread, FMA, XOR butterfly over 32);
//   kQkSumAtenMean x.float().pow(2).mean(-1) (squares rounded to fp32, then aten's generic
//   reduction: 4 accumulators per thread and the shfl_down tree; D = 64 and 128).
//   factor = rsqrtf(total/D + eps) with the correctly rounded quotient (aten divides or
//   multiplies by 1/D; D is a power of two, so both give the same bits) and CUDA's rsqrtf, as
//   aten computes it.
// * kRounded: n = rne16(w * (factor * x)) (aten's `gamma * (rstd * x)`), or with kRoundTwice
//   n = rne16(rne16(x * factor) * w) (diffusers' RMSNorm: cast to the weight dtype, then the
//   weight multiply in it); then RoPE with the eager chain's op-by-op rounding: fp32 cache:
//   rne16(fmul(a,c) -/+ fmul(b,s)) with no FMA; 16-bit cache: every product and the sum rounded
//   to the dtype; kComplex (interleaved pairs, fp32 cache: Qwen-Image's complex64 product)
//   rne16(fma(a, c, -(b*s))), rne16(fma(a, s, b*c)). Contract: bit_exact against the eager
//   PyTorch chain (aten order), SGLang's split chain (warp order), diffusers' RMSNorm chain
//   (aten_mean order, twice).
// * !kRounded: n = x * (factor * w) kept in fp32, y = fma(a, c, -/+ b*s), one rounding at the
//   store. Contract: close.
// * Channels >= R pass through as rne16(n).
//
// Layout: each lane owns 8 consecutive channels (16 bytes of fp16/bf16), so a head occupies
// D/8 lanes and a warp processes 32/(D/8) heads per iteration (4 at D=64, 2 at D=128, 1 at
// D=256). A warp's unit of work is one token and unit_iterations such iterations of its heads
// (heads >= Hq are k heads); warps grid-stride over units (persistent grid) with a cursor that
// advances without division.
#pragma once

// Launch parameters of the fused QK RMSNorm + RoPE kernel. Plain data, shared by the host op and
// the device code (built by the host, passed by value as a __grid_constant__ kernel argument).
namespace ditops {

// Heads one warp processes per unit = this many iterations x (32 / (head_dim / 8)) heads.
// The cos/sin slice of a lane depends only on the token, so a unit loads it once and reuses it
// for every head of the unit; 4 iterations measured fastest (docs/tuning/qknorm_rope.md;
// bench/experiments/qknorm_tune.cu).
#ifndef DITOPS_QK_CHUNK_HEAD_ITERATIONS
#define DITOPS_QK_CHUNK_HEAD_ITERATIONS 4  // bench/experiments/qknorm_tune.cu builds other values
#endif
constexpr int kQkChunkHeadIterations = DITOPS_QK_CHUNK_HEAD_ITERATIONS;

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

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

#include "common/memory.cuh"
#include "common/types.cuh"

namespace ditops {

namespace qk_detail {

using namespace ditops::kernel;

constexpr int kElemsPerLane = 8;
// One work per lane: two, with all their loads issued first, ran slower (more registers, fewer
// resident warps); units of heads per warp instead (qknorm_rope_body, docs/tuning/qknorm_rope.md).
constexpr unsigned kFullMask = 0xffffffffu;

// Sum of squares of one head in the configured order; every lane of the head returns the total.
// The partials of the order's virtual threads (kParts per lane) feed one tree: aten's shfl_down
// over a virtual warp, computed as an XOR butterfly (each add commutes, so every lane ends with
// lane 0's value).
template <int D, int kSumOrder>
__device__ __forceinline__ float head_sum_of_squares(const float (&x)[kElemsPerLane]) {
  constexpr bool kMean = kSumOrder == kQkSumAtenMean;
  static_assert(!kMean || D == 64 || D == 128, "the mean order is derived for head_dim 64 and 128");
  // kAten / kWarp: G consecutive elements per virtual thread (FMA chains). kMean: 32 virtual
  // threads; at D = 128 thread v owns elements [4v, 4v+4), at D = 64 elements v and v + 32.
  constexpr int G = kSumOrder == kQkSumAten ? 4 : kSumOrder == kQkSumWarp ? D / 32 : 1;
  constexpr int kParts = kMean ? (D == 64 ? kElemsPerLane : 2) : kElemsPerLane / G;  // per lane
  constexpr int kVirtualThreads = kMean ? 32 : D / G;
  constexpr int kVirtualWarp = kVirtualThreads < 32 ? kVirtualThreads : 32;
  float part[kParts];
  if constexpr (kMean) {
    // pow(2) rounds each square to fp32; the reduction adds them (no FMA).
    float square[kElemsPerLane];
#pragma unroll
    for (int i = 0; i < kElemsPerLane; ++i) square[i] = __fmul_rn(x[i], x[i]);
    if constexpr (D == 64) {
      // Thread v adds its two elements v and v + 32: they sit in lanes 4 apart (the upper lanes
      // compute the same sums as their partners).
#pragma unroll
      for (int i = 0; i < kElemsPerLane; ++i) part[i] = __fadd_rn(square[i], __shfl_xor_sync(kFullMask, square[i], 4));
    } else {
      // Thread v's 4-wide vector, one accumulator per component, then combined in order.
#pragma unroll
      for (int r = 0; r < kParts; ++r)
        part[r] = __fadd_rn(__fadd_rn(__fadd_rn(square[4 * r], square[4 * r + 1]), square[4 * r + 2]), square[4 * r + 3]);
    }
  } else {
#pragma unroll
    for (int r = 0; r < kParts; ++r) {
      float p = 0.0f;
#pragma unroll
      for (int i = 0; i < G; ++i) p = __fmaf_rn(x[r * G + i], x[r * G + i], p);
      part[r] = p;
    }
  }
  // Tree inside a virtual warp: offsets o = W/2 .. 1 in virtual-thread space. Offsets of at least
  // one lane's worth cross lanes; smaller offsets combine partials inside the lane.
#pragma unroll
  for (int o = kVirtualWarp / 2; o >= 1; o /= 2) {
    if (o >= kParts) {
#pragma unroll
      for (int r = 0; r < kParts; ++r) part[r] = part[r] + __shfl_xor_sync(kFullMask, part[r], o / kParts);
    } else {
#pragma unroll
      for (int r = 0; r < kParts; ++r)
        if ((r & o) == 0 && r + o < kParts) part[r] = part[r] + part[r + o];
    }
  }
  float total = part[0];
  if constexpr (kVirtualThreads > 32) {
    // aten's inter-warp tree over its 4 warps: (0,2),(1,3) add empty warps, then warp0 + warp1.
    static_assert(kVirtualThreads == 64, "head_dim <= 256");
    total = total + __shfl_xor_sync(kFullMask, total, 32 / kParts);
  }
  return total;
}

template <typename CacheT, bool kRounded, typename Act>
__device__ __forceinline__ float rotate_minus(float a, float c, float b, float s) {
  if constexpr (!kRounded) {
    return __fmaf_rn(a, c, -__fmul_rn(b, s));
  } else if constexpr (sizeof(CacheT) == 4) {
    return __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
  } else {
    return round_to<Act>(__fsub_rn(round_to<Act>(__fmul_rn(a, c)), round_to<Act>(__fmul_rn(b, s))));
  }
}

template <typename CacheT, bool kRounded, typename Act>
__device__ __forceinline__ float rotate_plus(float a, float c, float b, float s) {
  if constexpr (!kRounded) {
    return __fmaf_rn(a, c, __fmul_rn(b, s));
  } else if constexpr (sizeof(CacheT) == 4) {
    return __fadd_rn(__fmul_rn(a, c), __fmul_rn(b, s));
  } else {
    return round_to<Act>(__fadd_rn(round_to<Act>(__fmul_rn(a, c)), round_to<Act>(__fmul_rn(b, s))));
  }
}

// N consecutive cache values starting at element `offset` of a row, converted to fp32.
template <typename CacheT, int N, bool kAligned>
__device__ __forceinline__ void load_cache(const CacheT* row, long long offset, float (&out)[N]) {
  constexpr int kPerAccess = 16 / sizeof(CacheT) < N ? 16 / sizeof(CacheT) : N;
  static_assert(N % kPerAccess == 0, "whole accesses");
#pragma unroll
  for (int a = 0; a < N / kPerAccess; ++a) {
    CacheT v[kPerAccess];
    load_elements<CacheT, kPerAccess, kAligned, true>(row + offset + a * kPerAccess, v);
#pragma unroll
    for (int i = 0; i < kPerAccess; ++i) out[a * kPerAccess + i] = to_float(v[i]);
  }
}

// Geometry of one lane's share of the work.
template <int D, int R, bool kNeox>
struct QkLaneShape {
  static_assert(D == 64 || D == 128 || D == 256, "head_dim 64, 128 or 256");
  static_assert(R > 0 && R <= D, "0 < rope_dim <= head_dim");
  static_assert(R % kElemsPerLane == 0, "rotary channels cover whole lanes");
  static_assert(!kNeox || R % (2 * kElemsPerLane) == 0, "NeoX halves start on a lane boundary");
  static constexpr int kLanesPerHead = D / kElemsPerLane;
  static constexpr int kHeadsPerWarp = 32 / kLanesPerHead;
  static constexpr int kRotaryLanes = R / kElemsPerLane;
  static constexpr int kHalfRotaryLanes = kRotaryLanes / 2;
};

// The cos/sin values one rotary lane needs for its 8 channels (interleaved compact caches need
// 4 of each; the rest of the arrays is unused).
template <typename CacheT, int R, bool kNeox, bool kFullWidth, bool kAligned, int kHalfRotaryLanes>
__device__ __forceinline__ void load_lane_cache(const CacheT* cache_row, int head_lane, float (&c)[kElemsPerLane],
                                                float (&s)[kElemsPerLane]) {
  const int channel0 = head_lane * kElemsPerLane;
  if constexpr (!kNeox && !kFullWidth) {
    float ch[kElemsPerLane / 2], sh[kElemsPerLane / 2];
    load_cache<CacheT, kElemsPerLane / 2, kAligned>(cache_row, channel0 / 2, ch);
    load_cache<CacheT, kElemsPerLane / 2, kAligned>(cache_row, R / 2 + channel0 / 2, sh);
#pragma unroll
    for (int i = 0; i < kElemsPerLane / 2; ++i) {
      c[i] = ch[i];
      s[i] = sh[i];
    }
  } else if constexpr (!kNeox) {
    load_cache<CacheT, kElemsPerLane, kAligned>(cache_row, channel0, c);
    load_cache<CacheT, kElemsPerLane, kAligned>(cache_row, R + channel0, s);
  } else {
    const bool low_half = head_lane < kHalfRotaryLanes;
    const int index0 = kFullWidth ? channel0 : channel0 - (low_half ? 0 : R / 2);
    load_cache<CacheT, kElemsPerLane, kAligned>(cache_row, index0, c);
    load_cache<CacheT, kElemsPerLane, kAligned>(cache_row, (kFullWidth ? R : R / 2) + index0, s);
  }
}

// Norm + RoPE of one head slice held by this lane (x converted to fp32; c/s its cos/sin when the
// lane is rotary), then the store to `row` (x's own row in place; joint_qknorm_rope.cuh: the joint
// output). All lanes of the warp call it together (shuffles); `active` lanes store.
template <typename Act, typename CacheT, int D, int R, bool kNeox, bool kFullWidth, bool kRounded,
          int kSumOrder, bool kRoundTwice, bool kAligned, bool kComplex>
__device__ __forceinline__ void normalize_rotate_store(float eps, Act* row, const float (&x)[kElemsPerLane],
                                                       const float (&c)[kElemsPerLane], const float (&s)[kElemsPerLane],
                                                       bool active, int slot, int head_lane,
                                                       const Act (&weight)[kElemsPerLane]) {
  using Shape = QkLaneShape<D, R, kNeox>;
  static_assert(kRounded || !kRoundTwice, "a twice-rounded weight multiply needs the rounded mode");
  static_assert(!kComplex || (kRounded && !kNeox && sizeof(CacheT) == 4),
                "the complex product: rounded mode, interleaved pairs, fp32 cache");
  const float total = head_sum_of_squares<D, kSumOrder>(x);
  // total / D: D is a power of two, so the product with its exact reciprocal is the correctly
  // rounded quotient (what aten's division gives) without the division subroutine.
  const float factor = rsqrtf(__fmul_rn(total, 1.0f / D) + eps);

  float n[kElemsPerLane];
#pragma unroll
  for (int i = 0; i < kElemsPerLane; ++i) {
    const float w = to_float(weight[i]);
    if constexpr (kRoundTwice)
      n[i] = round_to<Act>(__fmul_rn(round_to<Act>(__fmul_rn(x[i], factor)), w));
    else
      n[i] = kRounded ? round_to<Act>(__fmul_rn(w, __fmul_rn(factor, x[i])))
                      : __fmul_rn(x[i], __fmul_rn(factor, w));
  }

  // RoPE on the rotary lanes. NeoX partners sit kHalfRotaryLanes lanes away; every lane takes
  // part in the shuffle (non-rotary lanes read themselves).
  float partner[kElemsPerLane];
  if constexpr (kNeox) {
    const int src_in_head = head_lane < Shape::kHalfRotaryLanes ? head_lane + Shape::kHalfRotaryLanes
                            : head_lane < Shape::kRotaryLanes   ? head_lane - Shape::kHalfRotaryLanes
                                                                : head_lane;
    const int src = slot * Shape::kLanesPerHead + src_in_head;
#pragma unroll
    for (int i = 0; i < kElemsPerLane; ++i) partner[i] = __shfl_sync(kFullMask, n[i], src);
  }

  float y[kElemsPerLane];
#pragma unroll
  for (int i = 0; i < kElemsPerLane; ++i) y[i] = n[i];
  if (head_lane < Shape::kRotaryLanes) {
    if constexpr (!kNeox) {
      // Interleaved pairs (2j, 2j+1) inside the lane.
#pragma unroll
      for (int i = 0; i < kElemsPerLane; i += 2) {
        const int j = kFullWidth ? i : i / 2;
        const int j1 = kFullWidth ? i + 1 : i / 2;
        if constexpr (kComplex) {
          // (a + ib)(c + is) as c10::complex<float> computes it in aten's mul kernel: nvcc contracts
          // a*c - b*s and a*s + b*c into one FMA each, the first product of each (checked on the H200).
          y[i] = __fmaf_rn(n[i], c[j], -__fmul_rn(n[i + 1], s[j]));
          y[i + 1] = __fmaf_rn(n[i], s[j1], __fmul_rn(n[i + 1], c[j1]));
        } else {
          y[i] = rotate_minus<CacheT, kRounded, Act>(n[i], c[j], n[i + 1], s[j]);
          y[i + 1] = rotate_plus<CacheT, kRounded, Act>(n[i + 1], c[j1], n[i], s[j1]);
        }
      }
    } else {
      const bool low_half = head_lane < Shape::kHalfRotaryLanes;
#pragma unroll
      for (int i = 0; i < kElemsPerLane; ++i)
        y[i] = low_half ? rotate_minus<CacheT, kRounded, Act>(n[i], c[i], partner[i], s[i])
                        : rotate_plus<CacheT, kRounded, Act>(n[i], c[i], partner[i], s[i]);
    }
  }

  if (active) {
    Act out[kElemsPerLane];
#pragma unroll
    for (int i = 0; i < kElemsPerLane; ++i) out[i] = from_float<Act>(y[i]);
    store_elements<Act, kElemsPerLane, kAligned>(row, out);
  }
}

template <typename Act>
__device__ __forceinline__ Act* head_row(const QkNormRopeParams& p, long long token, int head, int head_lane) {
  Act* row = head < p.num_q_heads
                 ? static_cast<Act*>(p.q) + token * p.q_token_stride + head * p.head_stride
                 : static_cast<Act*>(p.k_shifted) + token * p.k_token_stride + head * p.head_stride;
  return row + head_lane * kElemsPerLane;
}

}  // namespace qk_detail

// Work decomposition: a warp takes a unit = (token, kQkChunkHeadIterations x heads-per-warp heads),
// issues the 16-byte loads of all its heads and the position up front, loads its cos/sin slice
// once (it depends only on the token), then normalizes, rotates and stores head by head. The
// dependent position -> cos/sin chain is the limit: one head per lane serialized three memory
// latencies per head, slower than units of heads (docs/tuning/qknorm_rope.md).
template <typename Act, typename CacheT, typename PosT, int D, int R, bool kNeox, bool kFullWidth,
          bool kRounded, int kSumOrder, bool kRoundTwice, bool kPdl, bool kAligned, bool kComplex = false>
__device__ void qknorm_rope_body(const QkNormRopeParams& p) {
  using namespace qk_detail;
  using Shape = QkLaneShape<D, R, kNeox>;
  constexpr int kChunk = kQkChunkHeadIterations;
  const int unit_heads = p.unit_iterations * Shape::kHeadsPerWarp;

  const int lane = threadIdx.x & 31;
  const int slot = lane / Shape::kLanesPerHead;       // which head of an iteration
  const int head_lane = lane % Shape::kLanesPerHead;  // lane within the head
  const bool rotary_lane = head_lane < Shape::kRotaryLanes;
  const long long warp = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  long long token = warp / p.chunks_per_token;
  int chunk = static_cast<int>(warp - token * p.chunks_per_token);

  if constexpr (kPdl) pdl_wait();

  // The weight slices of this lane, both tensors (reused for every head of the loop).
  // Kept packed (8 registers, not 16): registers bound the resident warps.
  Word<16> wq, wk;
  load_packed<Act, kAligned, true>(static_cast<const Act*>(p.q_weight) + head_lane * kElemsPerLane, wq);
  load_packed<Act, kAligned, true>(static_cast<const Act*>(p.k_weight) + head_lane * kElemsPerLane, wk);

  // token is warp-uniform, so the loop and its shuffles are too.
  while (token < p.num_tokens) {
    const int head0 = chunk * unit_heads + slot;
    // All loads of the unit first: the heads, then the position and this lane's cos/sin.
    Word<16> raw[kChunk];  // packed: 4 registers per head
#pragma unroll
    for (int j = 0; j < kChunk; ++j) {
      const int head = head0 + j * Shape::kHeadsPerWarp;
      if (j < p.unit_iterations && head < p.num_heads) {
        load_packed<Act, kAligned, false>(head_row<Act>(p, token, head, head_lane), raw[j]);
      } else {
#pragma unroll
        for (int i = 0; i < 4; ++i) raw[j].w[i] = 0u;  // +0.0 in fp16 and bf16
      }
    }
    float c[kElemsPerLane], s[kElemsPerLane];
    if (rotary_lane) {
      const long long pos = static_cast<long long>(static_cast<const PosT*>(p.positions)[token * p.positions_stride]);
      const CacheT* cache_row = static_cast<const CacheT*>(p.cos_sin_cache) + pos * p.cache_row_stride;
      load_lane_cache<CacheT, R, kNeox, kFullWidth, kAligned, Shape::kHalfRotaryLanes>(cache_row, head_lane, c, s);
    }
#pragma unroll
    for (int j = 0; j < kChunk; ++j) {
      // A whole iteration past the last head of the token is skipped (warp-uniform); single heads
      // past the end compute on zeros (shuffles need every lane) and skip their store.
      if (j < p.unit_iterations && chunk * unit_heads + j * Shape::kHeadsPerWarp < p.num_heads) {
        const int head = head0 + j * Shape::kHeadsPerWarp;
        const bool is_q = head < p.num_q_heads;
        float x[kElemsPerLane];
        Act weight[kElemsPerLane];  // chosen word-wise: a chosen array would live in local memory
        Word<16> wword;
#pragma unroll
        for (int i = 0; i < 4; ++i) wword.w[i] = is_q ? wq.w[i] : wk.w[i];
#pragma unroll
        for (int i = 0; i < kElemsPerLane; ++i) {
          x[i] = to_float(word_element<Act>(raw[j], i));
          weight[i] = word_element<Act>(wword, i);
        }
        normalize_rotate_store<Act, CacheT, D, R, kNeox, kFullWidth, kRounded, kSumOrder, kRoundTwice, kAligned, kComplex>(
            p.eps, head_row<Act>(p, token, head, head_lane), x, c, s, head < p.num_heads, slot, head_lane, weight);
      }
    }
    token += p.unit_token_step;
    chunk += p.unit_chunk_step;
    if (chunk >= p.chunks_per_token) {
      chunk -= p.chunks_per_token;
      ++token;
    }
  }

  if constexpr (kPdl) pdl_launch_dependents();
}

}  // namespace ditops

#endif  // __CUDACC__ || __CUDACC_RTC__
