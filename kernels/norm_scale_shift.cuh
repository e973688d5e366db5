// Norm + scale/shift (adaLN pre-norm), optional gated residual in front and FP8 / NVFP4 behind.
//
// Numerics contract (docs/norm_scale_shift.md is the full statement; rne() rounds fp32 to the
// activation dtype T, to nearest even; every fp32 op below is one IEEE op unless named):
// * eager (kSglang = false), bit_exact vs the eager PyTorch 2.11 chain on CUDA:
//     v = rne(r + rne(x * g))                      (residual + x * gate; absent gate = 1)
//     LayerNorm: aten's vectorized Welford statistics (common/aten_layer_norm.cuh), mean, rstd;
//     RMSNorm: aten's rms order: per virtual thread ss = fma(e, e, ss) over its vec4s in order,
//       shfl_down tree per virtual warp, then (w0 + w2) + (w1 + w3); rstd = rsqrtf(ss / D + eps),
//       mean = 0. Mean order (kNssRmsMean, diffusers' RMSNorm): the squares rounded to fp32, summed
//       in aten's generic reduction order (aten_mean_rms_rstd_cta), rstd = rsqrtf(sum * factor + eps).
//     n = rstd * (v - mean); a = fma(w, n, b) | w * n | n (affine weight+bias | weight | none,
//       nvcc's contraction of aten's `gamma * (rstd * (x - mean)) + beta`); y0 = rne(a)
//     y = rne(rne(y0 * rne(1 + scale)) + shift)   (no shift: y = rne(y0 * rne(1 + scale)))
// * float32 chain (kFloat32: 16-bit x and residual, fp32 operands), bit_exact vs diffusers' Wan
//   chain: v = rne(fadd(r, fmul(x, g))) (absent gate: g = 1, i.e. rne(r + x)); the LayerNorm
//   statistics as above (aten's float32 instantiation pushes the same values); a as above with fp32
//   weight / bias; then, kModulate, a = fmul(a, fadd(1, scale)), a = fadd(a, shift) (shift absent:
//   no add); y = rne(a): one rounding, every operation fp32 (each a separate eager kernel: no FMA).
// * sglang (kSglang = true), bit_exact vs SGLang's native Qwen-Image kernel as
//   docs/norm_scale_shift.md §3 states it: v = rne(fma(x, g, r)); thread t of D/16 owns elements [16t, 16t+16); per-thread
//   sequential sums from +0, XOR butterfly per warp, warp totals summed by a butterfly over 32
//   slots (empty slots +0); mean = sum * fp32(1/D); var the same over fma(d, d, acc) with
//   d = v - mean; factor = rsqrtf(var + eps); norm = rne((v - mean) * factor);
//   y = rne(fma(norm, 1 + s, shift)) with 1 + s unrounded.
// * fp8: q = e4m3_rn_satfinite(y * inv), inv = div.full.f32(1, input_scale) (or div.rn).
// * fp8_rowwise (eager and float32 chains, 16-bit T): the per-token dynamic e4m3 of the rounded y,
//   the recipe of common/fp8_rowwise.cuh (torchao's float8 rowwise as eager computes it): the row's
//   y words stay in registers, their |y| maximum is reduced over the CTA, s = T(amax * fp32(1/448))
//   (1 where 0) is stored per row and q = e4m3(clamp(y / s, +-448)): bit_exact vs
//   fp8_rowwise_eager(the chain's y).
// * nvfp4 (blocks of 16 consecutive y of one row): amax = max |y|; SF = gs * (amax * rcp(6));
//   sf8 = e4m3_rn_satfinite(SF) (stored, 128x4 swizzle); out = SFf != 0 ?
//   rcp(SFf * rcp(gs)) : 0 with rcp = rcp.approx.ftz.f32; e2m1_rn_satfinite(y * out), the even
//   element in the low nibble. E2M1 in software (compares) or by cvt.rn.satfinite.e2m1x2.f32.
//
// Layout, the row in registers as raw T words. eager: one 128-thread CTA per row at a time, as
// aten launches it (thread t owns the vec4s t + 128j: one coalesced 4*sizeof(T)-byte access per
// vec4), persistent over rows (eager_rows). sglang: one warp per row, lane l owns the 16-element
// threads l + 32k (two 16-byte accesses). Padding rows of the NVFP4 scale tensor
// (rows .. pad128(rows)) only get zero scale bytes.
#pragma once

#include "common/row_position.h"

// Launch parameters of the norm + scale/shift kernel. Plain data shared by the host op and the
// device code (built on the host, passed by value as a __grid_constant__ kernel argument).
namespace ditops {

// A broadcast operand of the row (scale, shift, gate): element (b, s, c) lives at
//   data + b*batch_stride + (s / frame_len)*frame_stride + s*token_stride + (vector ? c : 0).
// kind: 0 absent, 1 scalar (one element), 2 a [.., D] row per (b, frame, token) as the strides say.
struct NssOperandParams {
  const void* data;
  long long batch_stride;
  long long frame_stride;
  long long token_stride;
  long long frame_len;
  int kind;
};

// Field order: what a CTA's first loads need comes first. The parameters start at byte 0x210 of
// the constant bank on sm_90, so x .. r_token_stride share the 64-byte line at 0x200 with the
// global memory descriptor the loads use: each line's first touch is a constant-cache miss the
// warp waits for in order; before a row's first load there had been one for each of four lines,
// now two (with the division-free first row of eager_rows: faster short rows,
// docs/tuning/norm_scale_shift.md).
struct NormScaleShiftParams {
  const void* x;              // [B, S, D]
  const void* residual;       // [B, S, D] or null
  long long seq;              // S (rows of one batch)
  long long rows;             // B * S
  long long x_token_stride, r_token_stride;
  long long x_batch_stride, r_batch_stride;
  long long grid_rows;        // rows, or pad128(rows) for nvfp4 (padding rows write zero scales)
  const void* weight;         // [D] or null
  const void* bias;           // [D] or null
  const float* input_scale;   // fp8: one element
  const float* global_scale;  // nvfp4: one element
  void* y;                    // [B, S, D] or null (not stored)
  void* residual_out;         // [B, S, D] or null
  unsigned char* fp8;         // [B, S, D] or null
  unsigned char* fp4_packed;  // [rows, D/2]
  unsigned char* fp4_scales;  // [pad128(rows), D/16], 128x4 swizzled
  NssOperandParams scale, shift, gate;
  long long y_batch_stride, y_token_stride;
  long long ro_batch_stride, ro_token_stride;
  long long q_batch_stride, q_token_stride;
  float eps;
  int fp8_div_full;  // inv = div.full.f32(1, input_scale) (else IEEE division)
  // fp8_rowwise: the rows' fp32 scales [B * S] (its e4m3 rows go to fp8 with the q strides). Last,
  // so that the other keys' parameter offsets stay as they were.
  float* fp8_scale;
};

// The norm (the kernel's kRms): LayerNorm, RMSNorm in F.rms_norm's order, RMSNorm in the order of
// x.float().pow(2).mean(-1) (diffusers' RMSNorm).
enum : int { kNssLayerNorm = 0, kNssRms = 1, kNssRmsMean = 2 };

}  // namespace ditops

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

#include "common/aten_layer_norm.cuh"
#include "common/fp8_rowwise.cuh"
#include "common/memory.cuh"
#include "common/types.cuh"

// The hardware E2M1 conversion exists on the arch-specific Blackwell targets only.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1000 &&                                       \
    (defined(__CUDA_ARCH_FEAT_SM100_ALL) || defined(__CUDA_ARCH_FEAT_SM101_ALL) ||           \
     defined(__CUDA_ARCH_FEAT_SM103_ALL) || defined(__CUDA_ARCH_FEAT_SM110_ALL) ||           \
     defined(__CUDA_ARCH_FEAT_SM120_ALL) || defined(__CUDA_ARCH_FEAT_SM121_ALL) ||           \
     defined(__CUDA_ARCH_SPECIFIC__) || defined(__CUDA_ARCH_FAMILY_SPECIFIC__))
#define DITOPS_HAS_E2M1_CVT 1
#else
#define DITOPS_HAS_E2M1_CVT 0
#endif

