// FP8 linear for decode-sized token counts (1 <= M <= 16), per-tensor static scales:
//
//   out[m, n] = bf16(acc[m, n] * (x_scale * w_scale) (+ bias[n])),  acc = sum_k xq[m, k] * w[n, k]
//
// Numerics contract (docs/fp8_linear.md):
// * x is e4m3, or bf16/f16 quantized here exactly as fp8_static_quant does (common/fp8.cuh:
//   inv = fp8_inverse<kDivFull>(x_scale), one mul.rn, cvt.rn.satfinite.e4m3), so both forms of
//   x give the same bytes for the same quantized values.
// * Every product of two e4m3 values is exact in fp32 (4 + 4 significant bits); acc is an fp32
//   sum whose order is fixed by the kernel (below), so a call gives the same bits on every run.
//   No atomics.
// * Epilogue in fp32: scale = x_scale * w_scale (one mul.rn, on the device: a graph replay reads
//   new scales), y = acc * scale (mul.rn), y + float(bias[n]) (add.rn), one RNE rounding to bf16.
// * Not bit-exact against cuBLASLt (torch._scaled_mm), whose summation order differs: the
//   contract is `close` (within 1 bf16 ulp plus the fp32 accumulation bound of an fp64 result).
//
// Two kernels (the host picks by M, docs/fp8_linear.md):
// * fp8_linear_gemv_body, M = 1 on CUDA cores: 8 warps per block, kRowsPerWarp output rows per
//   warp. The block stages up to kFp8GemvChunk quantized x values as fp32 in shared memory (32 KB,
//   static: under sm_120a's 99 KB and the 48 KB static limit), then each lane streams 16-byte
//   weight words (kFp8GemvUnroll per row in flight, L2 evict-first, not kept in L1), expands them
//   to fp32 and accumulates 16 FMAs per word. Order: per lane, its words in increasing k, the 16
//   elements of a word in order; then a 5-step xor-shuffle tree; chunks continue the same lane
//   sums.
// * fp8_linear_mma_body, M = 2..16 (and any M <= 8 * kAtoms) on tensor cores, swap-AB: the
//   weight rows are the MMA's M side (mma.sync.m16n8k32 e4m3, fp32 accumulators) and the tokens
//   its N side (one n8 atom per 8 tokens), so 16 weight rows x up to 16 tokens per block. The 4
//   warps of a block split K: warp w takes the 64-wide k chunks w, w + 4, ...; kFp8MmaUnroll
//   chunks are loaded before any is multiplied. The 4 warps' accumulators are summed through
//   shared memory in warp order 0..3, so the result is deterministic.
//
// Register-direct operands, no shared-memory tiles: thread (g = lane / 4, t = lane % 4) loads the
// 16 bytes at k0 + 16 t of weight rows g and g + 8 and of token g. The m16n8k32 fragments want
// k = 4t..4t+3 and 16+4t..16+4t+3 from that thread in A (rows g, g+8) and B (token g) alike, so
// feeding bytes 0-7 of the word to one MMA and bytes 8-15 to a second permutes k identically in
// A and B: the two MMAs cover the 64 k of the chunk exactly once. Every byte a warp loads is used.
//
// Requirements (checked on the host): K % 16 == 0; x, w 16-byte aligned; out, bias 2-byte.
#pragma once

#include "common/fast_divide.h"  // DITOPS_HOST_DEVICE

