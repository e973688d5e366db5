// Cross-head QK RMSNorm + RoPE, in place: one block per row of q or k (include/ditops/
// cross_head_qknorm_rope.h).
//
// Numerics contract (docs/cross_head_qknorm_rope.md), rounding = rounded bit-exact against the
// eager chain torch.nn.RMSNorm(N) then the model's RoPE on CUDA with PyTorch 2.11:
// * Sum of squares in the order of PyTorch's fused RMSNorm row kernel: 128 threads (32 x 4),
//   thread t reads the 4-element vectors t, t + 128, t + 256, ... of the row and folds each
//   element into one fp32 sum with an FMA (sum = fma(x, x, sum)), in element order; each warp
//   reduces with shfl_down at offsets 16, 8, 4, 2, 1; then (w0 + w2) + (w1 + w3). mean = sum / N
//   (IEEE division), rstd = rsqrtf(mean + eps).
// * Norm: y = w * (rstd * x) (fp32, two roundings; rstd * x without a weight), rounded to the
//   activation dtype (rounding = rounded) or kept in fp32 (rounding = fp32).
// * RoPE: pairs (interleaved) first = a*C - c*S, second = c*C + a*S with every product and sum one
//   fp32 operation (__fmul_rn / __fadd_rn / __fsub_rn: no FMA contraction); halves (split, LTX-2's
//   x*cos then addcmul_) first = fma(-S, c, a*C), second = fma(S, a, c*C); then one RNE rounding.
// Each thread owns exactly the vectors PyTorch's thread of the same index reads, so the loads are
// 8 bytes wide (a warp reads 256 contiguous bytes per access). The split form needs the partner
// half of a head, which another thread holds: the normalized row goes through shared memory.
#pragma once

namespace ditops {

// PyTorch's fused RMSNorm row block: 32 x 4 threads; its reduction order depends on it.
constexpr int kCrossHeadThreads = 128;
constexpr int kCrossHeadMaxVectors = 16;  // 4-element vectors per thread: N <= 8192

// One of q, k. Plain data shared by the host op (src/ops/cross_head_qknorm_rope) and the kernel.
struct CrossHeadRowParams {
  void* x;              // T [B, S, N]: (b, s, n) at x + b*batch_stride + s*token_stride + n
  const void* weight;   // T [N], or nullptr
  const float* cos;     // (b, s, h, j) at cos + b*cos_strides[0] + s*[1] + h*[2] + j*[3]
  const float* sin;
  long long batch_stride, token_stride;
  long long cos_strides[4];
  long long sin_strides[4];
  long long tokens;     // S (> 0 when rows > 0)
  long long rows;       // B * S
  int width;            // N
};

// How the kernel reads a row's cos/sin values (the host picks it from the tables' strides):
//   kTableScalar   one 4-byte load per value, any strides;
//   kTableVector   j-contiguous tables whose rows are aligned: a vector's 2 (interleaved) or 4
//                  (split) values in one 8- or 16-byte load (LTX-2's per-head split tables);
//   kTableHoisted  tables without a head dim (stride 0) and head_dim dividing 512: thread t's
//                  vectors t + 128 i all sit at the same offset in their heads, so its values are
//                  loaded once per row, before the reduction (Wan's [1, S, 1, D/2] views).
constexpr int kTableScalar = 0, kTableVector = 1, kTableHoisted = 2;

struct CrossHeadQkNormRopeParams {
  CrossHeadRowParams q, k;
  float eps;
  // 1: q row r in block 2r and k row r in block 2r + 1 (equal row counts): when both read one
  // cos/sin table, the second read of a token's table follows the first while it is in L2.
  int interleave;
};

}  // namespace ditops

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

#include "common/memory.cuh"
#include "common/types.cuh"