namespace ditops {

namespace nss_detail {

using namespace ditops::kernel;

constexpr unsigned kFullMask = 0xffffffffu;
enum : int { kQuantNone = 0, kQuantFp8 = 1, kQuantFp4Software = 2, kQuantFp4Hardware = 3, kQuantFp8Rowwise = 4 };
__host__ __device__ constexpr bool is_nvfp4(int quant) {
  return quant == kQuantFp4Software || quant == kQuantFp4Hardware;
}

__device__ __forceinline__ float rcp_approx_ftz(float x) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}

__device__ __forceinline__ float div_full(float a, float b) {
  float r;
  asm("div.full.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}


// The E4M3 byte in bits 0..7 of `pair` to fp32 (exact: E4M3 is a subset of fp16; sm_89+ convert
// E4M3 pairs in hardware, bits 8..15 go to the unused upper half, higher bits are not read; the
// byte comes from a satfinite conversion, so never NaN).
__device__ __forceinline__ float e4m3_to_float(u32 pair) {
  u32 halves;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(halves) : "h"(static_cast<unsigned short>(pair)));
  float value;
  asm("cvt.f32.f16 %0, %1;" : "=f"(value) : "h"(static_cast<unsigned short>(halves & 0xffffu)));
  return value;
}

// E2M1 of a product (round to nearest even onto {0, .5, 1, 1.5, 2, 3, 4, 6}, saturating; the
// sign kept, so a negative value rounding to 0 gives 0x8; NaN -> 0x7, as src/reference/fp8_fp4.h
// assumes for the hardware conversion): the magnitude's code plus kE2m1Bias in bits 0..22, the
// rounded sum's exponent in bits 23.. (multiples of 2^23: e2m1x4 keeps the low 16 bits of its
// nibble sum and adds the sign). The input must be the result of an fp32 multiplication: a NaN is
// then the positive canonical NaN 0x7FFFFFFF (the GPU test
// NormScaleShiftGpu.Nvfp4ConversionsMatchTheReferenceForEveryInput checks that on the device,
// and this function through `x * 1` against the compare ladder for all 2^32 fp32 inputs).
// * Saturation first: a = min(|x|, 6) (fminf gives 6 for NaN, inf and anything above 6: code 7).
// * a + 2^(e + 22), with 2^e <= a < 2^(e+1) and e clamped below at 0 (e <= 2), lands in the
//   binade [2^(e+22), 2^(e+23)), whose fp32 spacing 2^(e-1) is E2M1's spacing at a (0.5 below 2,
//   1 in [2, 4), 2 from 4): the one fp32 add rounds a onto the E2M1 grid, to nearest even. The
//   sum is (e + 149) * 2^23 + k (k <= 4 steps); sum >> 22 = 2e + 298, so the low 23 bits of
//   sum + (sum >> 22) are k + 2e + 298 = code + 298.
// sm_90a SASS: 6 instructions per value (min, exponent mask, add-and-max, add, shift-add, the
// nibble's shift-add) plus e2m1x4's signs, against 7 with saturation by an integer min after
// the add and 15 for an integer rounding with compares and a NaN test (measured with the constant
// slot offsets of load_inputs: docs/tuning/norm_scale_shift.md).
constexpr u32 kE2m1Bias = 298;
__device__ __forceinline__ u32 e2m1_biased_of_product(float x) {
  const float a = fminf(fabsf(x), 6.0f);
  const u32 magic = max((__float_as_uint(a) & 0x7F800000u) + 0x0B000000u, 0x4A800000u);  // 2^(max(e, 0) + 22)
  const u32 sum = __float_as_uint(__fadd_rn(a, __uint_as_float(magic)));
  return sum + (sum >> 22);
}

// Four fp32 products (see e2m1_biased_of_product) to four E2M1 nibbles (v[0] in bits 0..3).
template <bool kHardware>
__device__ __forceinline__ u32 e2m1x4(const float (&v)[4]) {
  if constexpr (kHardware) {
#if DITOPS_HAS_E2M1_CVT
    u32 out;
    asm("{\n"
        "  .reg .b8 b0, b1;\n"
        "  cvt.rn.satfinite.e2m1x2.f32 b0, %2, %1;\n"
        "  cvt.rn.satfinite.e2m1x2.f32 b1, %4, %3;\n"
        "  mov.b32 %0, {b0, b1, b0, b1};\n"
        "}"
        : "=r"(out)
        : "f"(v[0]), "f"(v[1]), "f"(v[2]), "f"(v[3]));
    return out & 0xffffu;
#else
    static_assert(!kHardware, "hardware E2M1 conversion needs sm_100a / sm_103a / sm_120a");
    return 0;
#endif
  } else {
    // Biased codes (< 2^9, above bit 22 multiples of 2^23 that leave bits 0..15 alone) summed at
    // their nibbles, the bias taken off once (no carries between nibbles are left: each code +
    // 8 * sign is < 16), bits 0..15 kept. The signs: the top bytes of v[0] and v[2]
    // (v[1] and v[3]) side by side put v[0]'s sign at bit 7 and v[2]'s at 15 (v[1]'s at 7, v[3]'s
    // at 15), which is bit 3 and 11 after a shift by 4 (bit 7 and 15 as they are): 6 instructions
    // for the four signs against 12 for a shift and a mask each.
    u32 sum = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) sum += e2m1_biased_of_product(v[i]) << (4 * i);
    const u32 signs02 = __byte_perm(__float_as_uint(v[0]), __float_as_uint(v[2]), 0x0073u);
    const u32 signs13 = __byte_perm(__float_as_uint(v[1]), __float_as_uint(v[3]), 0x0073u);
    sum += ((signs02 >> 4) & 0x0808u) + (signs13 & 0x8080u);
    return (sum - kE2m1Bias * 0x1111u) & 0xffffu;
  }
}

// The NVFP4 output scale of a block from its amax; writes the E4M3 scale byte to bits 0..7 of
// *sf8 (bits 8..15 hold E4M3 zero, the rest zero: callers store it as an unsigned char).
__device__ __forceinline__ float nvfp4_block_scale(float amax, float global_scale, u32* sf8) {
  const float sf = __fmul_rn(global_scale, __fmul_rn(amax, rcp_approx_ftz(6.0f)));
  *sf8 = e4m3x2_rn_satfinite(sf, 0.0f);
  const float sff = e4m3_to_float(*sf8);
  return sff != 0.0f ? rcp_approx_ftz(__fmul_rn(sff, rcp_approx_ftz(global_scale))) : 0.0f;
}

// The NVFP4 output factors of a thread's slots, where slot j's block of 16 is the vec4s of the 4
// lanes of a quad (quad = lane & 3) and amax[j] is the largest |y| of this lane's vec4 of slot j.
// Lane `quad` computes the scales of slots 4c + quad only and stores their bytes (sf_quad: the
// byte of slot `quad`, slot 4c + quad at sf_quad[4096 * 4c], where active(4c + quad)): a
// reduce-scatter of the slot maxima over the quad (xor 2, then xor 1), one nvfp4_block_scale,
// then an all-gather of the factors. Every lane of the quad had computed every slot's scale after
// an all-reduce of each maximum (4 shuffles, 4 maxima, 4 scales and 4 store instructions per 4
// slots against 6 shuffles, 3 maxima, 1 scale, 1 store and 12 selects). The maxima are exact, so
// the scales are the same bits whichever lane computes them.
template <int kSlots, typename Active>
__device__ __forceinline__ void nvfp4_quad_scales(const float (&amax)[kSlots], int quad, float global_scale,
                                                  unsigned char* sf_quad, const Active& active,
                                                  float (&out)[kSlots]) {
  const bool b0 = quad & 1, b1 = quad & 2;
  // Slot i's maximum, and a write of slot i's factor, for i past the last slot: 0, nothing.
  const auto max_of = [&](int i) { return i < kSlots ? amax[i < kSlots ? i : 0] : 0.0f; };
  const auto set = [&](int i, float v) {
    if (i < kSlots) out[i < kSlots ? i : 0] = v;
  };
#pragma unroll
  for (int c = 0; c < kSlots; c += 4) {
    const int n = kSlots - c < 4 ? kSlots - c : 4;
    const float m0 = amax[c], m1 = max_of(c + 1), m2 = max_of(c + 2), m3 = max_of(c + 3);
    u32 sf8;
    if (n >= 3) {
      // xor 2: lanes 0, 1 keep slots c, c + 1; lanes 2, 3 keep c + 2, c + 3.
      float k0 = b1 ? m2 : m0, k1 = b1 ? m3 : m1;
      k0 = fmaxf(k0, __shfl_xor_sync(kFullMask, b1 ? m0 : m2, 2));
      k1 = fmaxf(k1, __shfl_xor_sync(kFullMask, b1 ? m1 : m3, 2));
      // xor 1: lane quad keeps slot c + quad.
      const float a = fmaxf(b0 ? k1 : k0, __shfl_xor_sync(kFullMask, b0 ? k0 : k1, 1));
      const float os = nvfp4_block_scale(a, global_scale, &sf8);
      if (c + quad < kSlots && active(c + quad)) sf_quad[4096 * c] = static_cast<unsigned char>(sf8);
      const float r = __shfl_xor_sync(kFullMask, os, 1);
      const float p0 = b0 ? r : os, p1 = b0 ? os : r;  // slots c + (quad & 2) + 0, 1
      const float r0 = __shfl_xor_sync(kFullMask, p0, 2), r1 = __shfl_xor_sync(kFullMask, p1, 2);
      out[c] = b1 ? r0 : p0;
      set(c + 1, b1 ? r1 : p1);
      set(c + 2, b1 ? p0 : r0);
      set(c + 3, b1 ? p1 : r1);
    } else if (n == 2) {
      // xor 2: both maxima over lane pairs; xor 1: lanes 0, 2 keep slot c, lanes 1, 3 slot c + 1.
      const float k0 = fmaxf(m0, __shfl_xor_sync(kFullMask, m0, 2));
      const float k1 = fmaxf(m1, __shfl_xor_sync(kFullMask, m1, 2));
      const float a = fmaxf(b0 ? k1 : k0, __shfl_xor_sync(kFullMask, b0 ? k0 : k1, 1));
      const float os = nvfp4_block_scale(a, global_scale, &sf8);
      if (quad < 2 && active(c + quad)) sf_quad[4096 * c] = static_cast<unsigned char>(sf8);
      const float r = __shfl_xor_sync(kFullMask, os, 1);
      out[c] = b0 ? r : os;
      set(c + 1, b0 ? os : r);
    } else {
      float a = fmaxf(m0, __shfl_xor_sync(kFullMask, m0, 1));
      a = fmaxf(a, __shfl_xor_sync(kFullMask, a, 2));
      out[c] = nvfp4_block_scale(a, global_scale, &sf8);
      if (quad == 0 && active(c)) sf_quad[4096 * c] = static_cast<unsigned char>(sf8);
    }
  }
}

// The 128x4 swizzled NVFP4 scale layout: scale (m, k) of a [rows, cols] tensor (cols = D / 16,
// a multiple of 4) at (m / 128) * (cols / 4) * 512 + (k / 4) * 512 + (m % 32) * 16 +
// ((m % 128) / 32) * 4 + k % 4, split into the row's part (once per row, 64-bit) and the
// column's part (32-bit): in one 64-bit signed expression per scale byte it had taken ~150 of a
// 6-slot row's SASS instructions.
__device__ __forceinline__ long long nvfp4_scale_row_offset(long long m, int cols) {
  const unsigned long long um = static_cast<unsigned long long>(m);
  return static_cast<long long>((um / 128) * static_cast<unsigned>(cols / 4) * 512 + (um % 32) * 16 + ((um % 128) / 32) * 4);
}
__device__ __forceinline__ int nvfp4_scale_column_offset(int k) { return (k / 4) * 512 + k % 4; }
__device__ __forceinline__ long long nvfp4_scale_offset(long long m, int k, int cols) {
  return nvfp4_scale_row_offset(m, cols) + nvfp4_scale_column_offset(k);
}

// Element offset of a broadcast operand's row for (batch b, token s).
// (The per-frame division only for a per-frame operand: a 64-bit division is a long subroutine.)
__device__ __forceinline__ long long operand_offset(const NssOperandParams& op, long long b, long long s) {
  return b * op.batch_stride + (op.frame_stride ? (s / op.frame_len) * op.frame_stride : 0) + s * op.token_stride;
}

// N values of an operand at channel c: a vector load for a row operand, the scalar otherwise.
template <typename T, int N>
__device__ __forceinline__ void operand_values(const NssOperandParams& op, const T* row, float scalar, int c,
                                               float (&out)[N]) {
  if (op.kind == 2) {
    T raw[N];
    load_elements<T, N, true, true>(row + c, raw);
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = to_float(raw[i]);
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = scalar;
  }
}

template <typename T>
__device__ __forceinline__ float operand_scalar(const NssOperandParams& op, const T* row, float absent) {
  return op.kind == 1 ? to_float(row[0]) : absent;
}

template <typename T, int N>
__device__ __forceinline__ void to_floats(const Word<N * sizeof(T)>& w, float (&out)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) out[i] = to_float(word_element<T>(w, i));
}

