// LayerNorm (no affine) + adaLN modulate, its fp8 e4m3 output variant, and per-head QK LayerNorm.
//
// Numerics contract (docs/layernorm_modulate.md is the full statement; diffusion.md §6.3):
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
// * qk-head: y = bf16(rstd * (x - mean)) per head of Dh <= 128 channels, stats of
//   aten_head_stats_warp (virtual warp 0 only, then the two combines with empty warps).
//
// Mappings of aten's 128 virtual threads (identical bits, chosen by the host per shape):
// * kCta == false: one warp per row, 4 rows per 128-thread CTA, the row kept in registers
//   (kSlots 8-byte vectors per lane, n_vec <= 32 * kSlots). One read of
//   x, no shared memory, no barrier.
// * kCta == true: one 128-thread CTA per row exactly as aten launches it (n_vec <= 128 * kSlots),
//   the inter-warp combine through shared memory: 4x fewer registers per thread for wide rows and
//   4x more CTAs for short inputs.
#pragma once

#include "common/aten_layer_norm.cuh"
#include "common/memory.cuh"
#include "common/types.cuh"
#include "layernorm_modulate_params.h"

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

// Two fp32 values rounded (RNE) to bf16 and packed: lo in the low half.
__device__ __forceinline__ u32 pack_bf16x2(float lo, float hi) {
  u32 out;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(out) : "f"(hi), "f"(lo));
  return out;
}


template <bool kDivFull>
__device__ __forceinline__ float fp8_inverse(const float* input_scale) {
  float s;
  asm("ld.global.nc.f32 %0, [%1];" : "=f"(s) : "l"(input_scale));
  if constexpr (kDivFull) {
    float inv;
    asm("div.full.f32 %0, %1, %2;" : "=f"(inv) : "f"(1.0f), "f"(s));
    return inv;
  } else {
    return __fdiv_rn(1.0f, s);
  }
}

// The eager chain for one vector: x, scale, shift -> the 4 output values (bf16-exact floats).
template <bool kShift>
__device__ __forceinline__ void modulate(const Vec4& x, const Vec4& scale, const Vec4& shift,
                                         RowStats st, float (&out)[4]) {
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const float y = round_to<bf16>(__fmul_rn(st.rstd, __fsub_rn(element(x, e), st.mean)));
    const float op = round_to<bf16>(__fadd_rn(1.0f, element(scale, e)));
    const float p = round_to<bf16>(__fmul_rn(y, op));
    out[e] = kShift ? round_to<bf16>(__fadd_rn(p, element(shift, e))) : p;
  }
}

template <bool kFp8, bool kAligned>
__device__ __forceinline__ void store_out(void* out_row, int vec, const float (&v)[4], float inv) {
  if constexpr (kFp8) {
    const u32 word = e4m3x2_rn_satfinite(__fmul_rn(v[0], inv), __fmul_rn(v[1], inv)) |
                     (e4m3x2_rn_satfinite(__fmul_rn(v[2], inv), __fmul_rn(v[3], inv)) << 16);
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
    const u32 w0 = pack_bf16x2(v[0], v[1]), w1 = pack_bf16x2(v[2], v[3]);
    unsigned short* p = static_cast<unsigned short*>(out_row) + 4 * static_cast<long long>(vec);
    if constexpr (kAligned) {
      Word<8> w;
      w.w[0] = w0;
      w.w[1] = w1;
      store_word<8>(p, w);
    } else {
      p[0] = static_cast<unsigned short>(w0);
      p[1] = static_cast<unsigned short>(w0 >> 16);
      p[2] = static_cast<unsigned short>(w1);
      p[3] = static_cast<unsigned short>(w1 >> 16);
    }
  }
}

}  // namespace lnm_detail

