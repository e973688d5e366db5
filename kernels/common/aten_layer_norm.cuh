// The row statistics of aten's vectorized_layer_norm_kernel<BFloat16, float> (PyTorch 2.11, CUDA),
// replicated operation by operation so that mean and rstd come out bit-identical. Device only;
// NVRTC- and nvcc-compilable, no CUDA headers. The order: docs/layernorm_modulate.md, "Numerics".
//
// What aten does for one row of N elements (N % 4 == 0):
//   * 128 threads = 4 warps of 32. Thread t (= 32*w + l) pushes the 4-element vectors with vector
//     index t, t+128, t+256, ... (< N/4) into one Welford state, elements in order e0..e3.
//   * Each warp folds its 32 states with shfl_down offsets 16, 8, 4, 2, 1 (lane 0 ends valid).
//   * Warps combine through shared memory as (0,2), (1,3), then (0,1); the lower warp is "self".
//   * mean = fold mean; rstd = rsqrtf(div.rn(m2, N) + eps).
//
// Mapping onto one CTA (aten_row_stats_cta): thread t is virtual thread t, as aten launches it.
//
// Mapping onto ONE warp (aten_row_stats_warp below): lane l plays the 4 virtual threads
// l, l+32, l+64, l+96, one per virtual warp w. Virtual thread l + 32*w owns vectors
// l + 32*w + 128*k, so lane l owns exactly the vectors v = l + 32*j (j = 0, 1, ...), and vector
// v feeds state j % 4 (= its virtual warp). A warp instruction therefore reads 32 consecutive
// vectors: coalesced. The per-virtual-warp fold runs on all 4 states at once with real shuffles
// (virtual warp w's lane i is physical lane i, state w), which is exactly aten's tree, and lane 0
// then combines its 4 results in aten's inter-warp order.
//
// The qk-head case (N <= 128) is the same function: only virtual warp 0 carries data and the
// combines (0,2), (0,1) with empty states are replicated (they can change the mean's last bit:
// rcp4(c) * c != 1 for some counts c).
#pragma once

namespace ditops::kernel {

struct WelfordState {
  float mean;
  float m2;
  float count;
};

struct RowStats {
  float mean;
  float rstd;
};

// nvcc's fast path for an IEEE `1.f / x` (div.rn lowered by ptxas for a normal, non-huge x):
// MUFU.RCP, then one Newton step with the error negated by an FTZ subtraction from -0. The
// domain here is Welford counts (positive integers <= 2^24), always on that fast path.
__device__ __forceinline__ float rcp4(float x) {
  float r0;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r0) : "f"(x));
  const float e = __fmaf_rn(x, r0, -1.0f);
  float e2;
  asm("sub.ftz.f32 %0, %1, %2;" : "=f"(e2) : "f"(-0.0f), "f"(e));
  return __fmaf_rn(r0, e2, r0);
}

// aten cuWelfordOnlineSum: mean + delta * (1/count') contracted into an FMA, likewise m2.
__device__ __forceinline__ void welford_push(WelfordState& s, float value) {
  const float delta = __fsub_rn(value, s.mean);
  const float count = __fadd_rn(s.count, 1.0f);
  const float r = rcp4(count);
  const float mean = __fmaf_rn(delta, r, s.mean);
  s.m2 = __fmaf_rn(delta, __fsub_rn(value, mean), s.m2);
  s.mean = mean;
  s.count = count;
}

// welford_push for a count known when compiling: rcp_count = 1.0f / (s.count + 1) as a constant.
// aten's `1.f / new_count` is an IEEE division (div.rn; rcp4 above is ptxas's fast path of it), so
// the folded constant is the same value; tests check rcp4(n) == 1.0f / n on the device.
__device__ __forceinline__ void welford_push_known(WelfordState& s, float value, float rcp_count) {
  const float delta = __fsub_rn(value, s.mean);
  const float mean = __fmaf_rn(delta, rcp_count, s.mean);
  s.m2 = __fmaf_rn(delta, __fsub_rn(value, mean), s.m2);
  s.mean = mean;
  s.count = __fadd_rn(s.count, 1.0f);
}

