// LayerNorm (no affine) + adaLN modulate, its fp8 e4m3 output variant, and per-head QK LayerNorm.
//
// Numerics contract (docs/layernorm_modulate.md is the full statement):
// * Row statistics exactly as aten's vectorized_layer_norm_kernel<BFloat16, float> (torch 2.11)
//   computes them: common/aten_layer_norm.cuh (128 virtual threads, vec4 Welford pushes, shfl_down
//   fold per virtual warp, inter-warp (0,2),(1,3),(0,1), rstd = rsqrt.approx(div.rn(m2, N) + eps)).
// * Per element, the eager chain's roundings: y = bf16(rstd * (x - mean)) (no FMA);
//   op = bf16(1 + scale); p = bf16(y * op); out = bf16(p + shift) or p without shift (so -0
//   survives). Contract: bit_exact against F.layer_norm(x, (D,), eps=eps) * (1 + scale[:, None])
//   (+ shift[:, None]) in bf16, eager PyTorch 2.11 on CUDA.
// * fp8: q = e4m3_rn_satfinite(float(out) * inv) with inv = 1 / input_scale by div.rn (kDivFull
//   false: eager `1.0 / input_scale`) or div.full.f32 (kDivFull: SGLang's Triton quantizer).
//   satfinite == the eager clamp(-448, 448) before an RNE conversion: every finite value at or
//   beyond ±448 ends at ±448 either way, NaN stays NaN (its sign is not specified).
// * fp8_rowwise (kRowwise): the row's bf16 out values stay in registers, their amax is reduced over
//   the row's threads and each becomes e4m3(out / s) with s the row's scale, by the rowwise recipe of
//   common/fp8_rowwise.cuh (torchao's float8 dynamic rowwise, eager's operations): bit_exact against
//   fp8_rowwise_eager(the eager chain's bf16 result).
// * qk-head: y = bf16(rstd * (x - mean)) per head of Dh <= 128 channels, stats of
//   aten_head_stats_warp (virtual warp 0 only, then the two combines with empty warps).
//
// Mappings of aten's 128 virtual threads (identical bits, chosen by the host per shape):
// * kCta == false: one warp per row, 4 rows per 128-thread CTA, the row kept in registers
//   (kSlots 8-byte vectors per lane, n_vec <= 32 * kSlots). One read of
//   x, no shared memory, no barrier.
// * kCta == true (the default): one 128-thread CTA per row at a time exactly as aten launches it
//   (n_vec <= 128 * kSlots), the inter-warp combine through shared memory, persistent over rows
//   with the next row prefetched (layernorm_modulate_body below).
#pragma once

#include "common/row_position.h"

// Launch parameters of the LayerNorm + modulate kernels. Plain data shared by the host op and
// the device code (passed by value as a __grid_constant__ kernel argument).
namespace ditops {

struct LayerNormModulateParams {
  const void* x;               // bf16 [B, S, D]
  void* out;                   // bf16 or fp8 e4m3 [B, S, D]
  const void* scale;           // bf16 [B, D], row stride scale_row_stride
  const void* shift;           // bf16 [B, D] or nullptr (then the kernel is built without it)
  const float* input_scale;    // fp8: one fp32 value
  float* stats;                // [rows, 2] (mean, rstd) or nullptr
  long long rows;              // B * S
  long long seq;               // S
  long long x_batch_stride;    // elements
  long long x_token_stride;
  long long out_batch_stride;
  long long out_token_stride;
  long long scale_row_stride;
  long long shift_row_stride;
  int n_vec;                   // D / 4
  float eps;
  float* out_scale;            // fp8_rowwise: [rows] fp32 (the [B, S, 1] scales), else nullptr
};

// Per-head LayerNorm of q and k: rows are (token, head), q's rows first, then k's.
struct QkHeadLayerNormParams {
  const void* q;
  void* q_out;
  const void* k;
  void* k_out;
  long long q_rows;            // tokens * Hq
  long long total_rows;        // q_rows + tokens * Hk
  long long q_token_stride, q_head_stride, q_out_token_stride, q_out_head_stride;
  long long k_token_stride, k_head_stride, k_out_token_stride, k_out_head_stride;
  int q_heads;
  int k_heads;
  int n_vec;                   // Dh / 4
  float eps;
};

// The GPU test's check of the shared primitives (rcp4, aten_rsqrtf).
struct AtenLnSelfcheckParams {
  float* rcp;              // [count]: rcp4(n) for n = 1..count
  const float* rsqrt_in;   // [rsqrt_count]
  float* rsqrt_out;        // [2 * rsqrt_count]: aten_rsqrtf, aten_rsqrtf_explicit
  int count;
  int rsqrt_count;
};

}  // namespace ditops

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

