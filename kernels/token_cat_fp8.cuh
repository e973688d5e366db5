// FLUX.2 single-block token concat + static FP8 quantization, without the bf16 concatenation:
//
//   out[r, c] = e4m3(clamp(float(c < Da ? attn[r, c] : mlp[r, c - Da]) * inv, -448, 448))
//
// Numerics contract (docs/token_cat_fp8.md):
// * inv = 1 / input_scale, read on the device (common/types.cuh fp8_inverse): IEEE division
//   (kDivFull false; oracle: eager `(torch.cat([attn, mlp], -1).float() * (1.0 / scale))
//   .clamp(-448, 448).to(torch.float8_e4m3fn)`) or div.full.f32 (kDivFull; oracle: SGLang's
//   Triton static_quant_fp8 / try_flux2_token_cat_fp8).
// * Per element (common/fp8.cuh, shared with fp8_static_quant and fp8_linear): widening of
//   bf16/f16 is exact; one __fmul_rn (no FMA to contract: a single product);
//   e4m3x2_rn_satfinite is the clamp + RNE conversion in one: finite values and infinities
//   beyond +-448 end at +-448, as clamp then cast does. A NaN product is the GPU's
//   canonical NaN (positive) and converts to 0x7F, which is also what eager produces on CUDA.
// * No reduction: every element is independent, so the vector and scalar paths give identical
//   bytes.
//
// Layout: attn [rows, Da], mlp [rows, Dm], out [rows, Da + Dm], all contiguous. A flat
// grid-stride loop over units of kElems output bytes: 16 on the vector path (Da % 16 == 0,
// Dm % 16 == 0, every pointer 16-byte aligned: a unit lies inside one source row and is two
// 16-byte loads of 2-byte elements and one 16-byte store), 1 on the scalar path (any Da, Dm,
// any 2-byte-aligned pointers). kUnroll units per thread per iteration, all loads issued before
// any conversion. Indices are 32-bit below 2^31 units (the row found by a multiply and a shift,
// common/fast_divide.h), 64-bit otherwise (kIndex64).
#pragma once

#include "common/fast_divide.h"

namespace ditops {

// Launch parameters. Plain data, shared by the host op (src/ops/token_cat_fp8) and the kernel.
// Sizes count units (kElems output elements each).
struct TokenCatFp8Params {
  const void* attn;          // T [rows, Da]
  const void* mlp;           // T [rows, Dm]
  const float* input_scale;  // one fp32 value
  void* out;                 // e4m3 [rows, Da + Dm]
  // 32-bit kernel (units < 2^31): the same sizes and the row divisor.
  unsigned units32;
  unsigned row_units32;   // (Da + Dm) / kElems
  unsigned attn_units32;  // Da / kElems
  FastDivisor row_units_divisor;
  // 64-bit kernel.
  long long units;        // rows * (Da + Dm) / kElems
  long long row_units;
  long long attn_units;
};

// Units per thread per iteration (the host sizes the grid with it): 4 on the vector path (8
// loads of 16 bytes in flight), 8 on the scalar one. Not tuned (no measurement yet).
DITOPS_HOST_DEVICE constexpr int token_cat_fp8_unroll(bool vector) { return vector ? 4 : 8; }

}  // namespace ditops

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

#include "common/fp8.cuh"
#include "common/memory.cuh"
#include "common/types.cuh"