// aten cuWelfordCombine(dataB = self, dataA = other), in nvcc's contraction of its expressions:
//   mean = nA*meanA + nB*meanB            -> fma(meanA, nA, nB*meanB)
//   m2   = (m2A + m2B) + ((d*d)*cA)*nB    -> fma(nB, cA*(d*d), m2A + m2B)
__device__ __forceinline__ WelfordState welford_combine(const WelfordState& self_b,
                                                        const WelfordState& other_a) {
  const float n = __fadd_rn(other_a.count, self_b.count);
  const float coef = rcp4(n > 0.0f ? n : 1.0f);
  const float delta = __fsub_rn(self_b.mean, other_a.mean);
  const float nb = __fmul_rn(coef, self_b.count);
  const float d2 = __fmul_rn(delta, delta);
  const float na = __fmul_rn(other_a.count, coef);
  const float s = __fadd_rn(other_a.m2, self_b.m2);
  WelfordState out;
  out.mean = __fmaf_rn(other_a.mean, na, __fmul_rn(nb, self_b.mean));
  out.m2 = __fmaf_rn(nb, __fmul_rn(other_a.count, d2), s);
  out.count = n;
  if (!(n > 0.0f)) {
    out.mean = 0.0f;
    out.m2 = 0.0f;
  }
  return out;
}

// welford_combine with both counts known when compiling (positive): the same operations, so the
// same bits, with the count terms (1/n, n_b/n, n_a/n) folded to constants. 1.0f / n folds to the
// IEEE quotient, which rcp4 equals on these counts (device test).
__device__ __forceinline__ WelfordState welford_combine_known(const WelfordState& self_b, const WelfordState& other_a,
                                                              float count_b, float count_a) {
  const float n = count_a + count_b;
  const float coef = 1.0f / n;
  const float nb = coef * count_b;
  const float na = count_a * coef;
  const float delta = __fsub_rn(self_b.mean, other_a.mean);
  const float d2 = __fmul_rn(delta, delta);
  WelfordState out;
  out.mean = __fmaf_rn(other_a.mean, na, __fmul_rn(nb, self_b.mean));
  out.m2 = __fmaf_rn(nb, __fmul_rn(count_a, d2), __fadd_rn(other_a.m2, self_b.m2));
  out.count = n;
  return out;
}

// One warp's shfl_down tree over 32 lanes (offsets 16..1); lane 0 holds the warp's state after.
// Lanes whose source is past lane 31 combine with their own value, as in aten (harmless: only
// lane 0 is used).
__device__ __forceinline__ WelfordState warp_fold_down(WelfordState s) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    WelfordState other;
    other.mean = __shfl_down_sync(0xffffffffu, s.mean, offset);
    other.m2 = __shfl_down_sync(0xffffffffu, s.m2, offset);
    other.count = __shfl_down_sync(0xffffffffu, s.count, offset);
    s = welford_combine(s, other);
  }
  return s;
}

// warp_fold_down when every lane's state holds `count` values (known when compiling): the count
// doubles per level, so only mean and m2 travel. Lanes whose partner is past lane 31 compute
// something aten does not (their counts differ there), which is never used: only lane 0 is read.
__device__ __forceinline__ WelfordState warp_fold_down_known(WelfordState s, float count) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    WelfordState other;
    other.mean = __shfl_down_sync(0xffffffffu, s.mean, offset);
    other.m2 = __shfl_down_sync(0xffffffffu, s.m2, offset);
    s = welford_combine_known(s, other, count, count);
    count = count + count;
  }
  return s;
}