#include "common/aten_layer_norm.cuh"
#include "common/fp8_rowwise.cuh"
#include "common/memory.cuh"
#include "common/types.cuh"

namespace ditops {

namespace lnm_detail {

using namespace ditops::kernel;

constexpr int kThreads = 128;

// 4 bf16 as two 32-bit words (element 2i in the low half of word i), the register form of a row.
struct Vec4 {
  u32 w[2];
};

template <bool kAligned, bool kReadOnly>
__device__ __forceinline__ Vec4 load_vec4(const bf16* p) {
  Vec4 v;
  if constexpr (kAligned) {
    const Word<8> word = load_word<8, kReadOnly>(p);
    v.w[0] = word.w[0];
    v.w[1] = word.w[1];
  } else {
    const unsigned short* h = reinterpret_cast<const unsigned short*>(p);
    v.w[0] = static_cast<u32>(h[0]) | (static_cast<u32>(h[1]) << 16);
    v.w[1] = static_cast<u32>(h[2]) | (static_cast<u32>(h[3]) << 16);
  }
  return v;
}

__device__ __forceinline__ float element(const Vec4& v, int e) {
  const u32 w = v.w[e >> 1];
  return __uint_as_float((e & 1) ? (w & 0xFFFF0000u) : (w << 16));  // exact bf16 -> fp32
}

__device__ __forceinline__ void to_floats(const Vec4& v, float (&f)[4]) {
#pragma unroll
  for (int e = 0; e < 4; ++e) f[e] = element(v, e);
}



// Stores 4 output values given as bf16 (packed); fp8: q = e4m3(float(bf16) * inv).
template <bool kFp8, bool kAligned>
__device__ __forceinline__ void store_out(void* out_row, int vec, const Vec4& v, float inv) {
  if constexpr (kFp8) {
    const u32 word = e4m3x2_rn_satfinite(__fmul_rn(element(v, 0), inv), __fmul_rn(element(v, 1), inv)) |
                     (e4m3x2_rn_satfinite(__fmul_rn(element(v, 2), inv), __fmul_rn(element(v, 3), inv)) << 16);
    unsigned char* p = static_cast<unsigned char*>(out_row) + 4 * static_cast<long long>(vec);
    if constexpr (kAligned) {
      Word<4> w;
      w.w[0] = word;
      store_word<4>(p, w);
    } else {
#pragma unroll
      for (int e = 0; e < 4; ++e) p[e] = static_cast<unsigned char>(word >> (8 * e));
    }
  } else {
    unsigned short* p = static_cast<unsigned short*>(out_row) + 4 * static_cast<long long>(vec);
    if constexpr (kAligned) {
      Word<8> w;
      w.w[0] = v.w[0];
      w.w[1] = v.w[1];
      store_word<8>(p, w);
    } else {
      p[0] = static_cast<unsigned short>(v.w[0]);
      p[1] = static_cast<unsigned short>(v.w[0] >> 16);
      p[2] = static_cast<unsigned short>(v.w[1]);
      p[3] = static_cast<unsigned short>(v.w[1] >> 16);
    }
  }
}

// Where a row lives: its batch and token (common/row_position.h), and the start of its x and output
// rows.
struct RowPlace {
  RowPosition pos;
  const bf16* x;
  void* out;
};

template <bool kFp8>
__device__ __forceinline__ RowPlace place(const LayerNormModulateParams& p, RowPosition at) {
  RowPlace r;
  r.pos = at;
  r.x = static_cast<const bf16*>(p.x) + at.b * p.x_batch_stride + at.s * p.x_token_stride;
  const long long o = at.b * p.out_batch_stride + at.s * p.out_token_stride;
  r.out = kFp8 ? static_cast<void*>(static_cast<unsigned char*>(p.out) + o)
               : static_cast<void*>(static_cast<unsigned short*>(p.out) + o);
  return r;
}

// The row's x as this thread's vectors t + kStride*j (j < kSlots, those < n_vec).
template <int kSlots, int kStride, bool kEven, bool kAligned>
__device__ __forceinline__ void load_row(const bf16* x, int n_vec, int t, Vec4 (&xv)[kSlots]) {
  const bf16* mine = x + 4 * t;  // slot j at a constant offset from it: one address a row, not one a slot
#pragma unroll
  for (int j = 0; j < kSlots; ++j)
    if (kEven || t + kStride * j < n_vec) xv[j] = load_vec4<kAligned, false>(mine + 4 * kStride * j);
}

// One row in registers -> modulated output. `op` holds bf16(1 + scale) and `sh` the shift of the
// row's batch, as this thread's vectors. y = bf16(rstd * (x - mean)) in fp32 (two roundings, as
// eager), then bf16(y * op) and bf16(p + shift) as packed bf16x2 operations: for bf16 operands
// these single roundings equal eager's fp32 operation + bf16 rounding (the product of two bf16
// values is exact in fp32: 16 significant bits, and its least significant bit is >= 2^-141
// because y has lsb >= 2^-133 and op = bf16(1 + scale) is 0 or has its lsb >= 2^-8; a sum is exact in fp32 or its
// operands are >= 2^16 apart, and then fp32's 24 >= 2*8 + 2 bits make the double rounding
// innocuous).
template <int kSlots, int kStride, bool kEven, bool kShift, bool kFp8, bool kAligned>
__device__ __forceinline__ void finish_row(void* out_row, int n_vec, int t, const Vec4 (&xv)[kSlots],
                                           const Vec4 (&op)[kSlots], const Vec4 (&sh)[kSlots], RowStats st,
                                           float inv) {
#pragma unroll
  for (int j = 0; j < kSlots; ++j) {
    const int vec = t + kStride * j;
    if (kEven || vec < n_vec) {
      Vec4 o;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const u32 y = bf16x2_from_floats(__fmul_rn(st.rstd, __fsub_rn(element(xv[j], 2 * h), st.mean)),
                                         __fmul_rn(st.rstd, __fsub_rn(element(xv[j], 2 * h + 1), st.mean)));
        o.w[h] = mul_rn_bf16x2(y, op[j].w[h]);
        if constexpr (kShift) o.w[h] = add_rn_bf16x2(o.w[h], sh[j].w[h]);
      }
      store_out<kFp8, kAligned>(out_row, vec, o, inv);
    }
  }
}

// The rowwise e4m3 bytes of a row's held out values: e4m3(out / s), 4 bytes a vector.
template <int kSlots, int kStride, bool kEven, bool kAligned, bool kExact>
__device__ __forceinline__ void store_rowwise(void* out_row, int n_vec, int t, const Vec4 (&o)[kSlots], float s,
                                              float r) {
  unsigned char* mine = static_cast<unsigned char*>(out_row) + 4 * t;
#pragma unroll
  for (int j = 0; j < kSlots; ++j) {
    const int vec = t + kStride * j;
    if (kEven || vec < n_vec) {
      const u32 word = e4m3x2_of_word<bf16, kExact>(o[j].w[0], s, r) | (e4m3x2_of_word<bf16, kExact>(o[j].w[1], s, r) << 16);
      unsigned char* q = mine + 4 * kStride * j;
      if constexpr (kAligned) {
        Word<4> w;
        w.w[0] = word;
        store_word<4>(q, w);
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) q[e] = static_cast<unsigned char>(word >> (8 * e));
      }
    }
  }
}

