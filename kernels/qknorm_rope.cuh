// Fused in-place per-head QK RMSNorm + RoPE.
//
// Numerics contract (docs/qknorm_rope.md is the full statement):
// * Inputs are converted exactly to fp32; the sum of squares accumulates per virtual thread of G
//   elements with fp32 FMA from +0, then a fixed tree: kAtenOrder replicates aten's vectorized
//   RMSNorm (G = 4, shfl_down tree inside 32 virtual threads, then the inter-warp tree), else
//   SGLang's per-head order (G = D/32, XOR butterfly over 32). factor = rsqrtf(total/D + eps)
//   with an IEEE division and CUDA's rsqrtf, as aten computes it.
// * kRounded: n = rne16(w * (factor * x)) (aten's `gamma * (rstd * x)`), then RoPE with the
//   eager chain's op-by-op rounding: fp32 cache: rne16(fmul(a,c) -/+ fmul(b,s)) with no FMA;
//   16-bit cache: every product and the sum rounded to the dtype. Contract: bit_exact against
//   the eager PyTorch chain (aten order) or SGLang's split chain (warp order).
// * !kRounded: n = x * (factor * w) kept in fp32, y = fma(a, c, -/+ b*s), one rounding at the
//   store. Contract: close.
// * Channels >= R pass through as rne16(n).
//
// Layout: each lane owns 8 consecutive channels (16 bytes of fp16/bf16), so a head occupies
// D/8 lanes and a warp processes 32/(D/8) heads at once (4 at D=64, 2 at D=128, 1 at D=256).
// Work index = token * (Hq + Hk) + head; heads >= Hq are k heads. Each lane carries kQkNormRopeUnroll
// works per iteration with all their loads issued first. The grid is persistent and
// grid-strides over works; the (token, head) cursors advance without division.
#pragma once

#include "common/memory.cuh"
#include "common/types.cuh"
#include "qknorm_rope_params.h"

namespace ditops {

namespace qk_detail {

using namespace ditops::kernel;

constexpr int kElemsPerLane = 8;

constexpr unsigned kFullMask = 0xffffffffu;

// Sum of squares of one head in the configured order; every lane of the head returns the total.
template <int D, bool kAtenOrder>
__device__ __forceinline__ float head_sum_of_squares(const float (&x)[kElemsPerLane]) {
  constexpr int G = kAtenOrder ? 4 : D / 32;          // elements per virtual thread
  constexpr int kParts = kElemsPerLane / G;           // virtual threads per lane
  constexpr int kVirtualThreads = D / G;
  constexpr int kVirtualWarp = kVirtualThreads < 32 ? kVirtualThreads : 32;
  float part[kParts];
#pragma unroll
  for (int r = 0; r < kParts; ++r) {
    float p = 0.0f;
#pragma unroll
    for (int i = 0; i < G; ++i) p = __fmaf_rn(x[r * G + i], x[r * G + i], p);
    part[r] = p;
  }
  // Tree inside a virtual warp: offsets o = W/2 .. 1 in virtual-thread space. Offsets of at least
  // one lane's worth cross lanes (XOR shuffle: every lane ends with what lane 0 of the shfl_down
  // tree holds); smaller offsets combine partials inside the lane.
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

}  // namespace qk_detail

template <typename Act, typename CacheT, typename PosT, int D, int R, bool kNeox, bool kFullWidth,
          bool kRounded, bool kAtenOrder, bool kPdl, bool kAligned>
__device__ void qknorm_rope_body(const QkNormRopeParams& p) {
  using namespace qk_detail;
  static_assert(D == 64 || D == 128 || D == 256, "head_dim 64, 128 or 256");
  static_assert(R > 0 && R <= D, "0 < rope_dim <= head_dim");
  static_assert(R % kElemsPerLane == 0, "rotary channels cover whole lanes");
  static_assert(!kNeox || R % (2 * kElemsPerLane) == 0, "NeoX halves start on a lane boundary");
  constexpr int kLanesPerHead = D / kElemsPerLane;
  constexpr int kHeadsPerWarp = 32 / kLanesPerHead;
  constexpr int kRotaryLanes = R / kElemsPerLane;
  constexpr int kHalfRotaryLanes = kRotaryLanes / 2;
  // Cache values a rotary lane needs: 4 (interleaved compact: one per pair) or 8.
  constexpr int kCacheVals = (!kNeox && !kFullWidth) ? kElemsPerLane / 2 : kElemsPerLane;
  constexpr int kUnroll = kQkNormRopeUnroll;

  const int lane = threadIdx.x & 31;
  const int slot = lane / kLanesPerHead;       // which head of the warp
  const int head_lane = lane % kLanesPerHead;  // lane within the head
  const long long warp = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const bool rotary_lane = head_lane < kRotaryLanes;
  const bool low_half = head_lane < kHalfRotaryLanes;
  const int channel0 = head_lane * kElemsPerLane;
  // Offsets of this lane's cos and sin values inside a cache row.
  const int cos_offset = kNeox ? (kFullWidth ? channel0 : channel0 - (low_half ? 0 : R / 2))
                               : (kFullWidth ? channel0 : channel0 / 2);
  const int sin_offset = cos_offset + (kFullWidth ? R : R / 2);

  // Each lane carries kUnroll works at once (their loads all in flight before any math): work
  // (u, slot) of warp w starts at (w * kUnroll + u) * kHeadsPerWarp + slot.
  long long token[kUnroll];
  int head[kUnroll];
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const long long first_work = (warp * kUnroll + u) * kHeadsPerWarp + slot;
    token[u] = first_work / p.num_heads;
    head[u] = static_cast<int>(first_work - token[u] * p.num_heads);
  }