template <typename T, int N>
__device__ __forceinline__ Word<N * sizeof(T)> from_floats(const float (&v)[N]) {
  T t[N];
#pragma unroll
  for (int i = 0; i < N; ++i) t[i] = from_float<T>(v[i]);
  Word<N * sizeof(T)> w;
  elements_to_word(t, w);
  return w;
}

// Everything of one row that does not depend on the layout.
template <typename T>
struct RowPointers {
  const T* scale;
  const T* shift;
  const T* gate;
  float scale_scalar, shift_scalar, gate_scalar;
  long long q_offset;  // fp8 element offset of the row
  float inv;           // fp8: 1 / input_scale
  float global_scale;  // nvfp4
};

template <typename T, bool kResidual, int kQuant>
__device__ __forceinline__ RowPointers<T> row_pointers(const NormScaleShiftParams& p, long long b, long long s) {
  RowPointers<T> rp;
  rp.scale = static_cast<const T*>(p.scale.data) + operand_offset(p.scale, b, s);
  rp.shift = static_cast<const T*>(p.shift.data) + operand_offset(p.shift, b, s);
  rp.gate = static_cast<const T*>(p.gate.data) + operand_offset(p.gate, b, s);
  rp.scale_scalar = operand_scalar(p.scale, rp.scale, 0.0f);
  rp.shift_scalar = operand_scalar(p.shift, rp.shift, 0.0f);
  rp.gate_scalar = kResidual ? operand_scalar(p.gate, rp.gate, 1.0f) : 1.0f;
  rp.q_offset = b * p.q_batch_stride + s * p.q_token_stride;
  rp.inv = 0.0f;
  rp.global_scale = 0.0f;
  if constexpr (kQuant == kQuantFp8) {
    const float input_scale = *p.input_scale;
    rp.inv = p.fp8_div_full ? div_full(1.0f, input_scale) : __fdiv_rn(1.0f, input_scale);
  }
  if constexpr (is_nvfp4(kQuant)) rp.global_scale = *p.global_scale;
  return rp;
}

// ---------------------------------------------------------------- eager numerics

// A vec4 of T as raw words (8 bytes for bf16/f16, 16 for fp32).
template <typename T>
using Vec = Word<4 * sizeof(T)>;

// Four fp32 values rounded (RNE) to T.
__device__ __forceinline__ Vec<bf16> round_vec(bf16, const float (&v)[4]) {
  Vec<bf16> w;
  w.w[0] = bf16x2_from_floats(v[0], v[1]);
  w.w[1] = bf16x2_from_floats(v[2], v[3]);
  return w;
}
__device__ __forceinline__ Vec<f16> round_vec(f16, const float (&v)[4]) {
  Vec<f16> w;
  w.w[0] = f16x2_from_floats(v[0], v[1]);
  w.w[1] = f16x2_from_floats(v[2], v[3]);
  return w;
}
__device__ __forceinline__ Vec<float> round_vec(float, const float (&v)[4]) {
  Vec<float> w;
#pragma unroll
  for (int i = 0; i < 4; ++i) w.w[i] = __float_as_uint(v[i]);
  return w;
}

// a * b and a + b of T values, one rounding to T each. For 16-bit T the packed instructions equal
// eager's fp32 operation followed by a rounding to T on every operand pair used here: a sum or a
// product of two values of T is exact in fp32 or (normal range) fp32's 24 >= 2p + 2 bits
// (p = 8 bf16, 11 f16) make the double rounding innocuous; the products y0 * rne(1 + scale) have
// their least significant bit >= 2^-141 (bf16: y0's lsb >= 2^-133, rne(1 + scale) is 0 or has lsb
// >= 2^-8; f16: 2^-24 and 2^-11), so they are exact in fp32 also below 2^-126.
// Lane by lane: two packed 16-bit lanes per word through `packed`, or an fp32 operation per word.
template <typename T, typename Packed, typename Scalar>
__device__ __forceinline__ Vec<T> lanewise(const Vec<T>& a, const Vec<T>& b, Packed packed, Scalar scalar) {
  Vec<T> w;
#pragma unroll
  for (int i = 0; i < 4 * static_cast<int>(sizeof(T)) / 4; ++i) {
    if constexpr (sizeof(T) == 2)
      w.w[i] = packed(a.w[i], b.w[i]);
    else
      w.w[i] = __float_as_uint(scalar(__uint_as_float(a.w[i]), __uint_as_float(b.w[i])));
  }
  return w;
}
__device__ __forceinline__ float fmul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ float fadd(float a, float b) { return __fadd_rn(a, b); }

__device__ __forceinline__ Vec<bf16> mul_vec(bf16, const Vec<bf16>& a, const Vec<bf16>& b) {
  return lanewise<bf16>(a, b, mul_rn_bf16x2, fmul);
}
__device__ __forceinline__ Vec<bf16> add_vec(bf16, const Vec<bf16>& a, const Vec<bf16>& b) {
  return lanewise<bf16>(a, b, add_rn_bf16x2, fadd);
}
__device__ __forceinline__ Vec<f16> mul_vec(f16, const Vec<f16>& a, const Vec<f16>& b) {
  return lanewise<f16>(a, b, mul_rn_f16x2, fmul);
}
__device__ __forceinline__ Vec<f16> add_vec(f16, const Vec<f16>& a, const Vec<f16>& b) {
  return lanewise<f16>(a, b, add_rn_f16x2, fadd);
}
__device__ __forceinline__ Vec<float> mul_vec(float, const Vec<float>& a, const Vec<float>& b) {
  return lanewise<float>(a, b, mul_rn_bf16x2, fmul);
}
__device__ __forceinline__ Vec<float> add_vec(float, const Vec<float>& a, const Vec<float>& b) {
  return lanewise<float>(a, b, add_rn_bf16x2, fadd);
}