// finish_row for the rowwise e4m3 output: the row's out values (bf16, as finish_row computes them)
// held, their amax over the row's threads (the CTA, or the warp of the warp mapping; `partials` is
// the CTA's buffer of this row's parity), the scale, then e4m3(out / s) per value.
template <int kSlots, int kStride, bool kEven, bool kShift, bool kAligned, bool kCta>
__device__ __forceinline__ void finish_row_rowwise(void* out_row, float* scale_out, int n_vec, int t,
                                                   const Vec4 (&xv)[kSlots], const Vec4 (&op)[kSlots],
                                                   const Vec4 (&sh)[kSlots], RowStats st, u32* partials) {
  Vec4 o[kSlots];
  u32 pairs = 0;
#pragma unroll
  for (int j = 0; j < kSlots; ++j) {
    if (kEven || t + kStride * j < n_vec) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const u32 y = bf16x2_from_floats(__fmul_rn(st.rstd, __fsub_rn(element(xv[j], 2 * h), st.mean)),
                                         __fmul_rn(st.rstd, __fsub_rn(element(xv[j], 2 * h + 1), st.mean)));
        o[j].w[h] = mul_rn_bf16x2(y, op[j].w[h]);
        if constexpr (kShift) o[j].w[h] = add_rn_bf16x2(o[j].w[h], sh[j].w[h]);
        pairs = abs_max_pairs(pairs, o[j].w[h]);
      }
    }
  }
  const u32 amax = kCta ? block_max_u32(fold_pairs(pairs), partials) : warp_max_u32(fold_pairs(pairs));
  const float s = fp8_rowwise_scale<bf16>(amax), r = __frcp_rn(s);
  if (t == 0) *scale_out = s;
  if (fp8_rowwise_fast(s))  // uniform over the row's threads
    store_rowwise<kSlots, kStride, kEven, kAligned, false>(out_row, n_vec, t, o, s, r);
  else
    store_rowwise<kSlots, kStride, kEven, kAligned, true>(out_row, n_vec, t, o, s, r);
}