  if constexpr (kPdl) pdl_wait();

  // The weight slice of this lane, both tensors (reused for every work of the loop).
  Act wq[kElemsPerLane], wk[kElemsPerLane];
  load_elements<Act, kElemsPerLane, kAligned, true>(
      static_cast<const Act*>(p.q_weight) + channel0, wq);
  load_elements<Act, kElemsPerLane, kAligned, true>(
      static_cast<const Act*>(p.k_weight) + channel0, wk);

  // Warp-uniform loop: shuffles need every lane, so a slot past the end computes on zeros and
  // skips its store.
  while (__any_sync(kFullMask, token[0] < p.num_tokens)) {
    Act* row[kUnroll];
    bool active[kUnroll];
    Act raw[kUnroll][kElemsPerLane];
    float c[kUnroll][kCacheVals], s[kUnroll][kCacheVals];
    // Phase 1: issue every load.
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      active[u] = token[u] < p.num_tokens;
      const bool is_q = head[u] < p.num_q_heads;
      row[u] = (is_q ? static_cast<Act*>(p.q) + token[u] * p.q_token_stride
                     : static_cast<Act*>(p.k_shifted) + token[u] * p.k_token_stride) +
               head[u] * p.head_stride + channel0;
      if (active[u]) {
        load_elements<Act, kElemsPerLane, kAligned, false>(row[u], raw[u]);
      } else {
#pragma unroll
        for (int i = 0; i < kElemsPerLane; ++i) raw[u][i] = from_float<Act>(0.0f);
      }
      if (active[u] && rotary_lane) {
        const long long pos = static_cast<long long>(
            static_cast<const PosT*>(p.positions)[token[u] * p.positions_stride]);
        const CacheT* cache_row = static_cast<const CacheT*>(p.cos_sin_cache) + pos * p.cache_row_stride;
        load_cache<CacheT, kCacheVals, kAligned>(cache_row, cos_offset, c[u]);
        load_cache<CacheT, kCacheVals, kAligned>(cache_row, sin_offset, s[u]);
      }
    }
    // Phase 2: norm, RoPE, store.
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const bool is_q = head[u] < p.num_q_heads;
      float x[kElemsPerLane];
#pragma unroll
      for (int i = 0; i < kElemsPerLane; ++i) x[i] = to_float(raw[u][i]);

      const float total = head_sum_of_squares<D, kAtenOrder>(x);
      const float factor = rsqrtf(__fdiv_rn(total, static_cast<float>(D)) + p.eps);

      float n[kElemsPerLane];
#pragma unroll
      for (int i = 0; i < kElemsPerLane; ++i) {
        const float w = to_float(is_q ? wq[i] : wk[i]);
        n[i] = kRounded ? round_to<Act>(__fmul_rn(w, __fmul_rn(factor, x[i])))
                        : __fmul_rn(x[i], __fmul_rn(factor, w));
      }

      // NeoX partners sit kHalfRotaryLanes lanes away; every lane takes part in the shuffle
      // (non-rotary lanes read themselves).
      float partner[kElemsPerLane];
      if constexpr (kNeox) {
        const int src_in_head = low_half ? head_lane + kHalfRotaryLanes
                                : rotary_lane ? head_lane - kHalfRotaryLanes
                                              : head_lane;
        const int src = slot * kLanesPerHead + src_in_head;
#pragma unroll
        for (int i = 0; i < kElemsPerLane; ++i) partner[i] = __shfl_sync(kFullMask, n[i], src);
      }

      float y[kElemsPerLane];
#pragma unroll
      for (int i = 0; i < kElemsPerLane; ++i) y[i] = n[i];
      if (rotary_lane) {
        if constexpr (!kNeox) {
          // Interleaved pairs (2j, 2j+1) inside the lane.
#pragma unroll
          for (int i = 0; i < kElemsPerLane; i += 2) {
            const int ci0 = kFullWidth ? i : i / 2, ci1 = kFullWidth ? i + 1 : i / 2;
            y[i] = rotate_minus<CacheT, kRounded, Act>(n[i], c[u][ci0], n[i + 1], s[u][ci0]);
            y[i + 1] = rotate_plus<CacheT, kRounded, Act>(n[i + 1], c[u][ci1], n[i], s[u][ci1]);
          }
        } else {
#pragma unroll
          for (int i = 0; i < kElemsPerLane; ++i)
            y[i] = low_half ? rotate_minus<CacheT, kRounded, Act>(n[i], c[u][i], partner[i], s[u][i])
                            : rotate_plus<CacheT, kRounded, Act>(n[i], c[u][i], partner[i], s[u][i]);
        }
      }

      if (active[u]) {
        Act out[kElemsPerLane];
#pragma unroll
        for (int i = 0; i < kElemsPerLane; ++i) out[i] = from_float<Act>(y[i]);
        store_elements<Act, kElemsPerLane, kAligned>(row[u], out);
      }

      token[u] += p.token_step;
      head[u] += p.head_step;
      if (head[u] >= p.num_heads) {
        head[u] -= p.num_heads;
        ++token[u];
      }
    }
  }

  if constexpr (kPdl) pdl_launch_dependents();
}

}  // namespace ditops