// CUDA rsqrtf without ftz, which is what aten calls: the non-ftz PTX rsqrt.approx.f32, which
// ptxas lowers to MUFU.RSQ with the subnormal path (|x| < FLT_MIN: x * 2^24, result * 2^12).
// Using the same PTX instruction keeps the lowering identical to aten's by construction.
__device__ __forceinline__ float aten_rsqrtf(float x) {
  float r;
  asm("rsqrt.approx.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}

// The explicit form of the subnormal path (tests compare it with aten_rsqrtf on the device).
__device__ __forceinline__ float aten_rsqrtf_explicit(float x) {
  float r;
  if (fabsf(x) < 1.17549435e-38f) {
    asm("rsqrt.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(__fmul_rn(x, 16777216.0f)));
    return __fmul_rn(r, 4096.0f);
  }
  asm("rsqrt.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}

// aten's inter-warp combine of its 4 warp states (index = warp): (0,2), (1,3), then (0,1).
__device__ __forceinline__ WelfordState combine_four_warps(const WelfordState (&w)[4]) {
  const WelfordState w0 = welford_combine(w[0], w[2]);
  const WelfordState w1 = welford_combine(w[1], w[3]);
  return welford_combine(w0, w1);
}

// mean and rstd from the final state (aten divides m2 by float(N) with an IEEE division).
__device__ __forceinline__ RowStats finish_row_stats(const WelfordState& total, int n, float eps) {
  RowStats out;
  out.mean = total.mean;
  out.rstd = aten_rsqrtf(__fadd_rn(__fdiv_rn(total.m2, static_cast<float>(n)), eps));
  return out;
}

// Statistics of one row held by one warp (mapping at the top of this file). The row has n_vec
// 4-element vectors; lane `lane` owns vectors lane + 32*j for j < kSlots, i.e. the caller
// guarantees n_vec <= 32 * kSlots. get_vec(j, v) writes vector lane + 32*j as 4 floats; it is
// called only for vectors that exist. Every lane returns the same (mean, rstd).
template <int kSlots, typename GetVec>
__device__ __forceinline__ RowStats aten_row_stats_warp(const GetVec& get_vec, int n_vec, int lane,
                                                        float eps) {
  WelfordState state[4];
#pragma unroll
  for (int w = 0; w < 4; ++w) state[w] = WelfordState{0.0f, 0.0f, 0.0f};
#pragma unroll
  for (int j = 0; j < kSlots; ++j) {
    if (lane + 32 * j < n_vec) {
      float v[4];
      get_vec(j, v);
      WelfordState& s = state[j % 4];
      // Slots are valid as a prefix, so this state has seen exactly 4 * (j / 4) values before.
#pragma unroll
      for (int e = 0; e < 4; ++e)
        welford_push_known(s, v[e], 1.0f / static_cast<float>(4 * (j / 4) + e + 1));
    }
  }
#pragma unroll
  for (int w = 0; w < 4; ++w) state[w] = warp_fold_down(state[w]);
  // Lane 0 holds the 4 warp results; the combine is a few flops, so every lane runs it on lane
  // 0's values (broadcast first) instead of broadcasting the result after.
  WelfordState warp[4];
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    warp[w].mean = __shfl_sync(0xffffffffu, state[w].mean, 0);
    warp[w].m2 = __shfl_sync(0xffffffffu, state[w].m2, 0);
    warp[w].count = __shfl_sync(0xffffffffu, state[w].count, 0);
  }
  return finish_row_stats(combine_four_warps(warp), 4 * n_vec, eps);
}

// aten's inter-warp combine and finish when every one of the 128 threads pushed `thread_count`
// values (4 * 32 * thread_count = N): the warp states in shared[0..3].
__device__ __forceinline__ RowStats combine_four_warps_known(const WelfordState* shared, float thread_count, float eps) {
  const WelfordState w0 = welford_combine_known(shared[0], shared[2], 32 * thread_count, 32 * thread_count);
  const WelfordState w1 = welford_combine_known(shared[1], shared[3], 32 * thread_count, 32 * thread_count);
  return finish_row_stats(welford_combine_known(w0, w1, 64 * thread_count, 64 * thread_count),
                          static_cast<int>(128 * thread_count), eps);
}

// Statistics of one row computed by one 128-thread CTA exactly as aten launches it (blockDim.x
// must be 128; every thread calls this). Thread t owns vectors t + 128*k for k < kSlots (the
// caller guarantees n_vec <= 128 * kSlots); get_vec(k, v) writes vector t + 128*k. `shared`
// points to 4 WelfordStates of shared memory, not reused by the caller before a __syncthreads.
// kEven: n_vec == 128 * kSlots (every thread owns kSlots vectors), so every count is known when
// compiling and the folds run welford_combine_known (same bits, about half the instructions).
template <int kSlots, bool kEven, typename GetVec>
__device__ __forceinline__ RowStats aten_row_stats_cta(const GetVec& get_vec, int n_vec, float eps,
                                                       WelfordState* shared) {
  const int t = threadIdx.x;
  WelfordState s{0.0f, 0.0f, 0.0f};
#pragma unroll
  for (int k = 0; k < kSlots; ++k) {
    if (kEven || t + 128 * k < n_vec) {
      float v[4];
      get_vec(k, v);
#pragma unroll
      for (int e = 0; e < 4; ++e) welford_push_known(s, v[e], 1.0f / static_cast<float>(4 * k + e + 1));
    }
  }
  if constexpr (kEven) {
    constexpr float kThreadCount = 4.0f * kSlots;
    s = warp_fold_down_known(s, kThreadCount);
    if ((t & 31) == 0) shared[t >> 5] = s;
    __syncthreads();
    return combine_four_warps_known(shared, kThreadCount, eps);
  } else {
    s = warp_fold_down(s);
    if ((t & 31) == 0) shared[t >> 5] = s;
    __syncthreads();
    const WelfordState warp[4] = {shared[0], shared[1], shared[2], shared[3]};
    return finish_row_stats(combine_four_warps(warp), 4 * n_vec, eps);
  }
}

// A per-thread chain of aten's (Welford pushes, a sum of squares) computed by kSplit threads
// in turn: physical thread t + 128 h is part h of virtual thread t; part q runs push(q) on
// `state` after part q - 1 left it in handoff[t], so each virtual thread's values enter in
// aten's order (the same bits). Every thread calls this; kSplit - 1 barriers. push(q) is called
// with q a constant of the unrolled loop (the Welford counts fold to constants).
template <int kSplit, typename State, typename Push>
__device__ __forceinline__ void chain_over_parts(int t, int h, State& state, State* handoff, const Push& push) {
#pragma unroll
  for (int q = 0; q < kSplit; ++q) {
    if (h == q) {
      if (q > 0) state = handoff[t];
      push(q);
      if (q + 1 < kSplit) handoff[t] = state;
    }
    if (q + 1 < kSplit) __syncthreads();
  }
}

// aten_row_stats_cta<kPart * kSplit, true> computed by 128 * kSplit threads (chain_over_parts):
// part h holds the vectors t + 128 (kPart h + k), k < kPart (get_vec(k, v) writes the 4 values
// of this thread's k-th); the last part's warps fold as aten's 4 warps. kSplit barriers: a thread
// writes handoff and shared again only after the next call's first barrier, which every reader
// of this call has passed (no parity needed). Spreading a row over more threads halves each
// thread's registers for the row (nss_eager_schedule: residual rows at D = 3072).
template <int kPart, int kSplit, typename GetVec>
__device__ __forceinline__ RowStats aten_row_stats_cta_split(const GetVec& get_vec, int t, int h, float eps,
                                                             WelfordState* handoff, WelfordState* shared) {
  WelfordState s{0.0f, 0.0f, 0.0f};
  chain_over_parts<kSplit>(t, h, s, handoff, [&](int q) {
#pragma unroll
    for (int k = 0; k < kPart; ++k) {
      float v[4];
      get_vec(k, v);
#pragma unroll
      for (int e = 0; e < 4; ++e) welford_push_known(s, v[e], 1.0f / static_cast<float>(4 * (kPart * q + k) + e + 1));
    }
  });
  constexpr float kThreadCount = 4.0f * kPart * kSplit;
  if (h == kSplit - 1) {
    s = warp_fold_down_known(s, kThreadCount);
    if ((t & 31) == 0) shared[t >> 5] = s;
  }
  __syncthreads();
  return combine_four_warps_known(shared, kThreadCount, eps);
}

// Per-head statistics (the qk-head variant, N = 4 * n_vec <= 128): one vector per lane for lanes
// < n_vec. Identical to aten_row_stats_warp<1> (virtual warps 1..3 are empty), spelled out.
__device__ __forceinline__ RowStats aten_head_stats_warp(const float (&v)[4], int n_vec, int lane,
                                                         float eps) {
  WelfordState s{0.0f, 0.0f, 0.0f};
  if (lane < n_vec) {
#pragma unroll
    for (int e = 0; e < 4; ++e) welford_push(s, v[e]);
  }
  s = warp_fold_down(s);
  WelfordState w0;
  w0.mean = __shfl_sync(0xffffffffu, s.mean, 0);
  w0.m2 = __shfl_sync(0xffffffffu, s.m2, 0);
  w0.count = __shfl_sync(0xffffffffu, s.count, 0);
  const WelfordState empty{0.0f, 0.0f, 0.0f};
  w0 = welford_combine(w0, empty);  // warp 0 with (empty) warp 2
  w0 = welford_combine(w0, empty);  // then with warp 1, itself combined with empty warp 3
  return finish_row_stats(w0, 4 * n_vec, eps);
}

}  // namespace ditops::kernel