// bf16(1 + scale) and the shift of batch b as this thread's vectors (read-only path).
template <int kSlots, int kStride, bool kEven, bool kShift, bool kAligned>
__device__ __forceinline__ void load_modulation(const LayerNormModulateParams& p, long long b, int t,
                                                Vec4 (&op)[kSlots], Vec4 (&sh)[kSlots]) {
  const bf16* scale = static_cast<const bf16*>(p.scale) + b * p.scale_row_stride;
  const bf16* shift = static_cast<const bf16*>(p.shift) + (kShift ? b * p.shift_row_stride : 0);
#pragma unroll
  for (int j = 0; j < kSlots; ++j) {
    const int vec = t + kStride * j;
    if (kEven || vec < p.n_vec) {
      const Vec4 sc = load_vec4<kAligned, true>(scale + 4 * vec);
      op[j].w[0] = bf16x2_from_floats(__fadd_rn(1.0f, element(sc, 0)), __fadd_rn(1.0f, element(sc, 1)));
      op[j].w[1] = bf16x2_from_floats(__fadd_rn(1.0f, element(sc, 2)), __fadd_rn(1.0f, element(sc, 3)));
      if constexpr (kShift) sh[j] = load_vec4<kAligned, true>(shift + 4 * vec);
    }
  }
}

}  // namespace lnm_detail

// kCta false: one row per warp, 4 rows per CTA, grid = ceil(rows / 4).
// kCta true: a CTA per row at a time, looping over rows blockIdx.x, + gridDim.x, ... (the host
// sizes the grid to the resident CTAs, every CTA the same number of rows). bf16(1 + scale) and
// shift stay in registers while the batch does not change (rows of one batch share them);
// kPrefetch loads the next row's x before the current row's statistics. kStages > 0 (kCta,
// kAligned; instead of kPrefetch): x arrives through a ring of kStages rows in shared memory by
// cp.async, kStages - 1 rows ahead while a row is computed, without the registers of a prefetched
// row (an experiment of bench/experiments/adaln_tune.cu: rows in flight per SM against registers;
// H100: 5-11 % slower at 3072 wide, 5 % faster at 5120, docs/tuning/layernorm_modulate.md).
// kEven: every thread owns kSlots vectors (n_vec == kSlots * threads per row), so counts fold to
// constants. Measured on the H200: see the host's launch (layernorm_modulate_op.cpp).
template <int kSlots, bool kCta, bool kShift, bool kFp8, bool kDivFull, bool kPdl, bool kAligned,
          bool kEven = false, bool kPrefetch = false, bool kRowwise = false, int kStages = 0>