// The type a held operand's values keep: the activation type, or fp32 in the float32 chain.
template <typename T, bool kFloat32>
struct OperandOf {
  using type = T;
};
template <typename T>
struct OperandOf<T, true> {
  using type = float;
};

// The float32 chain's residual sum: rne(float(r) + float(x) * g) in fp32, one rounding (Wan's
// `(hidden.float() + attn_output * gate).type_as(hidden)`; an absent gate is held as 1, which
// makes it eager's 16-bit `hidden + attn_output`).
template <typename T>
__device__ __forceinline__ Vec<T> promoted_sum(const Vec<T>& x, const Vec<T>& r, const Vec<float>& g) {
  float xv[4], rv[4], gv[4], v[4];
  to_floats<T, 4>(x, xv);
  to_floats<T, 4>(r, rv);
  to_floats<float, 4>(g, gv);
#pragma unroll
  for (int e = 0; e < 4; ++e) v[e] = __fadd_rn(rv[e], __fmul_rn(xv[e], gv[e]));
  return round_vec(T{}, v);
}

// Where a broadcast operand's row is held between rows (kHome): in registers; in this thread's
// own words of a shared array, slot j at t + 128 j (no other thread reads a thread's words, so no
// barrier is needed; each operand held there frees two registers a slot for 16-bit T); or not held
// at all (kStreamed, the float32 chain's rows of more than 10 slots, whose fp32 operands fit
// neither): each use loads the slot from global memory (L1 / L2 after the first row), as the
// affine weight and bias are.
enum : int { kHeldInRegisters = 0, kHeldInShared = 1, kStreamed = 2 };
template <typename T, int kSlots, int kHome>
struct HeldOperand {
  Vec<T> reg[kHome == kHeldInRegisters ? kSlots : 1];
  Vec<T>* own;     // kHeldInShared: this thread's slot 0
  const T* row;    // kStreamed: this thread's slot 0 of a row operand, else null
  float scalar;    // kStreamed: the value of a scalar (or absent) operand
  bool plus_one;   // kStreamed: get() returns 1 + value (one_plus), in fp32 (T = float)
  __device__ __forceinline__ Vec<T> get(int j) const {
    if constexpr (kHome == kHeldInShared) {
      return own[128 * j];
    } else if constexpr (kHome == kHeldInRegisters) {
      return reg[j];
    } else {
      static_assert(sizeof(T) == 4, "streamed operands: the float32 chain");
      float v[4] = {scalar, scalar, scalar, scalar};
      if (row) to_floats<T, 4>(load_word<4 * sizeof(T), true>(row + 512 * j), v);
      if (plus_one)
#pragma unroll
        for (int e = 0; e < 4; ++e) v[e] = __fadd_rn(1.0f, v[e]);
      return round_vec(T{}, v);
    }
  }
  __device__ __forceinline__ void set(int j, const Vec<T>& v) {
    if constexpr (kHome == kHeldInShared) own[128 * j] = v;
    else if constexpr (kHome == kHeldInRegisters) reg[j] = v;
  }
};

// A broadcast operand of the row as this thread's vec4s t + 128j, kept (HeldOperand) while its
// offset does not change (a [D] or [B, D] operand is loaded once per CTA and batch): the T values
// as stored (a scalar operand broadcast, an absent one `absent`). Returns whether it was reloaded.
// Only loads: the caller issues every operand's loads before it converts any (one memory round
// trip for scale, shift and gate, not three: a CTA of the 512-token calls runs one row).
// This thread's slots are j0 + j, j < kSlots (j0 = 0 unless the row is split: eager_rows).
// Streamed: only where the row is (a scalar operand's value).
template <typename T, int kSlots, bool kEven, int kHome>
__device__ __forceinline__ bool load_operand(const NssOperandParams& op, long long b, long long s, int t, int j0,
                                             int n_vec, float absent, HeldOperand<T, kSlots, kHome>& held,
                                             long long& held_offset) {
  const long long offset = op.kind ? operand_offset(op, b, s) : 0;
  if (offset == held_offset) return false;
  held_offset = offset;
  const T* row = static_cast<const T*>(op.data) + offset;
  if constexpr (kHome == kStreamed) {
    held.row = op.kind == 2 ? row + 4 * t + 512 * j0 : nullptr;
    held.scalar = op.kind == 1 ? to_float(row[0]) : absent;
    held.plus_one = false;
    return true;
  }
  if (op.kind == 2) {
    const T* const row_t = row + 4 * t + 512 * j0;  // slot j at the constant offset 512 j (see load_inputs)
#pragma unroll
    for (int j = 0; j < kSlots; ++j)
      if (kEven || t + 128 * (j0 + j) < n_vec) held.set(j, load_word<4 * sizeof(T), true>(row_t + 512 * j));
  } else {
    const float scalar = op.kind == 1 ? to_float(row[0]) : absent;  // a T value: exact in T again
    const float v[4] = {scalar, scalar, scalar, scalar};
#pragma unroll
    for (int j = 0; j < kSlots; ++j)
      if (kEven || t + 128 * (j0 + j) < n_vec) held.set(j, round_vec(T{}, v));
  }
  return true;
}

// The scale as held: rne(1 + value) of each T value, eager's 1 + scale (fp32 add, one rounding);
// add_vec's packed add gives the same bits for 16-bit T (a sum of two T values, see lanewise), in
// a fifth of the instructions (they run once per CTA and batch: per row at 512 tokens).
// Streamed: each use adds the 1.
template <typename T, int kSlots, bool kEven, int kHome>
__device__ __forceinline__ void one_plus(HeldOperand<T, kSlots, kHome>& held, int t, int j0, int n_vec) {
  if constexpr (kHome == kStreamed) {
    held.plus_one = true;
  } else {
    const float one[4] = {1.0f, 1.0f, 1.0f, 1.0f};
    const Vec<T> ones = round_vec(T{}, one);
#pragma unroll
    for (int j = 0; j < kSlots; ++j)
      if (kEven || t + 128 * (j0 + j) < n_vec) held.set(j, add_vec(T{}, ones, held.get(j)));
  }
}

// Where this thread's vec4s of x (and the residual) of row (b, s) start, slot j at the constant
// offset 512 j: an immediate in the load, where the index 4 (t + 128 j) took four 64-bit address
// instructions per slot. Parameters only (computed before the PDL wait for the first row).
template <typename T>
struct RowInputs {
  const T* x;
  const T* r;
};
template <typename T>
__device__ __forceinline__ RowInputs<T> row_inputs(const NormScaleShiftParams& p, RowPosition at, int t, int j0) {
  const int first = 4 * t + 512 * j0;
  return {static_cast<const T*>(p.x) + at.b * p.x_batch_stride + at.s * p.x_token_stride + first,
          static_cast<const T*>(p.residual) + at.b * p.r_batch_stride + at.s * p.r_token_stride + first};
}

// x (and the residual) of a row as this thread's vec4s (slots j0 + j, j < kSlots).
template <typename T, int D, bool kResidual, int kSlots>
__device__ __forceinline__ void load_inputs(const RowInputs<T>& in, int t, int j0, Vec<T> (&xw)[kSlots],
                                            Vec<T> (&rw)[kSlots]) {
  constexpr int kVecs = D / 4;
#pragma unroll
  for (int j = 0; j < kSlots; ++j) {
    if (kVecs % 128 == 0 || t + 128 * (j0 + j) < kVecs) {
      xw[j] = load_word<4 * sizeof(T), false>(in.x + 512 * j);
      if constexpr (kResidual) rw[j] = load_word<4 * sizeof(T), false>(in.r + 512 * j);
    }
  }
}

// aten's rms statistics on the CTA layout: per thread ss = fma(e, e, ss) over its vec4s in
// order, a tree per warp (the XOR form leaves lane 0's shfl_down value in every lane: each add is
// commutative, so partner lanes compute identical sums), then (w0 + w2) + (w1 + w3). Split rows
// (kSplit > 1, chain_over_parts): thread t + 128 h holds slots kSlots h + j of virtual thread t;
// the last part's warps reduce. kSplit barriers.
template <typename T, int kSlots, int kSplit, int kVecs>
__device__ __forceinline__ float aten_rms_rstd_cta(const Vec<T> (&vw)[kSlots], int t, int h, float eps,
                                                   float* handoff, float* shared) {
  float ss = 0.0f;
  chain_over_parts<kSplit>(t, h, ss, handoff, [&](int q) {
#pragma unroll
    for (int j = 0; j < kSlots; ++j) {
      if (kVecs % 128 == 0 || t + 128 * (kSlots * q + j) < kVecs) {
        float v[4];
        to_floats<T, 4>(vw[j], v);
#pragma unroll
        for (int e = 0; e < 4; ++e) ss = __fmaf_rn(v[e], v[e], ss);
      }
    }
  });
  if (h == kSplit - 1) {
#pragma unroll
    for (int o = 16; o >= 1; o /= 2) ss = __fadd_rn(ss, __shfl_xor_sync(kFullMask, ss, o));
    if ((t & 31) == 0) shared[t >> 5] = ss;
  }
  __syncthreads();
  const float total = __fadd_rn(__fadd_rn(shared[0], shared[2]), __fadd_rn(shared[1], shared[3]));
  return aten_rsqrtf(__fadd_rn(__fdiv_rn(total, static_cast<float>(4 * kVecs)), eps));
}