namespace ditops {

namespace chqr_detail {

using namespace ditops::kernel;

template <typename T>
__device__ __forceinline__ float element(const Word<8>& w, int e) {
  const u32 word = w.w[e >> 1];
  T v;
  v.bits = static_cast<unsigned short>((e & 1) ? (word >> 16) : (word & 0xFFFFu));
  return to_float(v);
}

template <typename T>
__device__ __forceinline__ Word<8> pack(const float (&v)[4]) {
  Word<8> w;
  w.w[0] = static_cast<u32>(from_float<T>(v[0]).bits) | (static_cast<u32>(from_float<T>(v[1]).bits) << 16);
  w.w[1] = static_cast<u32>(from_float<T>(v[2]).bits) | (static_cast<u32>(from_float<T>(v[3]).bits) << 16);
  return w;
}

// Pairs (Wan, LTX-2 interleaved): first = a*C - c*S, second = c*C + a*S, one fp32 rounding per
// operation (separate eager kernels).
__device__ __forceinline__ float rope_first(float a, float c, float cs, float sn) {
  return __fsub_rn(__fmul_rn(a, cs), __fmul_rn(c, sn));
}
__device__ __forceinline__ float rope_second(float a, float c, float cs, float sn) {
  return __fadd_rn(__fmul_rn(c, cs), __fmul_rn(a, sn));
}
// Halves (LTX-2 split): x*cos, then addcmul_(-sin, c) / addcmul_(sin, a), which PyTorch computes as
// fma(tensor1, tensor2, input) when value is 1: the product a*C rounded, the other exact in the FMA.
__device__ __forceinline__ float rope_first_fma(float a, float c, float cs, float sn) {
  return __fmaf_rn(-sn, c, __fmul_rn(a, cs));
}
__device__ __forceinline__ float rope_second_fma(float a, float c, float cs, float sn) {
  return __fmaf_rn(sn, a, __fmul_rn(c, cs));
}

}  // namespace chqr_detail


namespace chqr_detail {

// kCount values of one table at (head, j0 .. j0 + kCount - 1) of a row.
template <int kCount, int kTable>
__device__ __forceinline__ void load_table(const float* row, long long head_stride, long long j_stride, int head,
                                           int j0, float (&out)[kCount]) {
  const float* at = row + head * head_stride + j0 * j_stride;
  if constexpr (kTable == kTableVector) {
    const Word<kCount * 4> w = load_word<kCount * 4, true>(at);
#pragma unroll
    for (int i = 0; i < kCount; ++i) out[i] = __uint_as_float(w.w[i]);
  } else {
#pragma unroll
    for (int i = 0; i < kCount; ++i) out[i] = __ldg(at + i * j_stride);
  }
}

__device__ __forceinline__ void prefetch_l2(const void* at) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(at));
}

}  // namespace chqr_detail