__device__ void layernorm_modulate_body(const LayerNormModulateParams& p) {
  static_assert(!kRowwise || kFp8, "the rowwise output is e4m3 (kFp8 addresses its rows)");
  static_assert(kStages == 0 || (kCta && kAligned && !kPrefetch && kStages >= 2),
                "the staged ring: a CTA per row, 8-byte aligned rows, instead of the register prefetch");
  using namespace lnm_detail;
  constexpr int kStride = kCta ? kThreads : 32;  // vectors between a thread's slots
  constexpr bool kPipelined = kCta && kPrefetch;  // a warp-mapped grid covers every row once
  constexpr bool kStaged = kStages > 0;
  const int lane = threadIdx.x & 31;
  const int t = kCta ? static_cast<int>(threadIdx.x) : lane;  // this thread's first vector
  const long long first = kCta ? static_cast<long long>(blockIdx.x)
                               : static_cast<long long>(blockIdx.x) * (kThreads / 32) + threadIdx.x / 32;
  const long long step = kCta ? static_cast<long long>(gridDim.x) : p.rows;
  const int n_vec = p.n_vec;
  __shared__ WelfordState shared[2][4];  // kCta: per row parity, so one barrier per row suffices
  __shared__ u32 amax_partials[kRowwise && kCta ? 2 : 1][32];  // kRowwise: the same, for the amax

  if constexpr (kPdl) pdl_wait();
  float inv = 1.0f;
  if constexpr (kFp8 && !kRowwise) inv = fp8_inverse<kDivFull>(p.input_scale);
  Vec4 xv[kSlots], next[kPipelined ? kSlots : 1], op[kSlots], sh[kSlots];
  // kStaged: this thread's vectors of ring row `stage` at ring[stage][j][t] (its own words only:
  // a thread reads back what its own cp.async wrote, so no barrier guards the ring).
  __shared__ Vec4 ring[kStaged ? kStages : 1][kStaged ? kSlots : 1][kStaged ? kThreads : 1];
  // One commit group per ring row, empty past the last row, so that "all but the kStages - 1
  // newest groups complete" always means this row's.
  const auto stage_row = [&](long long r, int stage) {
    if (r < p.rows) {
      const bf16* x = place<kFp8>(p, row_position(r, p.seq)).x;
#pragma unroll
      for (int j = 0; j < kSlots; ++j)
        if (kEven || t + kStride * j < n_vec)
          copy_async<8>(shared_address(&ring[stage][j][t]), x + 4 * (t + kStride * j));
    }
    copy_async_commit();
  };
  long long modulation_batch = -1;
  const RowPosition stride = row_position(step, p.seq);
  RowPlace at = place<kFp8>(p, row_position(first, p.seq));
  if constexpr (kStaged) {
#pragma unroll
    for (int s = 0; s < kStages; ++s) stage_row(first + s * step, s);
  } else {
    if (first < p.rows) load_row<kSlots, kStride, kEven, kAligned>(at.x, n_vec, t, xv);
  }
  int parity = 0, stage = 0;
  for (long long row = first; row < p.rows; row += step) {  // uniform per warp (and per CTA when kCta)
    const long long following = row + step;
    RowPlace next_at;
    if constexpr (kPipelined) {
      next_at = place<kFp8>(p, advance_row_position(at.pos, stride, p.seq));
      if (following < p.rows) load_row<kSlots, kStride, kEven, kAligned>(next_at.x, n_vec, t, next);
    }
    if constexpr (kStaged) {
      copy_async_wait<kStages - 1>();
#pragma unroll
      for (int j = 0; j < kSlots; ++j)
        if (kEven || t + kStride * j < n_vec) xv[j] = ring[stage][j][t];
    }
    if (at.pos.b != modulation_batch) {
      load_modulation<kSlots, kStride, kEven, kShift, kAligned>(p, at.pos.b, t, op, sh);
      modulation_batch = at.pos.b;
    }
    auto get_vec = [&](int j, float (&v)[4]) { to_floats(xv[j], v); };
    RowStats st;
    const int row_parity = parity;
    if constexpr (kCta) {
      st = aten_row_stats_cta<kSlots, kEven>(get_vec, n_vec, p.eps, shared[parity]);
      parity ^= 1;
    } else {
      st = aten_row_stats_warp<kSlots>(get_vec, n_vec, lane, p.eps);
    }
    if constexpr (kStaged) {  // the statistics consumed xv: the ring row is free for a later one
      stage_row(row + kStages * step, stage);
      stage = stage + 1 == kStages ? 0 : stage + 1;
    }
    if (p.stats && t == 0) {
      p.stats[2 * row] = st.mean;
      p.stats[2 * row + 1] = st.rstd;
    }
    if constexpr (kRowwise)
      finish_row_rowwise<kSlots, kStride, kEven, kShift, kAligned, kCta>(at.out, p.out_scale + row, n_vec, t, xv, op, sh,
                                                                        st, amax_partials[kCta ? row_parity : 0]);
    else
      finish_row<kSlots, kStride, kEven, kShift, kFp8, kAligned>(at.out, n_vec, t, xv, op, sh, st, inv);
    if (following < p.rows) {
      if constexpr (kStaged) {
        at = place<kFp8>(p, advance_row_position(at.pos, stride, p.seq));
      } else if constexpr (kPipelined) {
        at = next_at;
#pragma unroll
        for (int j = 0; j < kSlots; ++j) xv[j] = next[j];
      } else {
        at = place<kFp8>(p, advance_row_position(at.pos, stride, p.seq));
        load_row<kSlots, kStride, kEven, kAligned>(at.x, n_vec, t, xv);
      }
    }
  }
  if constexpr (kPdl) pdl_launch_dependents();
}