// The shape of aten's generic reduction (torch 2.11) of `rows` contiguous fp32 rows of D >= 128
// elements, reduced along the row: threads per row, W = min(p2(D/4), 512 / min(p2(rows), 16)) with
// p2 the largest power of two <= its argument (capped at 512); 32 from 16 rows on.
__device__ __forceinline__ int aten_mean_threads_per_row(long long rows, int vecs) {
  const auto floor_pow2 = [](long long n) { return 1 << (63 - __clzll(n)); };
  const int width = vecs < 512 ? floor_pow2(vecs) : 512;
  const int height = rows < 16 ? floor_pow2(rows) : 16;
  return width < 512 / height ? width : 512 / height;
}

// The rstd of diffusers' RMSNorm: rsqrt(x.float().pow(2).mean(-1) + eps), the mean as aten's
// generic reduction computes it (torch 2.11, D >= 128, fewer than 8192 elements; checked on the
// H200 against torch for 1-32760 rows): W virtual threads per row (aten_mean_threads_per_row);
// virtual thread v adds the fp32 squares of vec4s v, v + W, ... into four accumulators from +0,
// combined ((a0 + a1) + a2) + a3; then v += v + off for off = W/2 .. 1 (shared memory down to 32,
// then the warp's shfl_down); mean = total * factor with aten's factor fp32(rows) / fp32(rows * D).
// The squares pass through shared memory, warp 0 adds them: two barriers.
template <typename T, int kSlots, int kVecs>
__device__ __forceinline__ float aten_mean_rms_rstd_cta(const Vec<T> (&vw)[kSlots], int t, float eps, int threads_per_row,
                                                        float factor, float4* squares, float* partials, float* total_slot) {
#pragma unroll
  for (int j = 0; j < kSlots; ++j) {
    if (kVecs % 128 == 0 || t + 128 * j < kVecs) {
      float v[4];
      to_floats<T, 4>(vw[j], v);
      squares[t + 128 * j] = make_float4(__fmul_rn(v[0], v[0]), __fmul_rn(v[1], v[1]), __fmul_rn(v[2], v[2]),
                                         __fmul_rn(v[3], v[3]));
    }
  }
  __syncthreads();
  if (t < 32) {
    const auto virtual_thread_sum = [&](int v) {
      float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
      for (int u = v; u < kVecs; u += threads_per_row) {
        const float4 q = squares[u];
        a0 = __fadd_rn(a0, q.x);
        a1 = __fadd_rn(a1, q.y);
        a2 = __fadd_rn(a2, q.z);
        a3 = __fadd_rn(a3, q.w);
      }
      return __fadd_rn(__fadd_rn(__fadd_rn(a0, a1), a2), a3);
    };
    float sum;
    if (threads_per_row == 32) {
      sum = virtual_thread_sum(t);
    } else {
      for (int v = t; v < threads_per_row; v += 32) partials[v] = virtual_thread_sum(v);
      __syncwarp();
      for (int off = threads_per_row / 2; off >= 32; off /= 2) {
        for (int v = t; v < off; v += 32) partials[v] = __fadd_rn(partials[v], partials[v + off]);
        __syncwarp();
      }
      sum = partials[t];
    }
#pragma unroll
    for (int o = 16; o >= 1; o /= 2) sum = __fadd_rn(sum, __shfl_xor_sync(kFullMask, sum, o));
    if (t == 0) *total_slot = sum;
  }
  __syncthreads();
  return aten_rsqrtf(__fadd_rn(__fmul_rn(*total_slot, factor), eps));
}

// fp8_rowwise: this thread's slots of the row's y words as e4m3(y / s) (common/fp8_rowwise.cuh), a
// 4-byte store a slot (slot j at 512 j bytes: a warp's stores of a slot are 128 contiguous bytes).
template <typename T, bool kExact, int kSlots, bool kEven, int kVecs>
__device__ __forceinline__ void store_e4m3_rows(unsigned char* q_t, const Vec<T> (&yw)[kSlots], float s, float r,
                                                int t) {
  static_assert(sizeof(T) == 2, "the rowwise recipe of 16-bit values");
#pragma unroll
  for (int j = 0; j < kSlots; ++j)
    if (kEven || t + 128 * j < kVecs)
      *reinterpret_cast<u32*>(q_t + 512 * j) =
          e4m3x2_of_word<T, kExact>(yw[j].w[0], s, r) | (e4m3x2_of_word<T, kExact>(yw[j].w[1], s, r) << 16);
}

// The eager rows: one CTA per row at a time (aten's launch of a row: 128 virtual threads), looping
// over rows blockIdx.x, + gridDim.x, ... (the host sizes the grid to the resident CTAs). Virtual
// thread t owns vec4s t + 128j (kRowSlots slots); kSplit physical threads play it, thread
// t + 128 h holding its slots kSlots h + j, j < kSlots (kSplit = 1: thread t holds them all).
// kPrefetch: the next row's x (and residual) is loaded before the current row's statistics. Scale
// (as rne(1 + scale)), shift and gate stay in registers (kSharedOperands: in shared memory,
// HeldOperand) while their row does not change. NVFP4: a block of 16 is the vec4s of 4
// neighbouring threads.
// kFloat32: the float32 chain (operands, weight and bias fp32; see the contract above); kModulate:
// scale and shift are held and applied (always, unless kFloat32); kStreamOperands: scale, shift and
// gate are not held but loaded at each use (HeldOperand).
template <typename T, int D, int kRms, bool kResidual, int kAffine, int kQuant, bool kPrefetch, bool kSharedOperands,
          int kSplit, bool kPdl, bool kFloat32, bool kModulate, bool kStreamOperands>
