// Causal Conv3D cat + pad (the Cosmos3 VAE): one pass of
//
//   out = F.pad(torch.cat([cache, x], 2), (wl, wr, ht, hb, dl - ct, dr))
//
// Numerics contract: a pure copy plus zero fill. Every output element is either the bits of one
// source element (moved as raw words, never through a floating-point register) or +0; so the op
// is bit-exact against cat + F.pad for every dtype, -0 and NaN payloads included.
//
// Layout-free by construction: the host folds NCTHW and channels-last-3d into one row model
// (docs/causal_conv3d_cat_pad.md). The output is `rows` dense rows of `row_elems` elements: one
// per (n, t, h) of the output, n = b * C + c (NCTHW, rows of W_out elements) or n = b
// (channels-last, rows of W_out * C elements). A row is either all zeros (a padding frame or
// padding row) or [head zeros | `run` elements copied from one contiguous source row | zeros].
// The source row of output row (n, t, h), with st = t - frame_offset and ih = h - row_offset:
//   st <  cache_frames: cache + ((n * cache_frames + st) * src_rows + ih) * run
//   st >= cache_frames: x + ((n * x_frames + st - cache_frames) * src_rows + ih) * run
// valid when 0 <= st < cache_frames + x_frames and 0 <= ih < src_rows.
//
// Work unit: one 16-byte-aligned window of output memory that meets one row (`row_windows` per
// row, an upper bound over the rows' 16-byte phases; windows past a row's end do nothing). A
// window inside its row is one 16-byte store; its source is one 16-byte load when the source is
// in the same phase, otherwise the two aligned 16-byte granules covering it, shifted together in
// registers (never scalar loads). A granule is loaded only when it holds a byte of the source row,
// so no load leaves the source tensor's pages. Windows that a row boundary cuts (row head and
// tail off 16 bytes) are written element by element, only the row's own elements. One unit per
// thread, the grid covering every unit once (32-bit indices); the 64-bit kernel (2^31 units or
// more) loops over a resident grid.
#pragma once

#include "common/fast_divide.h"  // also DITOPS_HOST_DEVICE

namespace ditops {

// Launch parameters: plain data, built by the host (src/ops/causal_conv3d_cat_pad/) and passed
// by value as the kernel's __grid_constant__ argument.
struct CausalConv3dCatPadParams {
  const void* x;
  const void* cache;  // NULL when there is no cache (cache_frames = 0)
  void* out;
  // 32-bit kernel: units32 = units (< 2^31) and the divisors of the unit decomposition.
  unsigned units32;
  FastDivisor row_windows_divisor;
  FastDivisor rows_out_divisor;    // H_out
  FastDivisor frames_out_divisor;  // T_out
  long long units;        // rows * row_windows
  long long row_windows;  // 16-byte windows per output row (upper bound)
  long long rows_out;     // H_out
  long long frames_out;   // T_out
  long long row_elems;    // elements per output row: W_out (NCTHW) or W_out * C (channels-last)
  long long head;         // zeros before the source run: wl (NCTHW) or wl * C
  long long run;          // source elements per row: W (NCTHW) or W * C
  long long src_rows;     // H
  long long x_frames;     // T
  long long cache_frames;  // ct (0 without a cache)
  long long frame_offset;  // dl - ct: output frames before the first cache frame
  long long row_offset;    // ht
};

// The 32-bit fields: from 1 to 2^31 - 1 units (every divisor then below 2^31).
DITOPS_HOST_DEVICE
inline void ccp_set_divisors(CausalConv3dCatPadParams& p) {
  if (p.units >= 1 && p.units <= 0x7fffffff) {
    p.units32 = static_cast<unsigned>(p.units);
    p.row_windows_divisor = fast_divisor(static_cast<unsigned>(p.row_windows));
    p.rows_out_divisor = fast_divisor(static_cast<unsigned>(p.rows_out));
    p.frames_out_divisor = fast_divisor(static_cast<unsigned>(p.frames_out));
  }
}

}  // namespace ditops

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

#include "common/memory.cuh"
#include "common/types.cuh"