namespace lnm_detail {

// The rows of one side (q or k) this warp handles: rows_per_warp consecutive (token, head) rows
// from `first`. Rows are grouped per side so one warp never mixes q and k: side q has
// ceil(q_rows / rows_per_warp) groups, side k the rest.
struct QkWarpRows {
  long long first, side_rows;
  int heads;
  const bf16* in;
  unsigned short* out;
  long long in_ts, in_hs, out_ts, out_hs;
};

__device__ __forceinline__ QkWarpRows qk_warp_rows(const QkHeadLayerNormParams& p, int rows_per_warp) {
  const long long warp = static_cast<long long>(blockIdx.x) * (kThreads / 32) + threadIdx.x / 32;
  const long long q_groups = (p.q_rows + rows_per_warp - 1) / rows_per_warp;
  const bool is_q = warp < q_groups;
  QkWarpRows w;
  w.first = is_q ? warp * rows_per_warp : (warp - q_groups) * rows_per_warp;
  w.side_rows = is_q ? p.q_rows : p.total_rows - p.q_rows;
  w.heads = is_q ? p.q_heads : p.k_heads;
  w.in = static_cast<const bf16*>(is_q ? p.q : p.k);
  w.out = static_cast<unsigned short*>(is_q ? p.q_out : p.k_out);
  w.in_ts = is_q ? p.q_token_stride : p.k_token_stride;
  w.in_hs = is_q ? p.q_head_stride : p.k_head_stride;
  w.out_ts = is_q ? p.q_out_token_stride : p.k_out_token_stride;
  w.out_hs = is_q ? p.q_out_head_stride : p.k_out_head_stride;
  return w;
}

}  // namespace lnm_detail

namespace lnm_detail {

// The end of the d128 tree for the 4 states a lane holds after virtual offset 4 (count values
// each): virtual offsets 2 and 1 combine the lane's own states, then aten's inter-warp combines
// with its empty warps 2 and 1 (n_vec = 32: one warp carries data), then mean and rstd.
__device__ __forceinline__ RowStats finish_head_stats(WelfordState (&vt)[4], float count, float eps) {
  vt[0] = welford_combine_known(vt[0], vt[2], count, count);  // virtual offset 2 (vt 0 and 1)
  vt[1] = welford_combine_known(vt[1], vt[3], count, count);
  count = count + count;
  WelfordState w0 = welford_combine_known(vt[0], vt[1], count, count);  // virtual offset 1
  count = count + count;  // 128
  const WelfordState empty{0.0f, 0.0f, 0.0f};
  w0 = welford_combine_known(w0, empty, count, 0.0f);
  w0 = welford_combine_known(w0, empty, count, 0.0f);
  return finish_row_stats(w0, 128, eps);
}

}  // namespace lnm_detail

// Per-head LayerNorm of q and k: one warp per head row, kRowsPerWarp consecutive rows of one side
// per warp (their loads are issued together). Lanes >= n_vec are aten's idle threads.
template <int kRowsPerWarp, bool kPdl, bool kAligned>
__device__ void qk_head_layernorm_body(const QkHeadLayerNormParams& p) {
  using namespace lnm_detail;
  const int lane = threadIdx.x & 31;
  const QkWarpRows w = qk_warp_rows(p, kRowsPerWarp);

  if constexpr (kPdl) pdl_wait();
  if (w.first < w.side_rows) {
    long long token = w.first / w.heads;
    int head = static_cast<int>(w.first - token * w.heads);
    long long in_off[kRowsPerWarp], out_off[kRowsPerWarp];
    bool valid[kRowsPerWarp];
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) {
      valid[i] = w.first + i < w.side_rows;
      in_off[i] = token * w.in_ts + head * w.in_hs;
      out_off[i] = token * w.out_ts + head * w.out_hs;
      if (++head == w.heads) {
        head = 0;
        ++token;
      }
    }
    const bool has_data = lane < p.n_vec;
    Vec4 xv[kRowsPerWarp];
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i)
      if (valid[i] && has_data) xv[i] = load_vec4<kAligned, false>(w.in + in_off[i] + 4 * lane);
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) {
      float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      if (valid[i] && has_data) to_floats(xv[i], v);
      // Every lane takes part in the shuffles, also for an invalid row (its result is unused).
      const RowStats st = aten_head_stats_warp(v, p.n_vec, lane, p.eps);
      if (valid[i] && has_data) {
        Vec4 y;
        y.w[0] = bf16x2_from_floats(__fmul_rn(st.rstd, __fsub_rn(v[0], st.mean)), __fmul_rn(st.rstd, __fsub_rn(v[1], st.mean)));
        y.w[1] = bf16x2_from_floats(__fmul_rn(st.rstd, __fsub_rn(v[2], st.mean)), __fmul_rn(st.rstd, __fsub_rn(v[3], st.mean)));
        store_out<false, kAligned>(w.out + out_off[i], lane, y, 1.0f);
      }
    }
  }
  if constexpr (kPdl) pdl_launch_dependents();
}