namespace ditops {

struct Fp8LinearParams {
  const void* x;                // [M, K] row-major: e4m3, or bf16/f16 quantized in the kernel
  const float* x_scale;         // one fp32
  const unsigned char* w;       // e4m3 [N, K] row-major
  const float* w_scale;         // one fp32
  const unsigned short* bias;   // bf16 [N] (kBias) or null
  unsigned short* out;          // bf16 [M, N] row-major
  int m, n, k;
};

constexpr int kFp8GemvWarps = 8;
constexpr int kFp8GemvUnroll = 4;     // 16-byte weight words per row per lane in flight (C2: >= 4)
constexpr int kFp8GemvChunk = 8192;   // x values staged per pass: 32 KB of fp32
constexpr int kFp8MmaWarps = 4;
constexpr int kFp8MmaRows = 16;       // weight rows per block (one m16 tile)
constexpr int kFp8MmaUnroll = 4;      // 64-wide k chunks per warp in flight (2 x 16 B of weights each)

// Static shared memory per block: the GEMV's staged x, the MMA kernel's cross-warp partial sums.
static_assert(kFp8GemvChunk * 4 <= 48 * 1024, "GEMV staging above the 48 KB static limit (sm_120a: 99 KB per block)");
static_assert(kFp8MmaWarps * 2 * 4 * 32 * 4 <= 48 * 1024, "MMA partial sums above the 48 KB static limit");

DITOPS_HOST_DEVICE constexpr int fp8_gemv_rows_per_block(int rows_per_warp) { return kFp8GemvWarps * rows_per_warp; }

}  // namespace ditops

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

#include "common/fp8.cuh"
#include "common/memory.cuh"
#include "common/types.cuh"

namespace ditops {

namespace fp8l_detail {

using namespace ditops::kernel;

template <typename T>
struct Input;
template <>
struct Input<e4m3> {
  static constexpr bool kQuantize = false;
};
template <>
struct Input<bf16> {
  static constexpr bool kQuantize = true;
};
template <>
struct Input<f16> {
  static constexpr bool kQuantize = true;
};

// 16 consecutive x values of one token row as loaded (16 bytes of e4m3, or 32 bytes of 16-bit
// values), and as the four e4m3 words an MMA B fragment takes.
// A piece past K or of a token past M is zero bytes, not a quantized zero (which a scale of 0
// would turn into NaN and spread into the real tokens' sums through the K tail).
template <typename T>
struct XPiece {
  static constexpr int kWords = Input<T>::kQuantize ? 2 : 1;
  Word<16> raw[kWords];
  bool present;

  __device__ __forceinline__ void load(const T* src) {
    present = true;
#pragma unroll
    for (int i = 0; i < kWords; ++i) raw[i] = load_word<16, true>(src + 8 * i);
  }
  __device__ __forceinline__ void zero() {
    present = false;
#pragma unroll
    for (int i = 0; i < kWords; ++i) raw[i] = Word<16>{{0u, 0u, 0u, 0u}};
  }
  __device__ __forceinline__ void e4m3_words(float inv, u32 (&q)[4]) const {
    if (!present) {
#pragma unroll
      for (int i = 0; i < 4; ++i) q[i] = 0u;
      return;
    }
    if constexpr (Input<T>::kQuantize) {
      e4m3x8_scaled<T>(raw[0], inv, &q[0], &q[1]);
      e4m3x8_scaled<T>(raw[1], inv, &q[2], &q[3]);
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i) q[i] = raw[0].w[i];
    }
  }
};

// d += A (16 x 32, rows of weights) * B (32 x 8, tokens), e4m3 in, fp32 accumulators.
__device__ __forceinline__ void mma_e4m3_m16n8k32(float (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ float read_scale(const float* p) {
  float s;
  asm("ld.global.nc.f32 %0, [%1];" : "=f"(s) : "l"(p));
  return s;
}

// The epilogue of one output element (see the header comment).
template <bool kBias>
__device__ __forceinline__ unsigned short finish(float acc, float scale, const Fp8LinearParams& p, int n) {
  float y = __fmul_rn(acc, scale);
  if constexpr (kBias) {
    bf16 b;
    b.bits = p.bias[n];
    y = __fadd_rn(y, to_float(b));
  }
  return from_float<bf16>(y).bits;
}

// Eight x values from k (k % 8 == 0) as the fp32 values of their e4m3 codes.
template <typename T>
__device__ __forceinline__ void stage8(const T* src, float inv, float* dst) {
  u32 lo, hi;
  if constexpr (Input<T>::kQuantize) {
    e4m3x8_scaled<T>(load_word<16, true>(src), inv, &lo, &hi);
  } else {
    const Word<8> w = load_word<8, true>(src);
    lo = w.w[0];
    hi = w.w[1];
  }
  float f[4];
  e4m3x4_to_float(lo, f);
#pragma unroll
  for (int i = 0; i < 4; ++i) dst[i] = f[i];
  e4m3x4_to_float(hi, f);
#pragma unroll
  for (int i = 0; i < 4; ++i) dst[4 + i] = f[i];
}

// acc += the 16 e4m3 weights of `w` times x[0..15], in element order.
__device__ __forceinline__ float dot16(const Word<16>& w, const float* x, float acc) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float f[4];
    e4m3x4_to_float(w.w[i], f);
#pragma unroll
    for (int j = 0; j < 4; ++j) acc = __fmaf_rn(f[j], x[4 * i + j], acc);
  }
  return acc;
}

}  // namespace fp8l_detail