namespace ditops {

namespace ccp_detail {

using namespace ditops::kernel;

// The 4-byte word of a pair of words (lo, hi) starting `half` 2-byte halves into lo (0 or 1).
__device__ __forceinline__ u32 shifted_word(u32 lo, u32 hi, bool half) { return half ? (lo >> 16) | (hi << 16) : lo; }

// Word j + k of w (j in 0..4 unrolled, k in 0..3 known only at run time) by selects: no dynamic
// register indexing (which would put w in local memory).
__device__ __forceinline__ u32 word_at(const u32 (&w)[8], int j, int k) {
  return k == 0 ? w[j] : k == 1 ? w[j + 1] : k == 2 ? w[j + 2] : w[j + 3];
}

// The 16 output bytes whose first element is source element q of the row at `src` (q may be
// negative or past the run): the source elements in [0, run) as their bits, the others zero.
// kBytes: the element size (2 or 4).
template <int kBytes>
__device__ __forceinline__ Word<16> source_window(const unsigned char* src, long long q, long long run) {
  constexpr int kElems = 16 / kBytes;
  // Elements [lo, hi) of the window come from the source.
  const long long lo = q < 0 ? -q : 0;
  const long long hi = run - q < kElems ? run - q : kElems;
  Word<16> out;
#pragma unroll
  for (int i = 0; i < 4; ++i) out.w[i] = 0;
  if (hi <= lo) return out;
  const unsigned char* a = src + q * kBytes;  // may lie outside the row: only granules it meets are read
  const int phase = static_cast<int>(reinterpret_cast<u64>(a) & 15);
  if (phase == 0 && lo == 0 && hi == kElems) return load_word<16, true>(a);
  const unsigned char* g0 = a - phase;
  // The source bytes the window needs: [a + lo * kBytes, a + hi * kBytes).
  u32 w[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) w[i] = 0;
  if (lo * kBytes + phase < 16) {
    const Word<16> v = load_word<16, true>(g0);
#pragma unroll
    for (int i = 0; i < 4; ++i) w[i] = v.w[i];
  }
  if (phase != 0 && hi * kBytes + phase > 16) {
    const Word<16> v = load_word<16, true>(g0 + 16);
#pragma unroll
    for (int i = 0; i < 4; ++i) w[4 + i] = v.w[i];
  }
  // Bytes [phase, phase + 16) of the 32 loaded: `k` whole words, then (2-byte elements) a half.
  const int k = phase >> 2;
  const bool half = (phase & 3) != 0;
  u32 d[5];
#pragma unroll
  for (int j = 0; j < 5; ++j) d[j] = word_at(w, j, k);
#pragma unroll
  for (int i = 0; i < 4; ++i) out.w[i] = shifted_word(d[i], d[i + 1], half);
  // Zero the elements outside the source run (their bytes belong to neighbouring rows).
#pragma unroll
  for (int e = 0; e < kElems; ++e) {
    if (e >= lo && e < hi) continue;
    if constexpr (kBytes == 4) out.w[e] = 0;
    else out.w[e / 2] &= (e % 2) ? 0x0000FFFFu : 0xFFFF0000u;
  }
  return out;
}

template <int kBytes>
struct Bits;
template <>
struct Bits<2> {
  using type = unsigned short;
};
template <>
struct Bits<4> {
  using type = unsigned int;
};

// One unit: window `window` of output row `row` = (n, t, h).
template <int kBytes>
__device__ __forceinline__ void window_unit(const CausalConv3dCatPadParams& p, long long row, long long window,
                                            long long n, long long t, long long h) {
  using B = typename Bits<kBytes>::type;
  const long long row_bytes = p.row_elems * kBytes;
  unsigned char* const row_begin = static_cast<unsigned char*>(p.out) + row * row_bytes;
  unsigned char* const window_begin = row_begin - (reinterpret_cast<u64>(row_begin) & 15) + 16 * window;
  if (window_begin >= row_begin + row_bytes) return;  // past this row's last window
  // The source row, or NULL for a zero row.
  const long long st = t - p.frame_offset, ih = h - p.row_offset;
  const unsigned char* src = nullptr;
  if (st >= 0 && st < p.cache_frames + p.x_frames && ih >= 0 && ih < p.src_rows) {
    src = st < p.cache_frames
              ? static_cast<const unsigned char*>(p.cache) + ((n * p.cache_frames + st) * p.src_rows + ih) * p.run * kBytes
              : static_cast<const unsigned char*>(p.x) +
                    ((n * p.x_frames + (st - p.cache_frames)) * p.src_rows + ih) * p.run * kBytes;
  }
  // Output element index (in the row) of the window's first byte; negative in a row's head window.
  const long long j = (window_begin - row_begin) / kBytes;
  if (window_begin >= row_begin && window_begin + 16 <= row_begin + row_bytes) {
    Word<16> v;
    if (src) {
      v = source_window<kBytes>(src, j - p.head, p.run);
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i) v.w[i] = 0;
    }
    store_word<16>(window_begin, v);
    return;
  }
  // A window the row boundary cuts: this row's elements of it, one by one.
  constexpr int kElems = 16 / kBytes;
#pragma unroll
  for (int e = 0; e < kElems; ++e) {
    const long long col = j + e;
    if (col < 0 || col >= p.row_elems) continue;
    const long long q = col - p.head;
    B value = 0;
    if (src && q >= 0 && q < p.run) value = reinterpret_cast<const B*>(src)[q];
    reinterpret_cast<B*>(row_begin)[col] = value;
  }
}

}  // namespace ccp_detail

// The kernel body: kIndex64 for 2^31 units or more (the host's ccp_index64).
template <typename T, bool kPdl, bool kIndex64>
__device__ void causal_conv3d_cat_pad(const CausalConv3dCatPadParams& p) {
  using namespace ccp_detail;
  constexpr int kBytes = static_cast<int>(sizeof(T));
  static_assert(kBytes == 2 || kBytes == 4, "2- or 4-byte elements");
  if constexpr (kPdl) pdl_wait();  // out may still be read, and x / cache written, by the grid before
  if constexpr (!kIndex64) {
    const unsigned stride = gridDim.x * blockDim.x;  // the units and a stride: < 2^32
    for (unsigned u = blockIdx.x * blockDim.x + threadIdx.x; u < p.units32; u += stride) {
      const unsigned row = fast_quotient(u, p.row_windows_divisor);
      const unsigned window = u - row * static_cast<unsigned>(p.row_windows);
      const unsigned th = fast_quotient(row, p.rows_out_divisor);
      const unsigned h = row - th * static_cast<unsigned>(p.rows_out);
      const unsigned n = fast_quotient(th, p.frames_out_divisor);
      const unsigned t = th - n * static_cast<unsigned>(p.frames_out);
      window_unit<kBytes>(p, row, window, n, t, h);
    }
  } else {
    const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
    for (long long u = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; u < p.units; u += stride) {
      const long long row = u / p.row_windows, window = u - row * p.row_windows;
      const long long th = row / p.rows_out, h = row - th * p.rows_out;
      const long long n = th / p.frames_out, t = th - n * p.frames_out;
      window_unit<kBytes>(p, row, window, n, t, h);
    }
  }
  if constexpr (kPdl) pdl_launch_dependents();
}

}  // namespace ditops

#endif  // __CUDACC__ || __CUDACC_RTC__