__device__ __forceinline__ void eager_rows(const NormScaleShiftParams& p) {
  using O = typename OperandOf<T, kFloat32>::type;  // held operands, weight and bias
  constexpr int kVecs = D / 4;
  constexpr int kRowSlots = (kVecs + 127) / 128;
  constexpr int kSlots = kRowSlots / kSplit;
  constexpr bool kEven = kVecs % 128 == 0;
  constexpr int kBytes = 4 * static_cast<int>(sizeof(T));
  static_assert(kSplit == 1 || (kEven && kRowSlots % kSplit == 0 && !kSharedOperands),
                "split rows: D a multiple of 512, whole slots per part, operands in registers");
  using V = Vec<T>;
  const int t = threadIdx.x & 127;
  const int h = kSplit == 1 ? 0 : threadIdx.x >> 7;
  const int j0 = kSlots * h;  // this thread's first slot
  const int lane = t & 31;
  // kSplit = 1: per row parity, one barrier per row suffices; split rows hand over through
  // `handoff` with a barrier, which orders the rows' uses (aten_row_stats_cta_split).
  __shared__ WelfordState shared[kSplit == 1 ? 2 : 1][4];
  __shared__ float rms_shared[kSplit == 1 ? 2 : 1][4];
  __shared__ WelfordState handoff[kSplit == 1 ? 1 : 128];
  __shared__ float rms_handoff[kSplit == 1 ? 1 : 128];
  // kNssRmsMean: the row's squares, the partials of more than 32 virtual threads, the total.
  static_assert(kRms != kNssRmsMean || (D >= 128 && D < 8192 && kSplit == 1 && !kSharedOperands && !kFloat32),
                "the mean order: 128 <= D < 8192, one thread per aten thread, operands in registers");
  __shared__ float4 mean_squares[kRms == kNssRmsMean ? kVecs : 1];
  __shared__ float mean_partials[kRms == kNssRmsMean ? 512 : 1];
  __shared__ float mean_total;
  int mean_threads_per_row = 32;
  float mean_factor = 0.0f;
  if constexpr (kRms == kNssRmsMean) {
    mean_threads_per_row = aten_mean_threads_per_row(p.rows, kVecs);
    mean_factor = __fdiv_rn(static_cast<float>(p.rows), static_cast<float>(p.rows * D));
  }

  V xw[kSlots], rw[kSlots], nx[kSlots], nr[kSlots];
  // The float32 chain keeps its fp32 gate in registers (three fp32 rows of D = 5120 would take
  // 60 KB of shared memory) and scale and shift in shared memory where the schedule says so;
  // kStreamOperands: none is held.
  static_assert(!kStreamOperands || (kFloat32 && !kSharedOperands), "streamed operands: the float32 chain");
  constexpr bool kSharedGate = kSharedOperands && !kFloat32;
  constexpr int kHome = kStreamOperands ? kStreamed : kSharedOperands ? kHeldInShared : kHeldInRegisters;
  HeldOperand<O, kSlots, kHome> op, sh;
  HeldOperand<O, kSlots, kStreamOperands ? kStreamed : kSharedGate ? kHeldInShared : kHeldInRegisters> g;
  if constexpr (kSharedOperands) {
    // Static shared memory: at most 40 KB a CTA (5 CTAs per SM).
    static_assert(kModulate, "held in shared memory: scale and shift");
    constexpr int kHeld = kSharedGate ? 3 : 2;
    static_assert(kHeld * D * sizeof(O) <= 40960, "held operands within 40 KB of static shared memory");
    __shared__ Vec<O> held_shared[kHeld][128 * kSlots];
    op.own = held_shared[0] + t;
    sh.own = held_shared[1] + t;
    if constexpr (kSharedGate) g.own = held_shared[kSharedGate ? 2 : 0] + t;
  }
  // kStaged: x (and the residual) arrive through shared memory by cp.async, one commit group per
  // slot, and the statistics take slot j as soon as its group is in (copy_async_wait): the
  // Welford pushes of the early slots overlap the arrival of the later ones. Loaded into
  // registers, ptxas gave all 12 loads of a 6-slot residual row one scoreboard (the first product
  // waited for the last load). Faster at 6 slots, slower at 10 (docs/tuning/norm_scale_shift.md),
  // hence <= 6 slots.
  constexpr bool kStaged = !kPrefetch && kSplit == 1 && !kSharedOperands && !kRms && kSlots <= 6;
  __shared__ V staged[kStaged ? (kResidual ? 2 : 1) : 1][kStaged ? kSlots : 1][128];
  const unsigned staged_x = kStaged ? shared_address(&staged[0][0][t]) : 0u;
  const unsigned staged_r = kStaged && kResidual ? shared_address(&staged[kResidual ? 1 : 0][0][t]) : 0u;
  const auto stage_inputs = [&](const RowInputs<T>& in) {
#pragma unroll
    for (int j = 0; j < kSlots; ++j) {
      if (kEven || t + 128 * (j0 + j) < kVecs) {
        copy_async<kBytes>(staged_x + 128 * kBytes * j, in.x + 512 * j);
        if constexpr (kResidual) copy_async<kBytes>(staged_r + 128 * kBytes * j, in.r + 512 * j);
      }
      copy_async_commit();
    }
  };
  long long held_scale = -1, held_shift = -1, held_gate = -1;
  const long long step = gridDim.x;
  // (batch, token) of the row, advanced by the step: no division per row (the params above).
  const RowPosition stride = row_position(step, p.seq);
  // The first row: in the first batch (every row when B = 1) its position is (0, row) and its x
  // and residual need no division and no batch stride (parameters at the front of the constant
  // bank: the params above); the first loads wait for neither.
  RowPosition at;
  RowInputs<T> first_row;
  if (static_cast<long long>(blockIdx.x) < p.seq) {
    at = {0, static_cast<long long>(blockIdx.x)};
    const int first = 4 * t + 512 * j0;
    first_row = {static_cast<const T*>(p.x) + at.s * p.x_token_stride + first,
                 static_cast<const T*>(p.residual) + at.s * p.r_token_stride + first};
  } else {
    at = row_position(blockIdx.x, p.seq);
    first_row = row_inputs<T>(p, at, t, j0);
  }
  // Up to here the parameters only: with PDL this overlaps the previous kernel's last CTAs (whose
  // outputs may be this kernel's inputs, read after the wait). The first touch of the parameters
  // misses the constant cache; in the 512-token NVFP4 rows (one row per CTA) that and the row's
  // position took about a sixth of the warps' time before the first load (Nsight Compute source
  // counters). Those rows are issue-bound after their loads: the E2M1 codes, the block scales and
  // the statistics are what they spend (docs/tuning/norm_scale_shift.md).
  if constexpr (kPdl) pdl_wait_after(first_row.x, first_row.r);

  float inv = 0.0f, global_scale = 0.0f;
  if constexpr (kQuant == kQuantFp8) {
    const float input_scale = *p.input_scale;
    inv = p.fp8_div_full ? div_full(1.0f, input_scale) : __fdiv_rn(1.0f, input_scale);
  }
  if constexpr (is_nvfp4(kQuant)) global_scale = *p.global_scale;
  if (static_cast<long long>(blockIdx.x) < p.rows) {
    if constexpr (kStaged) stage_inputs(first_row);
    else load_inputs<T, D, kResidual>(first_row, t, j0, xw, rw);
  }
  int parity = 0, amax_parity = 0;
  for (long long row = blockIdx.x; row < p.grid_rows; row += step) {  // uniform per CTA
    if (row >= p.rows) {
      // NVFP4 scale padding row: zero scale bytes, nothing else.
      if constexpr (is_nvfp4(kQuant))
        for (int k = threadIdx.x; k < D / 16; k += 128 * kSplit)
          p.fp4_scales[nvfp4_scale_offset(row, k, D / 16)] = 0;
      continue;  // (padding rows follow every real row: no position is needed any more)
    }
    const long long following = row + step;
    const RowPosition next = advance_row_position(at, stride, p.seq);
    if constexpr (kPrefetch)
      if (following < p.rows) load_inputs<T, D, kResidual>(row_inputs<T>(p, next, t, j0), t, j0, nx, nr);
    const long long b = at.b, s = at.s;
    // The operands' loads in the order of first use: the gate (the residual sum, slot by slot),
    // then scale and shift (after the statistics); rne(1 + scale) is formed after the statistics
    // too, so no warp waits for the scale before its first Welford push (within the noise, never
    // behind: docs/tuning/norm_scale_shift.md).
    if constexpr (kResidual) load_operand<O, kSlots, kEven>(p.gate, b, s, t, j0, kVecs, 1.0f, g, held_gate);
    bool new_scale = false;
    if constexpr (kModulate) {
      new_scale = load_operand<O, kSlots, kEven>(p.scale, b, s, t, j0, kVecs, 0.0f, op, held_scale);
      if (p.shift.kind) load_operand<O, kSlots, kEven>(p.shift, b, s, t, j0, kVecs, 0.0f, sh, held_shift);
    }
    // v of slot j (the residual variant), in place of x: eager's 16-bit chain or the float32 one.
    const auto residual_sum = [&](int j) {
      if constexpr (kFloat32) xw[j] = promoted_sum<T>(xw[j], rw[j], g.get(j));
      else xw[j] = add_vec(T{}, rw[j], mul_vec(T{}, xw[j], g.get(j)));
    };

    T* const ot = kResidual ? static_cast<T*>(p.residual_out) + b * p.ro_batch_stride + s * p.ro_token_stride + 4 * t + 512 * j0 : nullptr;
    constexpr bool kLazyResidual = kResidual && kStaged;
    if constexpr (kResidual && !kLazyResidual) {
#pragma unroll
      for (int j = 0; j < kSlots; ++j) {
        if (kEven || t + 128 * (j0 + j) < kVecs) {
          // v = rne(r + rne(x * g)), both packed. Eager rounds the product to fp32 first; the
          // packed multiply rounds the exact product once, the same value: an f16 product is exact
          // in fp32 (22 significant bits, >= 2^-48). A bf16 product M * 2^E (M < 2^16) is exact in
          // fp32 unless p < 2^-126 and E <= -150; there the roundings differ only where the fp32
          // one (spacing 2^-149) lands on a bf16 midpoint (odd multiple of 2^-134) from off it,
          // |p - midpoint| <= 2^-150. As p < 2^16 * 2^E <= 2^-134, that is the midpoint 2^-134
          // with E = -150 and M = 2^16 - 1, a tie that rounds to 2^-134 and then to 0, as p
          // itself does. GPU test NormScaleShiftGpu.PackedProductsEqualTheFp32ProductRounded
          // checks every bf16 and f16 pair. Against unpacking x and g, an fp32 multiply and a
          // repack: 3 instructions per element fewer.
          residual_sum(j);
          store_word<kBytes>(ot + 512 * j, xw[j]);
        }
      }
    }

    float mean = 0.0f, rstd;
    const auto get_vec = [&](int j, float (&v)[4]) {
      if constexpr (kStaged) {
        copy_async_wait_upto<kSlots - 1>(kSlots - 1 - j);
        xw[j] = staged[0][j][t];
        if constexpr (kResidual) rw[j] = staged[kResidual ? 1 : 0][j][t];
      }
      if constexpr (kLazyResidual) {
        residual_sum(j);
        store_word<kBytes>(ot + 512 * j, xw[j]);
      }
      to_floats<T, 4>(xw[j], v);
    };
    if constexpr (kRms == kNssRmsMean) {
      rstd = aten_mean_rms_rstd_cta<T, kSlots, kVecs>(xw, t, p.eps, mean_threads_per_row, mean_factor, mean_squares,
                                                      mean_partials, &mean_total);
    } else if constexpr (kRms) {
      rstd = aten_rms_rstd_cta<T, kSlots, kSplit, kVecs>(xw, t, h, p.eps, rms_handoff, rms_shared[parity]);
    } else if constexpr (kSplit == 1) {
      const RowStats st = aten_row_stats_cta<kSlots, kEven>(get_vec, kVecs, p.eps, shared[parity]);
      mean = st.mean;
      rstd = st.rstd;
    } else {
      const RowStats st = aten_row_stats_cta_split<kSlots, kSplit>(get_vec, t, h, p.eps, handoff, shared[0]);
      mean = st.mean;
      rstd = st.rstd;
    }
    if constexpr (kSplit == 1) parity ^= 1;
    if (new_scale) one_plus<O, kSlots, kEven>(op, t, j0, kVecs);

    // This thread's first vec4 in each output (slot j at the constant offsets 512 j, 256 j bytes).
    const int first = 4 * t + 512 * j0;
    T* const yt = p.y ? static_cast<T*>(p.y) + b * p.y_batch_stride + s * p.y_token_stride + first : nullptr;
    constexpr bool kFp8Rows = kQuant == kQuantFp8 || kQuant == kQuantFp8Rowwise;
    unsigned char* const fp8_t = kFp8Rows ? p.fp8 + (b * p.q_batch_stride + s * p.q_token_stride) + first : nullptr;
    unsigned char* const fp4_t = is_nvfp4(kQuant) ? p.fp4_packed + row * (D / 2) + first / 2 : nullptr;
    // The NVFP4 scale byte of slot j (block column (t >> 2) + 32 (j0 + j)) is sf_thread[4096 * j].
    unsigned char* const sf_thread =
        is_nvfp4(kQuant)
            ? p.fp4_scales + nvfp4_scale_offset(row, (t >> 2) + 32 * j0, D / 16)
            : nullptr;
    // y of every slot as fp32, kept for the NVFP4 block scales that follow the row (the local
    // |y| maxima in amax).
    float ys[kSlots][4];
    float amax[kSlots];
    u32 row_amax = 0;  // fp8_rowwise: the |y| patterns' running maximum, two lanes a word
#pragma unroll
    for (int j = 0; j < kSlots; ++j) {
      const bool active = kEven || t + 128 * (j0 + j) < kVecs;
      amax[j] = 0.0f;
      if (active) {
        float v[4], a[4], w[4], bias[4];
        constexpr int kOBytes = 4 * static_cast<int>(sizeof(O));
        to_floats<T, 4>(xw[j], v);
        if constexpr (kAffine >= 1) to_floats<O, 4>(load_word<kOBytes, true>(static_cast<const O*>(p.weight) + first + 512 * j), w);
        if constexpr (kAffine == 2) to_floats<O, 4>(load_word<kOBytes, true>(static_cast<const O*>(p.bias) + first + 512 * j), bias);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float n = __fmul_rn(rstd, __fsub_rn(v[e], mean));
          a[e] = n;
          if constexpr (kAffine == 1) a[e] = __fmul_rn(w[e], n);
          if constexpr (kAffine == 2) a[e] = __fmaf_rn(w[e], n, bias[e]);
        }
        V out;
        if constexpr (kFloat32) {
          // The modulation in fp32 on the unrounded norm, then the chain's one rounding.
          if constexpr (kModulate) {
            float m[4];
            to_floats<float, 4>(op.get(j), m);
#pragma unroll
            for (int e = 0; e < 4; ++e) a[e] = __fmul_rn(a[e], m[e]);
            if (p.shift.kind) {
              to_floats<float, 4>(sh.get(j), m);
#pragma unroll
              for (int e = 0; e < 4; ++e) a[e] = __fadd_rn(a[e], m[e]);
            }
          }
          out = round_vec(T{}, a);
        } else {
          out = mul_vec(T{}, round_vec(T{}, a), op.get(j));
          if (p.shift.kind) out = add_vec(T{}, out, sh.get(j));
        }
        if (!is_nvfp4(kQuant) && yt) store_word<kBytes>(yt + 512 * j, out);
        float (&y)[4] = ys[j];
        to_floats<T, 4>(out, y);
        if constexpr (kQuant == kQuantFp8) {
          const u32 q = e4m3x2_rn_satfinite(__fmul_rn(y[0], inv), __fmul_rn(y[1], inv)) |
                        (e4m3x2_rn_satfinite(__fmul_rn(y[2], inv), __fmul_rn(y[3], inv)) << 16);
          *reinterpret_cast<u32*>(fp8_t + 512 * j) = q;
        }
        if constexpr (is_nvfp4(kQuant))
          amax[j] = fmaxf(fmaxf(fabsf(y[0]), fabsf(y[1])), fmaxf(fabsf(y[2]), fabsf(y[3])));
        if constexpr (kQuant == kQuantFp8Rowwise) {
          xw[j] = out;  // x is not read again: the row's y words wait there for the row's scale
          row_amax = abs_max_pairs(abs_max_pairs(row_amax, out.w[0]), out.w[1]);
        }
      }
    }
    if constexpr (kQuant == kQuantFp8Rowwise) {
      // The row's amax over the CTA (one buffer per row parity: block_max_u32), its scale, then
      // e4m3(y / s) of the held words; the division's correction where s allows it (uniform).
      __shared__ u32 amax_partials[2][32];
      const u32 amax_bits = block_max_u32(fold_pairs(row_amax), amax_partials[amax_parity]);
      amax_parity ^= 1;
      const float row_scale = fp8_rowwise_scale<T>(amax_bits), r = __frcp_rn(row_scale);
      if (t == 0) p.fp8_scale[row] = row_scale;
      if (fp8_rowwise_fast(row_scale))
        store_e4m3_rows<T, false, kSlots, kEven, kVecs>(fp8_t, xw, row_scale, r, t);
      else
        store_e4m3_rows<T, true, kSlots, kEven, kVecs>(fp8_t, xw, row_scale, r, t);
    }
    if constexpr (is_nvfp4(kQuant)) {
      // y, where asked for, in one uniform branch after the row (its stores predicated per slot
      // had cost ~15 instructions per warp when it is not).
      if (yt) {
#pragma unroll
        for (int j = 0; j < kSlots; ++j)
          if (kEven || t + 128 * (j0 + j) < kVecs) store_word<kBytes>(yt + 512 * j, round_vec(T{}, ys[j]));
      }
      // A block of 16 is the vec4s of the 4 lanes of a quad (D % 64 == 0: whole blocks, and a
      // quad's lanes are active together).
      const int quad = lane & 3;
      float out_scale[kSlots];
      nvfp4_quad_scales<kSlots>(amax, quad, global_scale, sf_thread + 4096 * quad,
                                [&](int j) { return kEven || t + 128 * (j0 + j) < kVecs; }, out_scale);
#pragma unroll
      for (int j = 0; j < kSlots; ++j) {
        if (kEven || t + 128 * (j0 + j) < kVecs) {
          float q[4];
#pragma unroll
          for (int e = 0; e < 4; ++e) q[e] = __fmul_rn(ys[j][e], out_scale[j]);
          const u32 nibbles = e2m1x4<kQuant == kQuantFp4Hardware>(q);
          *reinterpret_cast<unsigned short*>(fp4_t + 256 * j) = static_cast<unsigned short>(nibbles);
        }
      }
    }
    if (following < p.rows) {
      if constexpr (kPrefetch) {
#pragma unroll
        for (int j = 0; j < kSlots; ++j) {
          xw[j] = nx[j];
          if constexpr (kResidual) rw[j] = nr[j];
        }
      } else if constexpr (kStaged) {
        stage_inputs(row_inputs<T>(p, next, t, j0));
      } else {
        load_inputs<T, D, kResidual>(row_inputs<T>(p, next, t, j0), t, j0, xw, rw);
      }
    }
    at = next;
  }
}