namespace ditops {

namespace tcf_detail {

using namespace ditops::kernel;

template <bool kIndex64>
struct Sizes;
template <>
struct Sizes<false> {
  using Index = unsigned;
  Index units, row_units, attn_units;
  FastDivisor divisor;
  __device__ explicit Sizes(const TokenCatFp8Params& p)
      : units(p.units32), row_units(p.row_units32), attn_units(p.attn_units32), divisor(p.row_units_divisor) {}
  __device__ Index row_of(Index unit) const { return fast_quotient(unit, divisor); }
};
template <>
struct Sizes<true> {
  using Index = unsigned long long;
  Index units, row_units, attn_units;
  __device__ explicit Sizes(const TokenCatFp8Params& p)
      : units(p.units), row_units(p.row_units), attn_units(p.attn_units) {}
  __device__ Index row_of(Index unit) const { return unit / row_units; }
};

// The source of an output unit: its attn or mlp unit, as an element offset from that tensor.
template <typename T, int kElems, typename S>
__device__ __forceinline__ const T* source(const TokenCatFp8Params& p, const S& s, typename S::Index unit) {
  using Index = typename S::Index;
  const Index row = s.row_of(unit);
  const Index col = unit - row * s.row_units;
  const unsigned long long u = col < s.attn_units ? static_cast<unsigned long long>(row) * s.attn_units + col
                                                  : static_cast<unsigned long long>(row) * (s.row_units - s.attn_units) +
                                                        (col - s.attn_units);
  return static_cast<const T*>(col < s.attn_units ? p.attn : p.mlp) + u * kElems;
}

// 16 outputs from two 16-byte words of 8 elements each (lo: elements 0-7, hi: 8-15).
template <typename T>
__device__ __forceinline__ Word<16> quantize16(const Word<16>& lo, const Word<16>& hi, float inv) {
  Word<16> out;
  e4m3x8_scaled<T>(lo, inv, &out.w[0], &out.w[1]);
  e4m3x8_scaled<T>(hi, inv, &out.w[2], &out.w[3]);
  return out;
}

template <typename T, bool kIndex64, int kUnroll>
__device__ __forceinline__ void vector_units(const TokenCatFp8Params& p, float inv) {
  using S = Sizes<kIndex64>;
  using Index = typename S::Index;
  const S s(p);
  const Index threads = static_cast<Index>(gridDim.x) * blockDim.x;
  unsigned char* out = static_cast<unsigned char*>(p.out);
  for (Index base = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; base < s.units;
       base += threads * kUnroll) {
    Word<16> lo[kUnroll], hi[kUnroll];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const Index unit = base + k * threads;
      if (unit < s.units) {
        const T* src = source<T, 16>(p, s, unit);
        lo[k] = load_word<16, true>(src);
        hi[k] = load_word<16, true>(src + 8);
      }
    }
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const Index unit = base + k * threads;
      if (unit < s.units) store_word<16>(out + static_cast<unsigned long long>(unit) * 16, quantize16<T>(lo[k], hi[k], inv));
    }
  }
}

template <typename T, bool kIndex64, int kUnroll>
__device__ __forceinline__ void scalar_units(const TokenCatFp8Params& p, float inv) {
  using S = Sizes<kIndex64>;
  using Index = typename S::Index;
  const S s(p);
  const Index threads = static_cast<Index>(gridDim.x) * blockDim.x;
  unsigned char* out = static_cast<unsigned char*>(p.out);
  for (Index base = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; base < s.units;
       base += threads * kUnroll) {
    T v[kUnroll];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const Index unit = base + k * threads;
      if (unit < s.units) v[k] = *source<T, 1>(p, s, unit);
    }
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const Index unit = base + k * threads;
      if (unit < s.units)
        out[static_cast<unsigned long long>(unit)] =
            static_cast<unsigned char>(e4m3x2_rn_satfinite(__fmul_rn(to_float(v[k]), inv), 0.0f));
    }
  }
}

}  // namespace tcf_detail

// T: the input element type (kernel::bf16 or kernel::f16). kVector: 16-byte units (see the header comment). kDivFull:
// the reciprocal. kIndex64: 64-bit unit indices. kPdl: griddepcontrol.wait before the first read
// (the scale included), launch_dependents after the last store.
template <typename T, bool kVector, bool kDivFull, bool kIndex64, bool kPdl>
__device__ void token_cat_fp8_body(const TokenCatFp8Params& p) {
  using namespace tcf_detail;
  static_assert(sizeof(T) == 2, "bf16 or f16 inputs");
  if constexpr (kPdl) pdl_wait();
  const float inv = fp8_inverse<kDivFull>(p.input_scale);
  if constexpr (kVector)
    vector_units<T, kIndex64, token_cat_fp8_unroll(true)>(p, inv);
  else
    scalar_units<T, kIndex64, token_cat_fp8_unroll(false)>(p, inv);
  if constexpr (kPdl) pdl_launch_dependents();
}

// For the GPU test: the reciprocal the kernel of kDivFull uses, written to *(float*)p.out (one
// thread), so the test can state the div_full oracle with the device's own div.full.f32 result.
template <bool kDivFull>
__device__ void token_cat_fp8_inverse_probe(const TokenCatFp8Params& p) {
  if (blockIdx.x == 0 && threadIdx.x == 0) *static_cast<float*>(p.out) = kernel::fp8_inverse<kDivFull>(p.input_scale);
}

}  // namespace ditops

#endif  // __CUDACC__ || __CUDACC_RTC__
