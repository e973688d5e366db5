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
// * RoPE: first = a*C - c*S, second = c*C + a*S with every product and sum one fp32 operation
//   (__fmul_rn / __fadd_rn / __fsub_rn: no FMA contraction), then one RNE rounding at the store.
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

template <bool kFirst, typename A, typename B>
struct Pick {
  using type = A;
};
template <typename A, typename B>
struct Pick<false, A, B> {
  using type = B;
};

// first = a*C - c*S, second = c*C + a*S, one fp32 rounding per operation.
__device__ __forceinline__ float rope_first(float a, float c, float cs, float sn) {
  return __fsub_rn(__fmul_rn(a, cs), __fmul_rn(c, sn));
}
__device__ __forceinline__ float rope_second(float a, float c, float cs, float sn) {
  return __fadd_rn(__fmul_rn(c, cs), __fmul_rn(a, sn));
}

}  // namespace chqr_detail

// kRope: 0 none, 1 interleaved pairs, 2 split halves. kRounded: the norm is rounded to T before
// RoPE. kVectors: 4-element vectors per thread (ceil(N / 512) over q and k). kHeadDim: D.
template <typename T, int kRope, bool kRounded, int kVectors, int kHeadDim, bool kPdl>
__device__ __forceinline__ void cross_head_qknorm_rope_body(const CrossHeadQkNormRopeParams& p) {
  using namespace chqr_detail;
  static_assert(kVectors >= 1 && kVectors <= kCrossHeadMaxVectors, "1..16 vectors per thread");
  static_assert(kHeadDim % 8 == 0, "a 4-element vector lies inside one head and one half of it");
  constexpr int kHalf = kHeadDim / 2;
  // The split form's row in shared memory: the normalized values as the next step reads them.
  using Staged = typename Pick<kRounded, T, float>::type;
  __shared__ Staged staged[kRope == 2 ? kVectors * 4 * kCrossHeadThreads : 1];
  __shared__ float warp_sums[kCrossHeadThreads / 32];

  const long long block = blockIdx.x;
  const bool is_k = p.interleave ? (block & 1) != 0 : block >= p.q.rows;
  const long long row = p.interleave ? block >> 1 : (is_k ? block - p.q.rows : block);
  const CrossHeadRowParams& t = is_k ? p.k : p.q;
  const long long b = row / t.tokens, s = row - b * t.tokens;
  T* x = static_cast<T*>(t.x) + b * t.batch_stride + s * t.token_stride;
  const int vectors = t.width >> 2;
  const int tid = threadIdx.x;

  if constexpr (kPdl) pdl_wait();
  Word<8> data[kVectors];
#pragma unroll
  for (int i = 0; i < kVectors; ++i) {
    const int v = tid + i * kCrossHeadThreads;
    if (v < vectors) data[i] = load_word<8, false>(x + 4 * v);
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

  // The normalized row, per vector.
  float y[kVectors][4];
#pragma unroll
  for (int i = 0; i < kVectors; ++i) {
    const int v = tid + i * kCrossHeadThreads;
    if (v >= vectors) continue;
    Word<8> w{};
    if (t.weight) w = load_word<8, true>(static_cast<const T*>(t.weight) + 4 * v);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float n = __fmul_rn(rstd, element<T>(data[i], e));
      const float weighted = t.weight ? __fmul_rn(element<T>(w, e), n) : n;
      y[i][e] = kRounded ? round_to<T>(weighted) : weighted;
    }
  }

  if constexpr (kRope == 2) {
#pragma unroll
    for (int i = 0; i < kVectors; ++i) {
      const int v = tid + i * kCrossHeadThreads;
      if (v >= vectors) continue;
#pragma unroll
      for (int e = 0; e < 4; ++e) staged[4 * v + e] = from_float<Staged>(y[i][e]);  // exact: y is a Staged value
    }
    __syncthreads();
  }

  // The row's cos/sin (rope = none has none).
  const float* cos_row = kRope == 0 ? nullptr : t.cos + b * t.cos_strides[0] + s * t.cos_strides[1];
  const float* sin_row = kRope == 0 ? nullptr : t.sin + b * t.sin_strides[0] + s * t.sin_strides[1];
#pragma unroll
  for (int i = 0; i < kVectors; ++i) {
    const int v = tid + i * kCrossHeadThreads;
    if (v >= vectors) continue;
    float out[4];
    if constexpr (kRope == 0) {
#pragma unroll
      for (int e = 0; e < 4; ++e) out[e] = y[i][e];
    } else {
      const int n0 = 4 * v;
      const int head = n0 / kHeadDim, d0 = n0 - head * kHeadDim;
      const float* cos_head = cos_row + head * t.cos_strides[2];
      const float* sin_head = sin_row + head * t.sin_strides[2];
      if constexpr (kRope == 1) {
#pragma unroll
        for (int pair = 0; pair < 2; ++pair) {
          const int j = (d0 >> 1) + pair;
          const float cs = cos_head[j * t.cos_strides[3]], sn = sin_head[j * t.sin_strides[3]];
          const float a = y[i][2 * pair], c = y[i][2 * pair + 1];
          out[2 * pair] = rope_first(a, c, cs, sn);
          out[2 * pair + 1] = rope_second(a, c, cs, sn);
        }
      } else {
        const bool first_half = d0 < kHalf;
        const int j0 = first_half ? d0 : d0 - kHalf;
        const int partner = first_half ? n0 + kHalf : n0 - kHalf;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float cs = cos_head[(j0 + e) * t.cos_strides[3]], sn = sin_head[(j0 + e) * t.sin_strides[3]];
          const float other = to_float(staged[partner + e]);
          out[e] = first_half ? rope_first(y[i][e], other, cs, sn) : rope_second(other, y[i][e], cs, sn);
        }
      }
    }
    store_word<8>(x + 4 * v, pack<T>(out));
  }
}

}  // namespace ditops

#endif