// ---------------------------------------------------------------- sglang numerics

// The per-thread partials of the 16-element threads lane + 32k, summed as SGLang's CTA does.
template <int kThreads>
__device__ __forceinline__ float sglang_block_sum(float (&part)[(kThreads + 31) / 32]) {
  constexpr int kK = (kThreads + 31) / 32;
#pragma unroll
  for (int o = 16; o >= 1; o /= 2)
#pragma unroll
    for (int k = 0; k < kK; ++k) part[k] = __fadd_rn(part[k], __shfl_xor_sync(kFullMask, part[k], o));
  // Warp 0 sums the warp totals with a butterfly over 32 slots (slots >= kK hold +0); every lane
  // of it ends with lane 0's value, the shfl_down tree below.
  float slot[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) slot[i] = i < kK ? part[i < kK ? i : 0] : 0.0f;
#pragma unroll
  for (int o = 16; o >= 1; o /= 2)
#pragma unroll
    for (int i = 0; i < 16; ++i)
      if (i < o) slot[i] = __fadd_rn(slot[i], slot[i + o]);
  return slot[0];
}

template <typename T, int D, bool kResidual, int kQuant>
__device__ __forceinline__ void sglang_row(const NormScaleShiftParams& p, long long row, int lane) {
  constexpr int kThreads = D / 16;
  constexpr int kK = (kThreads + 31) / 32;
  constexpr int kBytes = 8 * static_cast<int>(sizeof(T));  // 16 bytes of bf16/fp16
  constexpr float kInvD = 1.0f / D;
  const long long b = row / p.seq;
  const long long s = row - b * p.seq;
  const RowPointers<T> rp = row_pointers<T, kResidual, kQuant>(p, b, s);
  const T* xrow = static_cast<const T*>(p.x) + b * p.x_batch_stride + s * p.x_token_stride;

  Word<kBytes> vw[kK][2];
#pragma unroll
  for (int k = 0; k < kK; ++k)
    if (lane + 32 * k < kThreads)
#pragma unroll
      for (int h = 0; h < 2; ++h) vw[k][h] = load_word<kBytes, false>(xrow + 16 * (lane + 32 * k) + 8 * h);
  if constexpr (kResidual) {
    const T* rrow = static_cast<const T*>(p.residual) + b * p.r_batch_stride + s * p.r_token_stride;
    T* orow = static_cast<T*>(p.residual_out) + b * p.ro_batch_stride + s * p.ro_token_stride;
    Word<kBytes> rw[kK][2];
#pragma unroll
    for (int k = 0; k < kK; ++k)
      if (lane + 32 * k < kThreads)
#pragma unroll
        for (int h = 0; h < 2; ++h) rw[k][h] = load_word<kBytes, false>(rrow + 16 * (lane + 32 * k) + 8 * h);
#pragma unroll
    for (int k = 0; k < kK; ++k) {
      if (lane + 32 * k < kThreads) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int c = 16 * (lane + 32 * k) + 8 * h;
          float xv[8], rv[8], g[8], v[8];
          to_floats<T, 8>(vw[k][h], xv);
          to_floats<T, 8>(rw[k][h], rv);
          operand_values<T, 8>(p.gate, rp.gate, rp.gate_scalar, c, g);
#pragma unroll
          for (int e = 0; e < 8; ++e) v[e] = round_to<T>(__fmaf_rn(xv[e], g[e], rv[e]));
          vw[k][h] = from_floats<T, 8>(v);
          store_word<kBytes>(orow + c, vw[k][h]);
        }
      }
    }
  }

  float part[kK];
