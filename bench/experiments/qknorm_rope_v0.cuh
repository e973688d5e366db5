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
// Work index = token * (Hq + Hk) + head; heads >= Hq are k heads. The grid is persistent and
// grid-strides over works; the (token, head) cursor advances without division.
#pragma once

#include "common/memory.cuh"
#include "common/types.cuh"
#include "qknorm_rope_params_v0.h"

namespace ditops {

namespace qk_detail {

using namespace ditops::kernel;

constexpr int kElemsPerLane = 8;
// One work per lane per loop iteration. Tried on the H200 (2026-11-29): two works per lane with
// all their loads issued first ran slower on every model shape (FLUX 42.3 -> 46.2 us, Wan 504 ->
// 664 us), so the simple loop stays.
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

  const int lane = threadIdx.x & 31;
  const int slot = lane / kLanesPerHead;       // which head of the warp
  const int head_lane = lane % kLanesPerHead;  // lane within the head
  const long long warp = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;

  const long long first_work = warp * kHeadsPerWarp + slot;
  long long token = first_work / p.num_heads;
  int head = static_cast<int>(first_work - token * p.num_heads);

  if constexpr (kPdl) pdl_wait();

  // The weight slice of this lane, both tensors (reused for every work of the loop).
  Act wq[kElemsPerLane], wk[kElemsPerLane];
  load_elements<Act, kElemsPerLane, kAligned, true>(
      static_cast<const Act*>(p.q_weight) + head_lane * kElemsPerLane, wq);
  load_elements<Act, kElemsPerLane, kAligned, true>(
      static_cast<const Act*>(p.k_weight) + head_lane * kElemsPerLane, wk);

  // Warp-uniform loop: shuffles need every lane, so a slot past the end computes on zeros and
  // skips its store.
  while (__any_sync(kFullMask, token < p.num_tokens)) {
    const bool active = token < p.num_tokens;
    const bool is_q = head < p.num_q_heads;
    Act* row = is_q ? static_cast<Act*>(p.q) + token * p.q_token_stride + head * p.head_stride
                    : static_cast<Act*>(p.k_shifted) + token * p.k_token_stride + head * p.head_stride;
    row += head_lane * kElemsPerLane;

    float x[kElemsPerLane];
    {
      Act raw[kElemsPerLane];
      if (active) {
        load_elements<Act, kElemsPerLane, kAligned, false>(row, raw);
      } else {
#pragma unroll
        for (int i = 0; i < kElemsPerLane; ++i) raw[i] = from_float<Act>(0.0f);
      }
#pragma unroll
      for (int i = 0; i < kElemsPerLane; ++i) x[i] = to_float(raw[i]);
    }

    const float total = head_sum_of_squares<D, kAtenOrder>(x);
    const float factor = rsqrtf(__fdiv_rn(total, static_cast<float>(D)) + p.eps);

    float n[kElemsPerLane];
#pragma unroll
    for (int i = 0; i < kElemsPerLane; ++i) {
      const float w = to_float(is_q ? wq[i] : wk[i]);
      n[i] = kRounded ? round_to<Act>(__fmul_rn(w, __fmul_rn(factor, x[i])))
                      : __fmul_rn(x[i], __fmul_rn(factor, w));
    }

    // RoPE on the rotary lanes. NeoX partners sit kHalfRotaryLanes lanes away; every lane takes
    // part in the shuffle (non-rotary lanes read themselves).
    float partner[kElemsPerLane];
    if constexpr (kNeox) {
      const int src_in_head = head_lane < kHalfRotaryLanes   ? head_lane + kHalfRotaryLanes
                              : head_lane < kRotaryLanes     ? head_lane - kHalfRotaryLanes
                                                             : head_lane;
      const int src = slot * kLanesPerHead + src_in_head;
#pragma unroll
      for (int i = 0; i < kElemsPerLane; ++i) partner[i] = __shfl_sync(kFullMask, n[i], src);
    }

    float y[kElemsPerLane];
#pragma unroll
    for (int i = 0; i < kElemsPerLane; ++i) y[i] = n[i];

    if (active && head_lane < kRotaryLanes) {
      const long long pos = static_cast<long long>(static_cast<const PosT*>(p.positions)[token * p.positions_stride]);
      const CacheT* cache_row = static_cast<const CacheT*>(p.cos_sin_cache) + pos * p.cache_row_stride;
      const int channel0 = head_lane * kElemsPerLane;
      if constexpr (!kNeox) {
        // Interleaved pairs (2j, 2j+1) inside the lane.
        if constexpr (kFullWidth) {
          float c[kElemsPerLane], s[kElemsPerLane];
          load_cache<CacheT, kElemsPerLane, kAligned>(cache_row, channel0, c);
          load_cache<CacheT, kElemsPerLane, kAligned>(cache_row, R + channel0, s);
#pragma unroll
          for (int i = 0; i < kElemsPerLane; i += 2) {
            y[i] = rotate_minus<CacheT, kRounded, Act>(n[i], c[i], n[i + 1], s[i]);
            y[i + 1] = rotate_plus<CacheT, kRounded, Act>(n[i + 1], c[i + 1], n[i], s[i + 1]);
          }
        } else {
          float c[kElemsPerLane / 2], s[kElemsPerLane / 2];
          load_cache<CacheT, kElemsPerLane / 2, kAligned>(cache_row, channel0 / 2, c);
          load_cache<CacheT, kElemsPerLane / 2, kAligned>(cache_row, R / 2 + channel0 / 2, s);
#pragma unroll
          for (int i = 0; i < kElemsPerLane; i += 2) {
            y[i] = rotate_minus<CacheT, kRounded, Act>(n[i], c[i / 2], n[i + 1], s[i / 2]);
            y[i + 1] = rotate_plus<CacheT, kRounded, Act>(n[i + 1], c[i / 2], n[i], s[i / 2]);
          }
        }
      } else {
        const bool low_half = head_lane < kHalfRotaryLanes;
        const int index0 = kFullWidth ? channel0 : channel0 - (low_half ? 0 : R / 2);
        float c[kElemsPerLane], s[kElemsPerLane];
        load_cache<CacheT, kElemsPerLane, kAligned>(cache_row, index0, c);
        load_cache<CacheT, kElemsPerLane, kAligned>(cache_row, (kFullWidth ? R : R / 2) + index0, s);
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

    token += p.token_step;
    head += p.head_step;
    if (head >= p.num_heads) {
      head -= p.num_heads;
      ++token;
    }
  }

  if constexpr (kPdl) pdl_launch_dependents();
}

}  // namespace ditops