// kRope: 0 none, 1 interleaved pairs, 2 split halves. kRounded: the norm is rounded to T before
// RoPE. kVectors: 4-element vectors per thread (ceil(N / 512) over q and k). kHeadDim: D.
// kTable: kTableScalar / kTableVector / kTableHoisted (above).
template <typename T, int kRope, bool kRounded, int kVectors, int kHeadDim, int kTable, bool kPdl>
__device__ __forceinline__ void cross_head_qknorm_rope_body(const CrossHeadQkNormRopeParams& p) {
  using namespace chqr_detail;
  static_assert(kVectors >= 1 && kVectors <= kCrossHeadMaxVectors, "1..16 vectors per thread");
  static_assert(kHeadDim % 8 == 0, "a 4-element vector lies inside one head and one half of it");
  static_assert(kTable != kTableHoisted || (4 * kCrossHeadThreads) % kHeadDim == 0,
                "hoisted tables need head_dim to divide 512");
  constexpr int kHalf = kHeadDim / 2;
  constexpr int kValues = kRope == 2 ? 4 : 2;  // table values a vector reads (split: 4 j's; pairs: 2)
  // The split form's row in shared memory, one word per vector: 4 values of T (rounded) or fp32.
  using Staged = Word<kRounded ? 8 : 16>;
  __shared__ Staged staged[kRope == 2 ? kVectors * kCrossHeadThreads : 1];
  __shared__ float warp_sums[kCrossHeadThreads / 32];

  const long long block = blockIdx.x;
  const bool is_k = p.interleave ? (block & 1) != 0 : block >= p.q.rows;
  const long long row = p.interleave ? block >> 1 : (is_k ? block - p.q.rows : block);
  const CrossHeadRowParams& t = is_k ? p.k : p.q;
  const long long b = row / t.tokens, s = row - b * t.tokens;
  T* x = static_cast<T*>(t.x) + b * t.batch_stride + s * t.token_stride;
  const int vectors = t.width >> 2;
  const int tid = threadIdx.x;
  // The row's cos/sin (rope = none has none).
  const float* cos_row = kRope == 0 ? nullptr : t.cos + b * t.cos_strides[0] + s * t.cos_strides[1];
  const float* sin_row = kRope == 0 ? nullptr : t.sin + b * t.sin_strides[0] + s * t.sin_strides[1];
  // Where a vector starting at element n0 reads its table values.
  auto table_place = [](int n0, int& head, int& d0, int& j0) {
    head = n0 / kHeadDim;
    d0 = n0 - head * kHeadDim;
    j0 = kRope == 1 ? d0 >> 1 : (d0 < kHalf ? d0 : d0 - kHalf);
  };

  if constexpr (kPdl) pdl_wait();
  Word<8> data[kVectors];
#pragma unroll
  for (int i = 0; i < kVectors; ++i) {
    const int v = tid + i * kCrossHeadThreads;
    if (v < vectors) data[i] = load_word<8, false>(x + 4 * v);
  }
  float hoisted_cos[kValues], hoisted_sin[kValues];
  if constexpr (kRope != 0 && kTable == kTableHoisted) {
    int head, d0, j0;
    table_place(4 * tid, head, d0, j0);
    load_table<kValues, kTableScalar>(cos_row, 0, t.cos_strides[3], 0, j0, hoisted_cos);
    load_table<kValues, kTableScalar>(sin_row, 0, t.sin_strides[3], 0, j0, hoisted_sin);
  }
  if constexpr (kRope == 2 && kTable == kTableVector) {
    // The split form reads as many table bytes as row bytes, after the reduction's barrier: the
    // tables' 128-byte lines start for L2 now, one request per line (the first vector of 32 j's
    // of each head's first half; the second half reads the same j's).
#pragma unroll
    for (int i = 0; i < kVectors; ++i) {
      const int v = tid + i * kCrossHeadThreads;
      int head, d0, j0;
      table_place(4 * v, head, d0, j0);
      if (v < vectors && d0 < kHalf && j0 % 32 == 0) {
        prefetch_l2(cos_row + head * t.cos_strides[2] + j0);
        prefetch_l2(sin_row + head * t.sin_strides[2] + j0);
      }
    }
  }
  if constexpr (kPdl) pdl_launch_dependents();

  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < kVectors; ++i) {
    if (tid + i * kCrossHeadThreads < vectors) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float v = element<T>(data[i], e);
        sum = __fmaf_rn(v, v, sum);
      }
    }
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) sum = __fadd_rn(sum, __shfl_down_sync(0xffffffffu, sum, offset));
  if ((tid & 31) == 0) warp_sums[tid >> 5] = sum;
  __syncthreads();
  const float total = __fadd_rn(__fadd_rn(warp_sums[0], warp_sums[2]), __fadd_rn(warp_sums[1], warp_sums[3]));
  const float rstd = rsqrtf(__fadd_rn(__fdiv_rn(total, static_cast<float>(t.width)), p.eps));

  // y = w * (rstd * x), rounded to T or kept in fp32, for vector i.
  auto normalize = [&](int i, int v, float (&y)[4]) {
    Word<8> w{};
    if (t.weight) w = load_word<8, true>(static_cast<const T*>(t.weight) + 4 * v);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float n = __fmul_rn(rstd, element<T>(data[i], e));
      const float weighted = t.weight ? __fmul_rn(element<T>(w, e), n) : n;
      y[e] = kRounded ? round_to<T>(weighted) : weighted;
    }
  };

  if constexpr (kRope != 2) {
    // none / interleaved: a vector holds whole pairs; normalize, rotate and store it at once.
#pragma unroll
    for (int i = 0; i < kVectors; ++i) {
      const int v = tid + i * kCrossHeadThreads;
      if (v >= vectors) continue;
      float y[4];
      normalize(i, v, y);
      float out[4] = {y[0], y[1], y[2], y[3]};
      if constexpr (kRope == 1) {
        float cs[2], sn[2];
        if constexpr (kTable == kTableHoisted) {
          cs[0] = hoisted_cos[0], cs[1] = hoisted_cos[1], sn[0] = hoisted_sin[0], sn[1] = hoisted_sin[1];
        } else {
          int head, d0, j0;
          table_place(4 * v, head, d0, j0);
          load_table<2, kTable>(cos_row, t.cos_strides[2], t.cos_strides[3], head, j0, cs);
          load_table<2, kTable>(sin_row, t.sin_strides[2], t.sin_strides[3], head, j0, sn);
        }
#pragma unroll
        for (int pair = 0; pair < 2; ++pair) {
          out[2 * pair] = rope_first(y[2 * pair], y[2 * pair + 1], cs[pair], sn[pair]);
          out[2 * pair + 1] = rope_second(y[2 * pair], y[2 * pair + 1], cs[pair], sn[pair]);
        }
      }
      store_word<8>(x + 4 * v, pack<T>(out));
    }
  } else {
    // split: the other half of each head belongs to another thread; stage the row first.
    float y[kVectors][4];
#pragma unroll
    for (int i = 0; i < kVectors; ++i) {
      const int v = tid + i * kCrossHeadThreads;
      if (v >= vectors) continue;
      normalize(i, v, y[i]);
      if constexpr (kRounded) {
        staged[v] = pack<T>(y[i]);  // exact: y is a T value
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) staged[v].w[e] = __float_as_uint(y[i][e]);
      }
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kVectors; ++i) {
      const int v = tid + i * kCrossHeadThreads;
      if (v >= vectors) continue;
      int head, d0, j0;
      table_place(4 * v, head, d0, j0);
      float cs[4], sn[4];
      if constexpr (kTable == kTableHoisted) {
#pragma unroll
        for (int e = 0; e < 4; ++e) cs[e] = hoisted_cos[e], sn[e] = hoisted_sin[e];
      } else {
        load_table<4, kTable>(cos_row, t.cos_strides[2], t.cos_strides[3], head, j0, cs);
        load_table<4, kTable>(sin_row, t.sin_strides[2], t.sin_strides[3], head, j0, sn);
      }
      const bool first_half = d0 < kHalf;
      const Staged other_word = staged[first_half ? v + kHalf / 4 : v - kHalf / 4];
      float out[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float other;
        if constexpr (kRounded) other = element<T>(other_word, e);
        else other = __uint_as_float(other_word.w[e]);
        out[e] = first_half ? rope_first_fma(y[i][e], other, cs[e], sn[e])
                            : rope_second_fma(other, y[i][e], cs[e], sn[e]);
      }
      store_word<8>(x + 4 * v, pack<T>(out));
    }
  }
}

}  // namespace ditops

#endif