// Per-head LayerNorm for head_dim 128 (n_vec 32) with 16-byte aligned rows: 8 lanes per head,
// 4 heads per warp at a time, kIterations rounds (4 * kIterations consecutive rows of one side per
// warp). Lane q of a group plays aten's virtual threads 4q..4q+3 (elements 16q..16q+15: two
// 16-byte accesses). aten's shfl_down tree over 32 virtual threads keeps its order: offsets 16, 8
// and 4 are shuffles by 4, 2 and 1 lanes of the 4 states each lane holds, offsets 2 and 1 combine
// a lane's own states; only group lane 0's result is used, as only aten's lane 0 is. Every count
// is known (4 values per virtual thread), so the folds are welford_combine_known. Two rounds at a
// time share the tree's instructions (lanes 4-7 fold the second row where they had idled): sm_90a
// SASS for 2 rounds, 890 -> 750 instructions to the last store, 56 -> 64 registers, and faster
// (docs/tuning/layernorm_modulate.md).
template <int kIterations, bool kPdl>
__device__ void qk_head_layernorm_d128_body(const QkHeadLayerNormParams& p) {
  using namespace lnm_detail;
  const int lane = threadIdx.x & 31;
  const int group = lane >> 3, q = lane & 7;
  const QkWarpRows w = qk_warp_rows(p, 4 * kIterations);

  if constexpr (kPdl) pdl_wait();
  if (w.first < w.side_rows) {  // uniform per warp
    Word<16> xw[kIterations][2];
    long long out_off[kIterations];
    bool valid[kIterations];
    // (token, head) of row first + g: one division for the warp's first row, then g added with at
    // most one wrap when a token has >= 4 * kIterations heads (fewer: a division per row). A
    // 64-bit division per row had stood in front of each row's loads (docs/tuning/layernorm_modulate.md).
    const long long first_token = w.first / w.heads;
    const int first_head = static_cast<int>(w.first - first_token * w.heads);
#pragma unroll
    for (int i = 0; i < kIterations; ++i) {
      const int g = 4 * i + group;
      const long long row = w.first + g;
      valid[i] = row < w.side_rows;
      long long token = first_token;
      long long head = first_head + g;
      if (w.heads < 4 * kIterations) {
        token = row / w.heads;
        head = row - token * w.heads;
      } else if (head >= w.heads) {
        head -= w.heads;
        ++token;
      }
      out_off[i] = token * w.out_ts + head * w.out_hs + 16 * q;
      if (valid[i]) {
        const bf16* src = w.in + token * w.in_ts + head * w.in_hs + 16 * q;
        xw[i][0] = load_word<16, false>(src);
        xw[i][1] = load_word<16, false>(src + 8);
      }
    }
    // Row i's 16 values of this lane (0 for an invalid row: its statistics are computed and unused).
    const auto unpack = [&](int i, float (&v)[16]) {
#pragma unroll
      for (int e = 0; e < 16; ++e) {
        const u32 word = valid[i] ? xw[i][e / 8].w[(e % 8) / 2] : 0u;
        v[e] = (e & 1) ? __uint_as_float(word & 0xFFFF0000u) : __uint_as_float(word << 16);
      }
    };
    // The 4 virtual threads' states (vector r = elements 4r..4r+3 of this lane's 16).
    const auto push = [&](const float (&v)[16], WelfordState (&vt)[4]) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        vt[r] = WelfordState{0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int e = 0; e < 4; ++e) welford_push_known(vt[r], v[4 * r + e], 1.0f / static_cast<float>(e + 1));
      }
    };
    const auto store = [&](int i, const float (&v)[16], const RowStats& st) {
      if (valid[i]) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          Word<16> o;
#pragma unroll
          for (int k = 0; k < 4; ++k)
            o.w[k] = bf16x2_from_floats(__fmul_rn(st.rstd, __fsub_rn(v[8 * h + 2 * k], st.mean)),
                                        __fmul_rn(st.rstd, __fsub_rn(v[8 * h + 2 * k + 1], st.mean)));
          store_word<16>(w.out + out_off[i] + 8 * h, o);
        }
      }
    };
    // Virtual offsets 4 * lanes .. 4 (shuffles down by lanes .. 1 lanes; each state holds `count`
    // values), then the lane's own levels, aten's empty warps and the row's mean and rstd.
    const auto fold_and_finish = [&](WelfordState (&vt)[4], float count, int lanes) {
#pragma unroll
      for (; lanes >= 1; lanes >>= 1) {
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          WelfordState other;
          other.mean = __shfl_down_sync(0xffffffffu, vt[r].mean, lanes);
          other.m2 = __shfl_down_sync(0xffffffffu, vt[r].m2, lanes);
          vt[r] = welford_combine_known(vt[r], other, count, count);
        }
        count = count + count;
      }
      return finish_head_stats(vt, count, p.eps);
    };
    // Two rows at a time (iterations i and i + 1, rows A and B): virtual offset 16 pairs lane q
    // with lane q ^ 4; lanes 0-3 fold A (their own state first, aten's lower virtual thread), lanes
    // 4-7 fold B (lane q - 4's state first). From there lanes 0-3 hold A's partial states and lanes
    // 4-7 B's, in one layout, and each later level is one instruction stream for both rows: lane
    // 0 ends with A's statistics, lane 4 with B's. Per pair of rows, 17 combines and 24 shuffles
    // per lane where one row at a time took 34 and 48 (the lanes whose results aren't used issue
    // them all the same).
    const bool upper = q >= 4;