// One row per warp (kCta false) or per CTA (kCta true); see the top of the file.
template <int kSlots, bool kCta, bool kShift, bool kFp8, bool kDivFull, bool kPdl, bool kAligned>
__device__ void layernorm_modulate_body(const LayerNormModulateParams& p) {
  using namespace lnm_detail;
  constexpr int kStride = kCta ? kThreads : 32;  // vectors between a thread's slots

  const int lane = threadIdx.x & 31;
  const int t = kCta ? static_cast<int>(threadIdx.x) : lane;  // this thread's first vector
  const long long row = kCta ? static_cast<long long>(blockIdx.x)
                             : static_cast<long long>(blockIdx.x) * (kThreads / 32) + threadIdx.x / 32;
  const int n_vec = p.n_vec;

  if constexpr (kPdl) pdl_wait();
  if (row < p.rows) {  // uniform per warp (and per CTA when kCta)
    const long long b = row / p.seq;
    const long long s = row - b * p.seq;
    const bf16* x = static_cast<const bf16*>(p.x) + b * p.x_batch_stride + s * p.x_token_stride;

    Vec4 xv[kSlots];
#pragma unroll
    for (int j = 0; j < kSlots; ++j)
      if (t + kStride * j < n_vec) xv[j] = load_vec4<kAligned, false>(x + 4 * (t + kStride * j));

    auto get_vec = [&](int j, float (&v)[4]) { to_floats(xv[j], v); };
    RowStats st;
    if constexpr (kCta) {
      __shared__ WelfordState shared[4];
      st = aten_row_stats_cta<kSlots>(get_vec, n_vec, p.eps, shared);
    } else {
      st = aten_row_stats_warp<kSlots>(get_vec, n_vec, lane, p.eps);
    }

    if (p.stats && t == 0) {
      p.stats[2 * row] = st.mean;
      p.stats[2 * row + 1] = st.rstd;
    }

    float inv = 1.0f;
    if constexpr (kFp8) inv = fp8_inverse<kDivFull>(p.input_scale);
    const bf16* scale = static_cast<const bf16*>(p.scale) + b * p.scale_row_stride;
    const bf16* shift = static_cast<const bf16*>(p.shift) + (kShift ? b * p.shift_row_stride : 0);
    void* out_row = kFp8 ? static_cast<void*>(static_cast<unsigned char*>(p.out) + b * p.out_batch_stride +
                                              s * p.out_token_stride)
                         : static_cast<void*>(static_cast<unsigned short*>(p.out) + b * p.out_batch_stride +
                                              s * p.out_token_stride);
#pragma unroll
    for (int j = 0; j < kSlots; ++j) {
      const int vec = t + kStride * j;
      if (vec < n_vec) {
        const Vec4 sc = load_vec4<kAligned, true>(scale + 4 * vec);
        Vec4 sh{{0u, 0u}};
        if constexpr (kShift) sh = load_vec4<kAligned, true>(shift + 4 * vec);
        float v[4];
        modulate<kShift>(xv[j], sc, sh, st, v);
        store_out<kFp8, kAligned>(out_row, vec, v, inv);
      }
    }
  }
  if constexpr (kPdl) pdl_launch_dependents();
}

// Per-head LayerNorm of q and k: one warp per head row, kRowsPerWarp consecutive rows of one side
// per warp (their loads are issued together). Lanes >= n_vec are aten's idle threads.
template <int kRowsPerWarp, bool kPdl, bool kAligned>
__device__ void qk_head_layernorm_body(const QkHeadLayerNormParams& p) {
  using namespace lnm_detail;
  const int lane = threadIdx.x & 31;
  const long long warp = static_cast<long long>(blockIdx.x) * (kThreads / 32) + threadIdx.x / 32;
  // Rows are grouped per side so one warp never mixes q and k: side 0 has ceil(q_rows / R)
  // groups, side 1 the rest.
  const long long q_groups = (p.q_rows + kRowsPerWarp - 1) / kRowsPerWarp;
  const bool is_q = warp < q_groups;
  const long long first = is_q ? warp * kRowsPerWarp : (warp - q_groups) * kRowsPerWarp;
  const long long side_rows = is_q ? p.q_rows : p.total_rows - p.q_rows;
  const int heads = is_q ? p.q_heads : p.k_heads;
  const bf16* in = static_cast<const bf16*>(is_q ? p.q : p.k);
  unsigned short* out = static_cast<unsigned short*>(is_q ? p.q_out : p.k_out);
  const long long in_ts = is_q ? p.q_token_stride : p.k_token_stride;
  const long long in_hs = is_q ? p.q_head_stride : p.k_head_stride;
  const long long out_ts = is_q ? p.q_out_token_stride : p.k_out_token_stride;
  const long long out_hs = is_q ? p.q_out_head_stride : p.k_out_head_stride;

  if constexpr (kPdl) pdl_wait();
  if (first < side_rows) {
    long long token = first / heads;
    int head = static_cast<int>(first - token * heads);
    long long in_off[kRowsPerWarp], out_off[kRowsPerWarp];
    bool valid[kRowsPerWarp];
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) {
      valid[i] = first + i < side_rows;
      in_off[i] = token * in_ts + head * in_hs;
      out_off[i] = token * out_ts + head * out_hs;
      if (++head == heads) {
        head = 0;
        ++token;
      }
    }
    const bool has_data = lane < p.n_vec;
    Vec4 xv[kRowsPerWarp];
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i)
      if (valid[i] && has_data) xv[i] = load_vec4<kAligned, false>(in + in_off[i] + 4 * lane);
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) {
      float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      if (valid[i] && has_data) to_floats(xv[i], v);
      // Every lane takes part in the shuffles, also for an invalid row (its result is unused).
      const RowStats st = aten_head_stats_warp(v, p.n_vec, lane, p.eps);
      if (valid[i] && has_data) {
        float y[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) y[e] = __fmul_rn(st.rstd, __fsub_rn(v[e], st.mean));
        store_out<false, kAligned>(out + out_off[i], lane, y, 1.0f);
      }
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