// M = 1. T: the x element type (kernel::e4m3, bf16 or f16); kDivFull: the reciprocal of a 16-bit
// x's quantization; kRowsPerWarp: 1 or 2; kBias; kPdl: griddepcontrol.wait before the first read.
template <typename T, bool kDivFull, int kRowsPerWarp, bool kBias, bool kPdl>
__device__ void fp8_linear_gemv_body(const Fp8LinearParams& p) {
  using namespace fp8l_detail;
  __shared__ __align__(16) float xs[kFp8GemvChunk];
  if constexpr (kPdl) pdl_wait();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const T* x = static_cast<const T*>(p.x);
  const float inv = Input<T>::kQuantize ? fp8_inverse<kDivFull>(p.x_scale) : 0.0f;
  const u64 policy = l2_evict_first_policy();
  const int row0 = (blockIdx.x * kFp8GemvWarps + warp) * kRowsPerWarp;
  const unsigned char* rows[kRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r)  // a row past N reads row N-1 and is not stored
    rows[r] = p.w + static_cast<long long>(min(row0 + r, p.n - 1)) * p.k;
  float acc[kRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) acc[r] = 0.0f;

  for (int kc = 0; kc < p.k; kc += kFp8GemvChunk) {
    const int len = min(kFp8GemvChunk, p.k - kc);
    if (kc > 0) __syncthreads();  // every warp is done with the previous chunk
    for (int i = threadIdx.x * 8; i < len; i += kFp8GemvWarps * 32 * 8) stage8<T>(x + kc + i, inv, xs + i);
    __syncthreads();
    for (int base = lane * 16; base < len; base += 32 * 16 * kFp8GemvUnroll) {
      Word<16> w[kRowsPerWarp][kFp8GemvUnroll];
#pragma unroll
      for (int u = 0; u < kFp8GemvUnroll; ++u)
#pragma unroll
        for (int r = 0; r < kRowsPerWarp; ++r)
          if (base + u * 512 < len) w[r][u] = load_word_l2_hint(rows[r] + kc + base + u * 512, policy);
#pragma unroll
      for (int u = 0; u < kFp8GemvUnroll; ++u) {
        if (base + u * 512 >= len) break;
        float xv[16];
        const float4* src = reinterpret_cast<const float4*>(xs + base + u * 512);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float4 v = src[i];
          xv[4 * i] = v.x;
          xv[4 * i + 1] = v.y;
          xv[4 * i + 2] = v.z;
          xv[4 * i + 3] = v.w;
        }
#pragma unroll
        for (int r = 0; r < kRowsPerWarp; ++r) acc[r] = dot16(w[r][u], xv, acc[r]);
      }
    }
  }
  if constexpr (kPdl) pdl_launch_dependents();

  const float scale = __fmul_rn(read_scale(p.x_scale), read_scale(p.w_scale));
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    float v = acc[r];
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, offset));
    if (lane == 0 && row0 + r < p.n) p.out[row0 + r] = finish<kBias>(v, scale, p, row0 + r);
  }
}