#pragma unroll
    for (int i = 0; i + 1 < kIterations; i += 2) {
      float va[16], vb[16];
      unpack(i, va);
      unpack(i + 1, vb);
      WelfordState sa[4], sb[4], vt[4];
      push(va, sa);
      push(vb, sb);
      float count = 4.0f;
#pragma unroll
      for (int r = 0; r < 4; ++r) {  // virtual offset 16
        WelfordState got;
        got.mean = __shfl_xor_sync(0xffffffffu, upper ? sa[r].mean : sb[r].mean, 4);
        got.m2 = __shfl_xor_sync(0xffffffffu, upper ? sa[r].m2 : sb[r].m2, 4);
        WelfordState lower, higher;
        lower.mean = upper ? got.mean : sa[r].mean;
        lower.m2 = upper ? got.m2 : sa[r].m2;
        higher.mean = upper ? sb[r].mean : got.mean;
        higher.m2 = upper ? sb[r].m2 : got.m2;
        lower.count = higher.count = count;
        vt[r] = welford_combine_known(lower, higher, count, count);
      }
      const RowStats local = fold_and_finish(vt, count + count, 2);  // virtual offsets 8, 4, ...
      const int base = lane & ~7;
      RowStats st_a, st_b;
      st_a.mean = __shfl_sync(0xffffffffu, local.mean, base);
      st_a.rstd = __shfl_sync(0xffffffffu, local.rstd, base);
      st_b.mean = __shfl_sync(0xffffffffu, local.mean, base + 4);
      st_b.rstd = __shfl_sync(0xffffffffu, local.rstd, base + 4);
      store(i, va, st_a);
      store(i + 1, vb, st_b);
    }
    if constexpr (kIterations % 2 == 1) {  // the last row alone
      constexpr int i = kIterations - 1;
      float v[16];
      unpack(i, v);
      WelfordState vt[4];
      push(v, vt);
      const RowStats local = fold_and_finish(vt, 4.0f, 4);  // virtual offsets 16, 8, 4, ...
      RowStats st;
      st.mean = __shfl_sync(0xffffffffu, local.mean, lane & ~7);
      st.rstd = __shfl_sync(0xffffffffu, local.rstd, lane & ~7);
      store(i, v, st);
    }
  }
  if constexpr (kPdl) pdl_launch_dependents();
}

// Device-side checks of the primitives for the GPU tests: rcp4(n) for n = 1..count, and
// aten_rsqrtf vs its explicit subnormal form (AtenLnSelfcheckParams in the params header).
template <int kUnused>
__device__ void aten_ln_selfcheck_body(const AtenLnSelfcheckParams& p) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < p.count) p.rcp[i] = kernel::rcp4(static_cast<float>(i + 1));
  if (i < p.rsqrt_count) {
    p.rsqrt_out[2 * i] = kernel::aten_rsqrtf(p.rsqrt_in[i]);
    p.rsqrt_out[2 * i + 1] = kernel::aten_rsqrtf_explicit(p.rsqrt_in[i]);
  }
}

}  // namespace ditops

#endif  // __CUDACC__ || __CUDACC_RTC__