#pragma unroll
  for (int k = 0; k < kK; ++k) {
    part[k] = 0.0f;
    if (lane + 32 * k < kThreads)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float v[8];
        to_floats<T, 8>(vw[k][h], v);
#pragma unroll
        for (int e = 0; e < 8; ++e) part[k] = __fadd_rn(part[k], v[e]);
      }
  }
  const float mean = __fmul_rn(sglang_block_sum<kThreads>(part), kInvD);
#pragma unroll
  for (int k = 0; k < kK; ++k) {
    part[k] = 0.0f;
    if (lane + 32 * k < kThreads)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float v[8];
        to_floats<T, 8>(vw[k][h], v);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const float d = __fsub_rn(v[e], mean);
          part[k] = __fmaf_rn(d, d, part[k]);
        }
      }
  }
  const float var = __fmul_rn(sglang_block_sum<kThreads>(part), kInvD);
  const float factor = aten_rsqrtf(__fadd_rn(var, p.eps));

  T* yrow = p.y ? static_cast<T*>(p.y) + b * p.y_batch_stride + s * p.y_token_stride : nullptr;
#pragma unroll
  for (int k = 0; k < kK; ++k) {
    if (lane + 32 * k >= kThreads) continue;
    const int t = lane + 32 * k;
    float y[16];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int c = 16 * t + 8 * h;
      float v[8], sc[8], sh[8];
      to_floats<T, 8>(vw[k][h], v);
      operand_values<T, 8>(p.scale, rp.scale, rp.scale_scalar, c, sc);
      if (p.shift.kind) operand_values<T, 8>(p.shift, rp.shift, rp.shift_scalar, c, sh);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float norm = round_to<T>(__fmul_rn(__fsub_rn(v[e], mean), factor));
        const float op = __fadd_rn(1.0f, sc[e]);
        y[8 * h + e] = round_to<T>(p.shift.kind ? __fmaf_rn(norm, op, sh[e]) : __fmul_rn(norm, op));
      }
      float yh[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) yh[e] = y[8 * h + e];
      if (yrow) store_word<kBytes>(yrow + c, from_floats<T, 8>(yh));
    }
    if constexpr (kQuant == kQuantFp8) {
      Word<16> q;
#pragma unroll
      for (int i = 0; i < 4; ++i)
        q.w[i] = e4m3x2_rn_satfinite(__fmul_rn(y[4 * i], rp.inv), __fmul_rn(y[4 * i + 1], rp.inv)) |
                 (e4m3x2_rn_satfinite(__fmul_rn(y[4 * i + 2], rp.inv), __fmul_rn(y[4 * i + 3], rp.inv)) << 16);
      store_word<16>(p.fp8 + rp.q_offset + 16 * t, q);
    }
    if constexpr (is_nvfp4(kQuant)) {
      float amax = 0.0f;
#pragma unroll
      for (int e = 0; e < 16; ++e) amax = fmaxf(amax, fabsf(y[e]));
      u32 sf8;
      const float out_scale = nvfp4_block_scale(amax, rp.global_scale, &sf8);
      Word<8> packed;
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        float q0[4], q1[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          q0[e] = __fmul_rn(y[8 * i + e], out_scale);
          q1[e] = __fmul_rn(y[8 * i + 4 + e], out_scale);
        }
        packed.w[i] = e2m1x4<kQuant == kQuantFp4Hardware>(q0) | (e2m1x4<kQuant == kQuantFp4Hardware>(q1) << 16);
      }
      store_word<8>(p.fp4_packed + row * (D / 2) + 8 * t, packed);
      p.fp4_scales[nvfp4_scale_offset(row, t, D / 16)] = static_cast<unsigned char>(sf8);
    }
  }
}

}  // namespace nss_detail

// eager numerics: a 128-thread CTA per row, persistent over rows (eager_rows); sglang numerics:
// one warp per row (grid_rows rows). kQuant: 0 none, 1 fp8, 2 nvfp4 with software E2M1,
// 3 nvfp4 with the hardware conversion, 4 fp8_rowwise (eager rows only). kAffine: 0 none, 1 weight, 2 weight + bias.
// kFloat32 / kModulate / kStreamOperands: the float32 chain (eager_rows), with or without the
// scale / shift, its operands held or streamed.
template <typename T, int D, int kRms, bool kSglang, bool kResidual, int kAffine, int kQuant, bool kPdl,
          bool kPrefetch = false, bool kSharedOperands = false, int kSplit = 1, bool kFloat32 = false,
          bool kModulate = true, bool kStreamOperands = false>
__device__ void norm_scale_shift_body(const NormScaleShiftParams& p) {
  using namespace nss_detail;
  static_assert(D % 4 == 0 && D >= 16 && D <= 8192, "D % 4 == 0, 16 <= D <= 8192");
  static_assert(!kSglang || (D % 16 == 0 && sizeof(T) == 2 && !kRms && kAffine == 0),
                "sglang numerics: LayerNorm without affine, 16-bit dtype, D % 16 == 0");
  static_assert(!is_nvfp4(kQuant) || (D % 64 == 0 && sizeof(T) == 2), "nvfp4: D % 64 == 0, 16-bit dtype");
  static_assert(kQuant != kQuantFp8Rowwise || (!kSglang && sizeof(T) == 2 && kSplit == 1),
                "fp8_rowwise: the eager rows of a 16-bit dtype, one thread per aten thread");
  static_assert(!kSharedOperands || !kSglang, "operands in shared memory: eager numerics");
  static_assert(!kFloat32 || (sizeof(T) == 2 && !kSglang && !kRms &&
                              (kQuant == kQuantNone || kQuant == kQuantFp8Rowwise) && kSplit == 1),
                "float32 chain: 16-bit x, LayerNorm, no quantized output but fp8_rowwise, one thread per aten thread");
  static_assert(kModulate || kFloat32, "only the float32 chain leaves the modulation out");
  if constexpr (kSglang) {
    if constexpr (kPdl) pdl_wait();
    const int lane = threadIdx.x & 31;
    const long long row = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
    if (row < p.rows) {
      sglang_row<T, D, kResidual, kQuant>(p, row, lane);
    } else if (row < p.grid_rows) {
      // NVFP4 scale padding row: zero scale bytes, nothing else.
      if constexpr (is_nvfp4(kQuant))
        for (int k = lane; k < D / 16; k += 32)
          p.fp4_scales[nvfp4_scale_offset(row, k, D / 16)] = 0;
    }
  } else {
    eager_rows<T, D, kRms, kResidual, kAffine, kQuant, kPrefetch, kSharedOperands, kSplit, kPdl, kFloat32, kModulate,
               kStreamOperands>(p);  // waits itself
  }
  if constexpr (kPdl) pdl_launch_dependents();
}

}  // namespace ditops

#endif  // __CUDACC__ || __CUDACC_RTC__