// M <= 8 * kAtoms (kAtoms 1 or 2). Template parameters as the GEMV's.
template <typename T, bool kDivFull, int kAtoms, bool kBias, bool kPdl>
__device__ void fp8_linear_mma_body(const Fp8LinearParams& p) {
  using namespace fp8l_detail;
  static_assert(kAtoms == 1 || kAtoms == 2, "8 or 16 tokens per block");
  __shared__ float partial[kFp8MmaWarps][kAtoms][4][32];
  if constexpr (kPdl) pdl_wait();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int n0 = blockIdx.x * kFp8MmaRows;
  // Rows past N read row N-1 (valid memory) and are not stored.
  const unsigned char* row_a = p.w + static_cast<long long>(min(n0 + g, p.n - 1)) * p.k;
  const unsigned char* row_b = p.w + static_cast<long long>(min(n0 + g + 8, p.n - 1)) * p.k;
  const T* x = static_cast<const T*>(p.x);
  const float inv = Input<T>::kQuantize ? fp8_inverse<kDivFull>(p.x_scale) : 0.0f;
  const u64 policy = l2_evict_first_policy();
  const int chunks = (p.k + 63) / 64;

  float acc[kAtoms][4];
#pragma unroll
  for (int j = 0; j < kAtoms; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[j][i] = 0.0f;

  for (int c0 = warp; c0 < chunks; c0 += kFp8MmaWarps * kFp8MmaUnroll) {
    Word<16> wa[kFp8MmaUnroll], wb[kFp8MmaUnroll];
    XPiece<T> xp[kFp8MmaUnroll][kAtoms];
#pragma unroll
    for (int u = 0; u < kFp8MmaUnroll; ++u) {
      const int c = c0 + u * kFp8MmaWarps;
      const int k = c * 64 + t * 16;
      const bool in = c < chunks && k < p.k;  // K % 16 == 0: a 16-byte word is all in or all out
      if (in) {
        wa[u] = load_word_l2_hint(row_a + k, policy);
        wb[u] = load_word_l2_hint(row_b + k, policy);
      } else {
        wa[u] = wb[u] = Word<16>{{0u, 0u, 0u, 0u}};
      }
#pragma unroll
      for (int j = 0; j < kAtoms; ++j) {
        const int m = 8 * j + g;
        if (in && m < p.m)
          xp[u][j].load(x + static_cast<long long>(m) * p.k + k);
        else
          xp[u][j].zero();
      }
    }
#pragma unroll
    for (int u = 0; u < kFp8MmaUnroll; ++u) {
      if (c0 + u * kFp8MmaWarps >= chunks) break;  // warp-uniform
#pragma unroll
      for (int j = 0; j < kAtoms; ++j) {
        u32 q[4];
        xp[u][j].e4m3_words(inv, q);
        mma_e4m3_m16n8k32(acc[j], wa[u].w[0], wb[u].w[0], wa[u].w[1], wb[u].w[1], q[0], q[1]);
        mma_e4m3_m16n8k32(acc[j], wa[u].w[2], wb[u].w[2], wa[u].w[3], wb[u].w[3], q[2], q[3]);
      }
    }
  }
  if constexpr (kPdl) pdl_launch_dependents();

#pragma unroll
  for (int j = 0; j < kAtoms; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) partial[warp][j][i][lane] = acc[j][i];
  __syncthreads();
  // Warp w finishes accumulator slot i = w of every lane: slot i is weight row g (+8 for i >= 2)
  // and token 2t (+1 for odd i) of each atom.
  const float scale = __fmul_rn(read_scale(p.x_scale), read_scale(p.w_scale));
  const int i = warp;
  const int n = n0 + g + (i >= 2 ? 8 : 0);
#pragma unroll
  for (int j = 0; j < kAtoms; ++j) {
    float sum = partial[0][j][i][lane];
#pragma unroll
    for (int w = 1; w < kFp8MmaWarps; ++w) sum = __fadd_rn(sum, partial[w][j][i][lane]);
    const int m = 8 * j + 2 * t + (i & 1);
    if (n < p.n && m < p.m) p.out[static_cast<long long>(m) * p.n + n] = finish<kBias>(sum, scale, p, n);
  }
}

}  // namespace ditops

#endif  // __CUDACC__ || __CUDACC_RTC__
