// Causal Conv3D cat + pad (the Cosmos3 VAE): one pass of
//
//   out = F.pad(torch.cat([cache, x], 2), (wl, wr, ht, hb, dl - ct, dr))
//
// Numerics contract: a pure copy plus zero fill. Every output element is either the bits of one
// source element (moved as raw words, never through a floating-point register) or +0; so the op
// is bit-exact against cat + F.pad for every dtype, -0 and NaN payloads included.
//
// Layout-free by construction: the host folds NCTHW and channels-last-3d into one row model
// (docs/causal_conv3d_cat_pad.md). out is `rows` dense rows of `row_bytes` bytes: one per
// (n, t, h) of the output, n = b * C + c (NCTHW, rows of W_out elements) or n = b (channels-last,
// rows of W_out * C elements). A row is either all zeros (a padding frame or padding row) or
// [head_bytes of zeros | run_bytes copied from one contiguous source row | zeros]. The source
// row of output row (n, t, h), with st = t - frame_offset and ih = h - row_offset:
//   st <  cache_frames: cache + ((n * cache_frames + st) * src_rows + ih) * run_bytes
//   st >= cache_frames: x + ((n * x_frames + st - cache_frames) * src_rows + ih) * run_bytes
// valid when 0 <= st < cache_frames + x_frames and 0 <= ih < src_rows.
//
// Work: out's bytes as one stream cut into the 16-byte-aligned windows of memory that meet it,
// each written by one 16-byte store. A warp takes kUnroll x 32 consecutive windows per step (its
// stores coalesce whatever the rows), lane l the windows l, l + 32, ...: all loads of a step are
// issued before its first store. A window's bytes come from the row it starts in (row A) and,
// where a row ends inside it, from the next one (row B); the bytes of one row are its source
// shifted by a per-row phase s, taken from the two aligned 16-byte granules that cover them
// (word selects and a funnel shift in registers) and masked to the row's run. Granule g + 16 of a
// window is granule g of the next lane's window, handed over by a shuffle; a lane loads it itself
// only where the next lane has not (row ends, the step's last lane). So each source granule is
// read from memory about once and zero rows read nothing. A window finds its source from the two
// frames its warp holds (one multiply-add; FramePair). What this straight path does not
// cover (rows under 16 bytes, out's first and last window when out is off 16 bytes, a row B
// whose source lies elsewhere) takes a per-window path that loads its own granules and stores
// the bytes of out it holds, element by element at out's two ends.
//
// Four paths (kPath, the host's ccp_path):
// - kCcpAligned (ccp_aligned: 16-byte rows, heads, runs and pointers, as channels-last model
//   shapes are): every window lies in one row's run or one row's zeros, so a window is one load
//   and one store with no shifts, masks or shuffles.
// - kCcpParts (rows of 16 to 511 bytes the chunks kernel does not take): the same windows, each
//   its row A part and its row B part, each read from its own two aligned granules and shifted,
//   with no ballot, shuffle or branch: every lane runs the same instructions whether its window
//   meets a row end or not (the general path's divergent row-end code was most of the step where
//   rows are short: 108-420-byte rows, 61-78 % of a copy on the H100).
// - kCcpChunks (rows of any length from 16 x kCcpUnrollChunks + gap bytes whose pads add 4 or 8
//   bytes: the NCTHW model shapes, W padded by 1 and 1): a lane takes kCcpUnrollChunks consecutive
//   windows (a chunk), which meet one band of zeros at most (a row's tail and the next row's
//   head), so its row arithmetic is done once per chunk and both rows' bytes are one source
//   stream, the second row's `gap` bytes behind the first's: loaded as aligned granules, shifted
//   once in registers, and each word taken from the stream at one of two word offsets and masked.
// - kCcpGeneral (everything else: rows under 16 bytes, and rows of 512 bytes or more the chunks
//   kernel does not take): the shuffle path described above.
//
// Index arithmetic: 32-bit with FastDivisors where out has fewer than 2^31 - 64 bytes, otherwise
// (kIndex64) 64-bit with FastDivisor64s; no integer division in either loop.
#pragma once

#include "common/fast_divide.h"  // also DITOPS_HOST_DEVICE

namespace ditops {

// Launch parameters: plain data, built by the host (src/ops/causal_conv3d_cat_pad/) and passed
// by value as the kernel's __grid_constant__ argument; ccp_finish_params fills the derived fields.
struct CausalConv3dCatPadParams {
  const void* x;
  const void* cache;  // NULL when there is no cache (cache_frames = 0)
  void* out;
  long long row_bytes;   // bytes per output row: W_out or W_out * C elements
  long long head_bytes;  // zeros before the source run: wl or wl * C elements
  long long run_bytes;   // source bytes per row: W or W * C elements
  long long rows_out;    // H_out
  long long frames_out;  // T_out
  long long src_rows;    // H
  long long x_frames;    // T
  long long cache_frames;  // ct (0 without a cache)
  long long frame_offset;  // dl - ct: output frames before the first cache frame
  long long row_offset;    // ht
  // Derived (ccp_finish_params):
  long long out_bytes;  // rows * row_bytes
  long long windows;    // 16-byte windows of memory meeting out: ceil((out_phase + out_bytes) / 16)
  int out_phase;        // out's address modulo 16
  FastDivisor row_bytes_div, rows_out_div, frames_out_div;          // the 32-bit kernel's
  FastDivisor64 row_bytes_div64, rows_out_div64, frames_out_div64;  // the 64-bit kernel's
};

// Out's bytes from which the 64-bit kernel runs: below, every offset the 32-bit kernel forms
// (up to a window past the end) stays under 2^31.
constexpr long long kCcpIndex32Bytes = 0x7fffffffLL - 64;

// Whether a call of `out_bytes` takes the 64-bit kernel.
DITOPS_HOST_DEVICE constexpr bool ccp_index64(long long out_bytes) { return out_bytes >= kCcpIndex32Bytes; }

// The derived fields, from the sizes and out's address (rows = out_bytes / row_bytes >= 1): the
// divisors of the kernel of `index64` (ccp_index64, or true to run the 64-bit kernel on any size).
DITOPS_HOST_DEVICE
inline void ccp_finish_params(CausalConv3dCatPadParams& p, long long rows, bool index64) {
  p.out_bytes = rows * p.row_bytes;
  p.out_phase = static_cast<int>(reinterpret_cast<unsigned long long>(p.out) & 15);
  p.windows = (p.out_phase + p.out_bytes + 15) / 16;
  if (!index64) {
    p.row_bytes_div = fast_divisor(static_cast<unsigned>(p.row_bytes));
    p.rows_out_div = fast_divisor(static_cast<unsigned>(p.rows_out));
    p.frames_out_div = fast_divisor(static_cast<unsigned>(p.frames_out));
  } else {
    p.row_bytes_div64 = fast_divisor64(static_cast<unsigned long long>(p.row_bytes));
    p.rows_out_div64 = fast_divisor64(static_cast<unsigned long long>(p.rows_out));
    p.frames_out_div64 = fast_divisor64(static_cast<unsigned long long>(p.frames_out));
  }
}

// Whether the kAligned kernel serves the call: out, x and cache on 16 bytes, and rows, heads and
// runs whole 16-byte units (so are all source rows).
DITOPS_HOST_DEVICE
inline bool ccp_aligned(const CausalConv3dCatPadParams& p) {
  const auto off16 = [](const void* q) { return (reinterpret_cast<unsigned long long>(q) & 15) != 0; };
  return !off16(p.out) && !off16(p.x) && !off16(p.cache) && p.row_bytes % 16 == 0 && p.head_bytes % 16 == 0 &&
         p.run_bytes % 16 == 0;
}

// The kernels (template argument kPath), chosen per call by ccp_path.
constexpr int kCcpGeneral = 0;
constexpr int kCcpAligned = 1;
constexpr int kCcpParts = 2;
constexpr int kCcpChunks = 3;

// Rows the parts kernel serves (unaligned calls): from 16 bytes (a window then meets two rows at
// most) to below kCcpPartsMaxRowBytes. The bound is where the general kernel's warps stop meeting
// a row end in most steps. Measured (ccp_tune.cu, H100, 2670cc6; parts one-step, general
// resident, as the op launches them): parts faster at 108-216-byte rows (12.26 against 13.34 us
// at C1024 30x52 bf16), general faster from 420 bytes (143.7 against 148.7 us at C512 120x208
// bf16). Only calls the chunks kernel does not fit reach this bound (no model shape does).
constexpr long long kCcpPartsMinRowBytes = 16;
#ifndef DITOPS_CCP_PARTS_MAX_ROW_BYTES
#define DITOPS_CCP_PARTS_MAX_ROW_BYTES 512
#endif
constexpr long long kCcpPartsMaxRowBytes = DITOPS_CCP_PARTS_MAX_ROW_BYTES;

// Windows per lane and step, all their loads issued before the first store: the general kernel
// holds two granules per window in registers (63 registers at 2, the cap of 4 resident blocks of
// 256 threads), the aligned one a single one (48 at 4: 5 blocks). Measured (ccp_tune.cu, H100,
// 2670cc6): general one window at 5 blocks was 3-8 % slower than 2 at 4 at every NCTHW case
// (resident grid; SGLang bf16 284.9 against 269.5 us); aligned 2 and 4 within 0.3 % one-step
// (238.7 and 238.9 us at SGLang's channels-last point).
#ifndef DITOPS_CCP_UNROLL_GENERAL
#define DITOPS_CCP_UNROLL_GENERAL 2  // bench/experiments/ccp_tune.cu builds other values
#endif
#ifndef DITOPS_CCP_UNROLL_ALIGNED
#define DITOPS_CCP_UNROLL_ALIGNED 4
#endif
// The parts kernel holds four granules per window (two per row part): at 2 windows 78 registers
// at 3 blocks of 256 (capped at 64 it spills 32-56 bytes; ptxas 13.0, sm_90a). Measured
// (ccp_tune.cu, H100, 2670cc6, the one-step grid the op launches): 2 windows 71-84 % of a copy
// at the NCTHW cases, 1 window 69-82 %; no NCTHW model shape takes it now (chunks fits them all).
#ifndef DITOPS_CCP_UNROLL_PARTS
#define DITOPS_CCP_UNROLL_PARTS 2
#endif
// The chunks kernel's windows per lane (a chunk: 32 bytes at 2; registers: the op's
// kCcpMinBlocksChunks). Chosen from ccp_tune.cu's one-step rows (H100, 2670cc6; the library's
// default since 1db554a): 2 windows 87-103 % of a copy at every NCTHW case, 4 windows 83-99 %,
// 6 and 8 windows 43-64 % (a lane's stores 16 x U bytes apart).
#ifndef DITOPS_CCP_UNROLL_CHUNKS
#define DITOPS_CCP_UNROLL_CHUNKS 2
#endif
constexpr int kCcpUnrollGeneral = DITOPS_CCP_UNROLL_GENERAL;
constexpr int kCcpUnrollAligned = DITOPS_CCP_UNROLL_ALIGNED;
constexpr int kCcpUnrollParts = DITOPS_CCP_UNROLL_PARTS;
constexpr int kCcpUnrollChunks = DITOPS_CCP_UNROLL_CHUNKS;

// Windows per lane and step of a kernel.
DITOPS_HOST_DEVICE constexpr int ccp_unroll(int path) {
  return path == kCcpAligned  ? kCcpUnrollAligned
         : path == kCcpParts  ? kCcpUnrollParts
         : path == kCcpChunks ? kCcpUnrollChunks
                              : kCcpUnrollGeneral;
}

// Whether the chunks kernel serves an unaligned call: its pads add 4 or 8 bytes to a row (the
// second row of a chunk reads the stream 1 or 2 words behind the first), and a chunk's windows
// plus that gap fit in a row's run, so a chunk meets one band of zeros at most.
DITOPS_HOST_DEVICE
inline bool ccp_chunks_fit(const CausalConv3dCatPadParams& p) {
  const long long gap = p.row_bytes - p.run_bytes;
  return (gap == 4 || gap == 8) && p.run_bytes >= 16LL * kCcpUnrollChunks;
}

// The kernel of a call (ccp_finish_params done or not): aligned where ccp_aligned; else chunks
// where ccp_chunks_fit (the NCTHW model shapes, rows of any length); else parts where rows are
// kCcpPartsMinRowBytes to below kCcpPartsMaxRowBytes, the general one otherwise. Chunks wherever
// it fits: at 2 windows a lane, one-step, it was the fastest kernel at every NCTHW case of
// ccp_tune.cu (H100, 2670cc6), 1280- and 2560-byte runs included (SGLang bf16: 243.3 us, the
// general kernel 269.5 on the resident grid it launches, a copy 248.7).
DITOPS_HOST_DEVICE
inline int ccp_path(const CausalConv3dCatPadParams& p) {
  if (ccp_aligned(p)) return kCcpAligned;
  if (ccp_chunks_fit(p)) return kCcpChunks;
  if (p.row_bytes < kCcpPartsMinRowBytes || p.row_bytes >= kCcpPartsMaxRowBytes) return kCcpGeneral;
  return kCcpParts;
}

// Which steps a warp takes: 0, one contiguous range (its frame pair changes about once per
// frame); 1, the steps of its block's turn in a grid-stride walk (the grid's warps on
// neighbouring memory at a time, a frame pair per step where frames are shorter than the walk's
// stride). Measured (ccp_tune.cu, H100, 2670cc6, the general kernel on its resident grid): order 1
// took 7 % less to 7 % more time than order 0 at the NCTHW cases, no better on balance.
#ifndef DITOPS_CCP_STEP_ORDER
#define DITOPS_CCP_STEP_ORDER 0
#endif
constexpr int kCcpStepOrder = DITOPS_CCP_STEP_ORDER;

}  // namespace ditops

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

#include "common/memory.cuh"
#include "common/types.cuh"

namespace ditops {

namespace ccp_detail {

using namespace ditops::kernel;

template <bool kIndex64>
struct IndexOf {
  using type = int;
};
template <>
struct IndexOf<true> {
  using type = long long;
};

// floor(n / d) for 0 <= n (below 2^31 in the 32-bit kernel).
template <bool kIndex64>
__device__ __forceinline__ typename IndexOf<kIndex64>::type quotient(typename IndexOf<kIndex64>::type n,
                                                                     FastDivisor d32, FastDivisor64 d64) {
  if constexpr (kIndex64) return static_cast<long long>(fast_quotient64(static_cast<u64>(n), d64));
  else return static_cast<int>(fast_quotient(static_cast<unsigned>(n), d32));
}

// The source row of out row (n, t, h), or NULL for a zero row (no source frame or row, or W = 0).
template <bool kIndex64>
__device__ __forceinline__ const unsigned char* source_of(const CausalConv3dCatPadParams& p,
                                                          typename IndexOf<kIndex64>::type n,
                                                          typename IndexOf<kIndex64>::type t,
                                                          typename IndexOf<kIndex64>::type h) {
  using I = typename IndexOf<kIndex64>::type;
  const I st = t - static_cast<I>(p.frame_offset), ih = h - static_cast<I>(p.row_offset);
  const I ct = static_cast<I>(p.cache_frames), tx = static_cast<I>(p.x_frames);
  if (st < 0 || st >= ct + tx || ih < 0 || ih >= static_cast<I>(p.src_rows) || p.run_bytes == 0) return nullptr;
  const bool from_cache = st < ct;
  const unsigned char* base = static_cast<const unsigned char*>(from_cache ? p.cache : p.x);
  const I row = (n * (from_cache ? ct : tx) + (from_cache ? st : st - ct)) * static_cast<I>(p.src_rows) + ih;
  return base + row * static_cast<I>(p.run_bytes);  // within x or cache: below 2^31 in the 32-bit kernel
}

// The source row of out row r, or NULL for a zero row.
template <bool kIndex64>
__device__ __forceinline__ const unsigned char* source_row(const CausalConv3dCatPadParams& p,
                                                           typename IndexOf<kIndex64>::type r) {
  using I = typename IndexOf<kIndex64>::type;
  const I th = quotient<kIndex64>(r, p.rows_out_div, p.rows_out_div64);
  const I h = r - th * static_cast<I>(p.rows_out);
  const I n = quotient<kIndex64>(th, p.frames_out_div, p.frames_out_div64);
  return source_of<kIndex64>(p, n, th - n * static_cast<I>(p.frames_out), h);
}

// The source rows of out rows r - 1 (NULL where r = 0) and r, from one decomposition of r.
template <bool kIndex64>
__device__ __forceinline__ void source_rows_to(const CausalConv3dCatPadParams& p, typename IndexOf<kIndex64>::type r,
                                               const unsigned char*& before, const unsigned char*& at) {
  using I = typename IndexOf<kIndex64>::type;
  const I rows_out = static_cast<I>(p.rows_out), frames_out = static_cast<I>(p.frames_out);
  const I th = quotient<kIndex64>(r, p.rows_out_div, p.rows_out_div64);
  const I h = r - th * rows_out;
  const I n = quotient<kIndex64>(th, p.frames_out_div, p.frames_out_div64);
  const I t = th - n * frames_out;
  at = source_of<kIndex64>(p, n, t, h);
  // Row r - 1: the row above, or the last row of the frame before (of the sample before).
  const I hb = h > 0 ? h - 1 : rows_out - 1, tb = h > 0 ? t : t > 0 ? t - 1 : frames_out - 1;
  const I nb = h > 0 || t > 0 ? n : n - 1;
  before = r > 0 ? source_of<kIndex64>(p, nb, tb, hb) : nullptr;
}

__device__ __forceinline__ Word<16> zero_word() {
  Word<16> v;
#pragma unroll
  for (int i = 0; i < 4; ++i) v.w[i] = 0;
  return v;
}

// 16 zero bytes in global memory: a lane with no granule to load reads these (an L1 hit), so a
// step's loads need no predicates. A predicated load merged with zeros gets a copy after it that
// waits for the data before the step's next load is issued (ptxas, sm_90a).
static __device__ Word<16> ccp_zero_granule;

// The granule at p where `load`, else ccp_zero_granule's zeros.
__device__ __forceinline__ Word<16> load_or_zero(const void* p, bool load) {
  return load_word<16, true>(load ? p : static_cast<const void*>(&ccp_zero_granule));
}

// Bytes [s, s + 16) of the 32 bytes lo | hi (s < 16, a multiple of kBytes): words selected by
// s's bits 3 and 2, then (2-byte elements) a funnel shift by s's bit 1.
template <int kBytes>
__device__ __forceinline__ Word<16> shifted(const Word<16>& lo, const Word<16>& hi, unsigned s) {
  const u32 w[8] = {lo.w[0], lo.w[1], lo.w[2], lo.w[3], hi.w[0], hi.w[1], hi.w[2], hi.w[3]};
  u32 x[6], u[5];
#pragma unroll
  for (int j = 0; j < 6; ++j) x[j] = (s & 8) ? w[j + 2] : w[j];
#pragma unroll
  for (int j = 0; j < 5; ++j) u[j] = (s & 4) ? x[j + 1] : x[j];
  Word<16> out;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (kBytes == 4) out.w[i] = u[i];
    else out.w[i] = __funnelshift_r(u[i], u[i + 1], (s & 3) * 8);
  }
  return out;
}

// v with its bytes outside [lo, hi) cleared (0 <= lo < hi <= 16): clamped funnel shifts give the
// byte masks of each word.
__device__ __forceinline__ void keep_bytes(Word<16>& v, int lo, int hi) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int below = 8 * lo - 32 * i, above = 32 * i + 32 - 8 * hi;
    const u32 keep = __funnelshift_lc(0u, ~0u, below > 0 ? below : 0) & __funnelshift_rc(~0u, 0u, above > 0 ? above : 0);
    v.w[i] &= keep;
  }
}

template <class I>
__device__ __forceinline__ int clamp16(I v) {
  return static_cast<int>(v < 0 ? 0 : v > 16 ? 16 : v);
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

// A window the straight path does not cover, at tensor offset q (window w): every row it meets,
// each from its own loads; stored whole, or element by element where it reaches past out.
template <int kBytes, bool kIndex64>
__device__ __noinline__ void window_by_rows(const CausalConv3dCatPadParams& p, typename IndexOf<kIndex64>::type q,
                                            unsigned char* dst) {
  using I = typename IndexOf<kIndex64>::type;
  const I row_bytes = static_cast<I>(p.row_bytes), out_bytes = static_cast<I>(p.out_bytes);
  const I end = q + 16 < out_bytes ? q + 16 : out_bytes;
  Word<16> v = zero_word();
  for (I r = quotient<kIndex64>(q > 0 ? q : 0, p.row_bytes_div, p.row_bytes_div64); r * row_bytes < end; ++r) {
    const unsigned char* src = source_row<kIndex64>(p, r);
    const I run = r * row_bytes + static_cast<I>(p.head_bytes);
    const int lo = clamp16(run - q), hi = clamp16(run + static_cast<I>(p.run_bytes) - q);
    if (src == nullptr || lo >= hi) continue;
    const u64 a = reinterpret_cast<u64>(src) + static_cast<u64>(static_cast<long long>(q - run));
    const unsigned s = static_cast<unsigned>(a & 15);
    const unsigned char* g = reinterpret_cast<const unsigned char*>(a - s);
    const Word<16> g0 = load_or_zero(g, lo + static_cast<int>(s) < 16);
    const Word<16> g1 = load_or_zero(g + 16, hi + static_cast<int>(s) > 16);
    Word<16> c = shifted<kBytes>(g0, g1, s);
    keep_bytes(c, lo, hi);
#pragma unroll
    for (int i = 0; i < 4; ++i) v.w[i] |= c.w[i];
  }
  if (q >= 0 && q + 16 <= out_bytes) {
    store_word<16>(dst, v);
    return;
  }
  using B = typename Bits<kBytes>::type;
#pragma unroll
  for (int e = 0; e < 16 / kBytes; ++e) {
    const I at = q + e * kBytes;
    if (at < 0 || at >= out_bytes) continue;
    const u32 word = v.w[e * kBytes / 4];
    reinterpret_cast<B*>(dst)[e] = static_cast<B>(kBytes == 4 ? word : word >> (16 * (e & 1)));
  }
}

// The out rows of two consecutive frames th, th + 1 (th = n * T_out + t): rows [row0, row0 +
// 2 H_out). Row r of frame f has a source row where lo[f] <= r < hi[f], and its run's byte for
// out offset q lies at k[f] + q - r * gap (gap = row_bytes - run_bytes: the zeros a row adds), so
// a window finds its source with one multiply-add and a select instead of a row decomposition.
template <bool kIndex64>
struct FramePair {
  typename IndexOf<kIndex64>::type row0, lo[2], hi[2];
  u64 k[2];
};

template <bool kIndex64>
__device__ __forceinline__ void frame_source(const CausalConv3dCatPadParams& p, typename IndexOf<kIndex64>::type th,
                                             FramePair<kIndex64>& fp, int f) {
  using I = typename IndexOf<kIndex64>::type;
  const I n = quotient<kIndex64>(th, p.frames_out_div, p.frames_out_div64);
  const I st = th - n * static_cast<I>(p.frames_out) - static_cast<I>(p.frame_offset);
  const I ct = static_cast<I>(p.cache_frames), tx = static_cast<I>(p.x_frames), h = static_cast<I>(p.src_rows);
  const I first_row = th * static_cast<I>(p.rows_out) + static_cast<I>(p.row_offset);
  fp.lo[f] = fp.hi[f] = first_row;
  fp.k[f] = 0;
  if (st < 0 || st >= ct + tx || p.run_bytes == 0) return;  // a zero frame (or W = 0)
  const bool from_cache = st < ct;
  const unsigned char* base = static_cast<const unsigned char*>(from_cache ? p.cache : p.x);
  const I run = static_cast<I>(p.run_bytes);
  base += ((n * (from_cache ? ct : tx) + (from_cache ? st : st - ct)) * h) * run;
  fp.hi[f] = first_row + h;
  fp.k[f] = reinterpret_cast<u64>(base) - static_cast<u64>(first_row * run + static_cast<I>(p.head_bytes));
}

template <bool kIndex64>
__device__ __forceinline__ void frame_pair(const CausalConv3dCatPadParams& p, typename IndexOf<kIndex64>::type th,
                                           FramePair<kIndex64>& fp) {
  fp.row0 = th * static_cast<typename IndexOf<kIndex64>::type>(p.rows_out);
  frame_source<kIndex64>(p, th, fp, 0);
  frame_source<kIndex64>(p, th + 1, fp, 1);
}

// One row's share of a window at out offset q: bytes [lo, hi) of the window (lo == hi: none) are
// bytes [s + lo, s + hi) of the source granules g, g + 16.
struct RowPart {
  u64 g;
  unsigned s;
  int lo, hi;
};

// Row r's part, r in the frame pair (split = its second frame's first row), run its run's start.
template <bool kIndex64>
__device__ __forceinline__ RowPart row_part(const FramePair<kIndex64>& fp, typename IndexOf<kIndex64>::type split,
                                            typename IndexOf<kIndex64>::type r, typename IndexOf<kIndex64>::type q,
                                            typename IndexOf<kIndex64>::type run,
                                            typename IndexOf<kIndex64>::type run_bytes,
                                            typename IndexOf<kIndex64>::type gap) {
  const bool second = r >= split;
  const bool sourced = r >= (second ? fp.lo[1] : fp.lo[0]) && r < (second ? fp.hi[1] : fp.hi[0]);
  RowPart part;
  part.lo = clamp16(run - q);
  part.hi = sourced ? clamp16(run + run_bytes - q) : part.lo;
  const u64 a = (second ? fp.k[1] : fp.k[0]) + static_cast<u64>(static_cast<long long>(q - r * gap));
  part.s = static_cast<unsigned>(a & 15);
  part.g = a - part.s;
  return part;
}

// Whether a part reads its first (second) granule.
__device__ __forceinline__ bool reads_first(const RowPart& r) { return r.lo < r.hi && r.lo + static_cast<int>(r.s) < 16; }
__device__ __forceinline__ bool reads_second(const RowPart& r) { return r.lo < r.hi && r.hi + static_cast<int>(r.s) > 16; }

// The shares of a window the straight path combines, packed: bytes [lo, hi) of row A at shift
// s, and of row B at shift sb, whose granules are row A's (first: ga, second: ga + 16).
struct Shares {
  u32 a;  // s | lo << 8 | hi << 16
  u32 b;  // sb | lo << 8 | hi << 16 | (row B's first granule is ga) << 24
};
__device__ __forceinline__ u32 pack_share(unsigned s, int lo, int hi) {
  return s | (static_cast<u32>(lo) << 8) | (static_cast<u32>(hi) << 16);
}

// The sizes a step of the general or parts kernel works with, in its index type: row, out, head
// and run bytes, the zeros a row adds (gap), and the frame pair's second frame and end (rows).
template <bool kIndex64>
struct StepGeometry {
  typename IndexOf<kIndex64>::type row_bytes, out_bytes, head, run_bytes, gap, split, pair_end;
};
template <bool kIndex64>
__device__ __forceinline__ StepGeometry<kIndex64> step_geometry(const CausalConv3dCatPadParams& p,
                                                                const FramePair<kIndex64>& fp) {
  using I = typename IndexOf<kIndex64>::type;
  const I row_bytes = static_cast<I>(p.row_bytes), run_bytes = static_cast<I>(p.run_bytes);
  const I split = fp.row0 + static_cast<I>(p.rows_out);
  return {row_bytes,          static_cast<I>(p.out_bytes), static_cast<I>(p.head_bytes), run_bytes,
          row_bytes - run_bytes, split,                    split + static_cast<I>(p.rows_out)};
}

// One step of the general kernel: windows first + 32 u + lane, u < kCcpUnrollGeneral, all in
// rows of the frame pair `fp` except where a frame is shorter than the step.
//
// The next lane's window starts 16 bytes on, so where it lies in this window's row A its first
// granule is this window's second one, g + 16 (where row A ends inside this window, the next
// window lies in row B and its first granule is row B's second). Whether it loaded that granule
// is one bit of a ballot, so no address moves between lanes; lane 31 loads its second granule
// itself. The straight path reads row A's two granules only: row B's source must continue row
// A's (rows of one frame; gb = ga - 16, ga or ga + 16). Everything else (row B's source
// elsewhere: a frame or tensor boundary without padding rows between; rows past the pair; out's
// ends; rows under 16 bytes) takes window_by_rows after the step's stores.
template <int kBytes, bool kIndex64>
__device__ __forceinline__ void general_step(const CausalConv3dCatPadParams& p, const FramePair<kIndex64>& fp,
                                             typename IndexOf<kIndex64>::type first, int lane, unsigned char* out16) {
  using I = typename IndexOf<kIndex64>::type;
  constexpr int kU = kCcpUnrollGeneral;
  const auto [row_bytes, out_bytes, head, run_bytes, gap, split, pair_end] = step_geometry<kIndex64>(p, fp);
  u64 ga[kU];
  Shares sh[kU];
  bool active[kU], straight[kU], need0[kU], need1[kU], second_from_next[kU];
#pragma unroll
  for (int u = 0; u < kU; ++u) {
    const I w = first + 32 * u + lane;
    active[u] = w < static_cast<I>(p.windows);
    const I q = 16 * (active[u] ? w : first) - p.out_phase;
    const I r = quotient<kIndex64>(q > 0 ? q : 0, p.row_bytes_div, p.row_bytes_div64);
    const I row_end = (r + 1) * row_bytes;
    const RowPart a = row_part<kIndex64>(fp, split, r, q, row_end - row_bytes + head, run_bytes, gap);
    ga[u] = a.g;
    sh[u].a = pack_share(a.s, a.lo, a.hi);
    sh[u].b = 0;
    need0[u] = active[u] && reads_first(a);
    need1[u] = reads_second(a);
    const bool straddle = row_end < q + 16;
    // Inside out, meeting rows A and B at most (both in the pair).
    straight[u] = active[u] && q >= 0 && q + 16 <= out_bytes && q + 16 - row_end < row_bytes &&
                  r + (straddle ? 1 : 0) < pair_end;
    // Whether the next lane's first granule is ga + 16 (its window in row A, or in row B with gb = ga).
    second_from_next[u] = q + 16 < row_end;
    if (straight[u] && straddle) {
      const RowPart b = row_part<kIndex64>(fp, split, r + 1, q, row_end + head, run_bytes, gap);
      const bool same = b.g == a.g;
      sh[u].b = pack_share(b.s, b.lo, b.hi) | (same ? 1u << 24 : 0u);
      second_from_next[u] = same;
      if (reads_first(b)) {
        if (same) need0[u] = true;
        else if (b.g == a.g + 16) need1[u] = true;
        else straight[u] = false;
      }
      if (reads_second(b)) {
        if (same) need1[u] = true;
        else if (b.g + 16 == a.g) need0[u] = true;
        else straight[u] = false;
      }
    }
  }
  Word<16> g0[kU], g1[kU];
#pragma unroll
  for (int u = 0; u < kU; ++u) {
    const unsigned loaded = __ballot_sync(0xffffffffu, need0[u]);
    second_from_next[u] = second_from_next[u] && lane < 31 && ((loaded >> (lane + 1)) & 1);
    g0[u] = load_or_zero(reinterpret_cast<const void*>(ga[u]), need0[u]);
    g1[u] = load_or_zero(reinterpret_cast<const void*>(ga[u] + 16), straight[u] && need1[u] && !second_from_next[u]);
  }
#pragma unroll
  for (int u = 0; u < kU; ++u) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const u32 next = __shfl_down_sync(0xffffffffu, g0[u].w[i], 1);
      if (second_from_next[u]) g1[u].w[i] = next;
    }
    if (!active[u] || !straight[u]) continue;
    const u32 pa = sh[u].a, pb = sh[u].b;
    const int alo = (pa >> 8) & 0xff, ahi = (pa >> 16) & 0xff, blo = (pb >> 8) & 0xff, bhi = (pb >> 16) & 0xff;
    Word<16> v = zero_word();
    if (alo < ahi) {
      v = shifted<kBytes>(g0[u], g1[u], pa & 15);
      if (alo > 0 || ahi < 16) keep_bytes(v, alo, ahi);
    }
    if (blo < bhi) {
      const bool same = (pb >> 24) & 1;  // row B's granules: (ga, ga + 16) or, where not, (ga + 16, ga)
      Word<16> c = same ? shifted<kBytes>(g0[u], g1[u], pb & 15) : shifted<kBytes>(g1[u], g0[u], pb & 15);
      keep_bytes(c, blo, bhi);
#pragma unroll
      for (int i = 0; i < 4; ++i) v.w[i] |= c.w[i];
    }
    store_word<16>(out16 + 16 * (first + 32 * u + lane), v);
  }
#pragma unroll
  for (int u = 0; u < kU; ++u)
    if (active[u] && !straight[u]) {
      const I w = first + 32 * u + lane;
      window_by_rows<kBytes, kIndex64>(p, 16 * w - p.out_phase, out16 + 16 * w);
    }
}

// One step of the parts kernel (rows of 16 bytes or more): windows first + 32 u + lane, u <
// kCcpUnrollParts. Window q meets row A (its first byte's row r) and at most row B (r + 1); each
// row's part is bytes [lo, hi) of the window, read from the two aligned granules that cover them
// (row_part), shifted and masked, and the two parts ORed: no shuffle and no per-lane branch, so
// every lane of a warp runs the same instructions; a warp skips row B's loads and shift, or the
// masks, only where none of its windows needs them (two votes). A granule a part does not
// read comes from ccp_zero_granule (loads without predicates, as in the general kernel). Neighbour
// lanes load the same granules (the second of one is the first of the next): L1 serves the repeat,
// DRAM sees each once. Windows outside out, or whose row B lies past the frame pair, take
// window_by_rows after the step's stores.
template <int kBytes, bool kIndex64>
__device__ __forceinline__ void parts_step(const CausalConv3dCatPadParams& p, const FramePair<kIndex64>& fp,
                                           typename IndexOf<kIndex64>::type first, int lane, unsigned char* out16) {
  using I = typename IndexOf<kIndex64>::type;
  constexpr int kU = kCcpUnrollParts;
  const auto [row_bytes, out_bytes, head, run_bytes, gap, split, pair_end] = step_geometry<kIndex64>(p, fp);
  Word<16> a0[kU], a1[kU], b0[kU], b1[kU];
  u32 sh_a[kU], sh_b[kU];
  bool fast[kU], warp_b[kU], warp_mask[kU];
#pragma unroll
  for (int u = 0; u < kU; ++u) {
    const I w = first + 32 * u + lane;
    const bool active = w < static_cast<I>(p.windows);
    const I q = 16 * (active ? w : first) - p.out_phase;
    const I r = quotient<kIndex64>(q > 0 ? q : 0, p.row_bytes_div, p.row_bytes_div64);
    const I run_a = r * row_bytes + head;  // row A's run, out offset
    const RowPart a = row_part<kIndex64>(fp, split, r, q, run_a, run_bytes, gap);
    const RowPart b = row_part<kIndex64>(fp, split, r + 1, q, run_a + row_bytes, run_bytes, gap);
    // Inside out, row A in the pair, and row B in it too or not meeting the window.
    fast[u] = active && q >= 0 && q + 16 <= out_bytes && r < pair_end &&
              (r + 1 < pair_end || (r + 1) * row_bytes >= q + 16);
    // Warp-uniform: whether any window of the warp has a row B part, or a row A part short of the
    // whole window (long rows: most warps neither, so they skip row B and the masks).
    warp_b[u] = __any_sync(0xffffffffu, fast[u] && b.lo < b.hi);
    warp_mask[u] = __any_sync(0xffffffffu, fast[u] && (a.lo > 0 || a.hi < 16));
    sh_a[u] = pack_share(a.s, a.lo, a.hi);
    sh_b[u] = pack_share(b.s, b.lo, b.hi);
    a0[u] = load_or_zero(reinterpret_cast<const void*>(a.g), fast[u] && reads_first(a));
    a1[u] = load_or_zero(reinterpret_cast<const void*>(a.g + 16), fast[u] && reads_second(a));
    if (warp_b[u]) {
      b0[u] = load_or_zero(reinterpret_cast<const void*>(b.g), fast[u] && reads_first(b));
      b1[u] = load_or_zero(reinterpret_cast<const void*>(b.g + 16), fast[u] && reads_second(b));
    }
  }
#pragma unroll
  for (int u = 0; u < kU; ++u) {
    if (!fast[u]) continue;
    const u32 pa = sh_a[u], pb = sh_b[u];
    Word<16> v = shifted<kBytes>(a0[u], a1[u], pa & 15);
    if (warp_mask[u]) keep_bytes(v, (pa >> 8) & 0xff, (pa >> 16) & 0xff);
    if (warp_b[u]) {
      Word<16> c = shifted<kBytes>(b0[u], b1[u], pb & 15);
      keep_bytes(c, (pb >> 8) & 0xff, (pb >> 16) & 0xff);
#pragma unroll
      for (int i = 0; i < 4; ++i) v.w[i] |= c.w[i];
    }
    store_word<16>(out16 + 16 * (first + 32 * u + lane), v);
  }
#pragma unroll
  for (int u = 0; u < kU; ++u) {
    const I w = first + 32 * u + lane;
    if (w < static_cast<I>(p.windows) && !fast[u]) window_by_rows<kBytes, kIndex64>(p, 16 * w - p.out_phase, out16 + 16 * w);
  }
}

// One chunk of the chunks kernel (ccp_chunks_fit): windows w0 .. w0 + kCcpUnrollChunks - 1, out
// offsets q0 .. q0 + 16 U. Row A is the row whose run holds the chunk's first byte or ends before
// it (r = floor((q0 - head) / row)), row B the next: chunk bytes [0, da) are row A's run, [da, db)
// zeros (A's tail, B's head), [db, 16 U) row B's run (run_bytes >= 16 U: B's run outlasts the
// chunk). Where both rows have sources and B's continues A's (rows of one frame), byte x of the
// chunk is source byte a + x (row A) or a + x - gap (row B): one stream from a - gap, loaded as
// U + 2 aligned granules (those it uses; ccp_zero_granule for the rest), funnel-shifted once by
// the stream's phase, and each word taken at one of two word offsets (gap is 4 or 8 bytes) and
// masked to its row. A zero row masks its share to nothing. Chunks meeting out's ends, or whose
// rows B and A have unrelated sources (a frame or tensor boundary with no padding row between),
// take window_by_rows per window.
template <int kBytes, bool kIndex64>
__device__ __forceinline__ void chunks_step(const CausalConv3dCatPadParams& p, typename IndexOf<kIndex64>::type first,
                                            int lane, unsigned char* out16) {
  using I = typename IndexOf<kIndex64>::type;
  constexpr int kU = kCcpUnrollChunks, kG = kU + 2, kWords = 4 * kG;
  const I row_bytes = static_cast<I>(p.row_bytes), head = static_cast<I>(p.head_bytes);
  const I run_bytes = static_cast<I>(p.run_bytes), gap = row_bytes - run_bytes;
  const I w0 = first + kU * lane;
  if (w0 >= static_cast<I>(p.windows)) return;
  const I q0 = 16 * w0 - p.out_phase;
  bool fast = q0 >= 0 && q0 + 16 * kU <= static_cast<I>(p.out_bytes);
  const I ra = quotient<kIndex64>((fast ? q0 : 0) - head + row_bytes, p.row_bytes_div, p.row_bytes_div64) - 1;
  const I run_a = ra * row_bytes + head;  // out offset of row A's run
  const unsigned char *src_a, *src_b;
  source_rows_to<kIndex64>(p, ra + 1, src_a, src_b);
  if (run_a - head + row_bytes >= static_cast<I>(p.out_bytes)) src_b = nullptr;  // no row B
  // Chunk offsets where row A's run ends and row B's starts, clamped to [0, 16 U] (none: da = 0,
  // db = 16 U; db > 0 by the choice of row A).
  const I end_a = run_a + run_bytes - q0, start_b = run_a + row_bytes - q0;
  const int da = src_a && end_a > 0 ? static_cast<int>(end_a < 16 * kU ? end_a : 16 * kU) : 0;
  const int db = src_b && start_b < 16 * kU ? static_cast<int>(start_b) : 16 * kU;
  // The stream's byte for chunk offset x of row A (a + x); row B's is a + x - gap.
  u64 a = src_a ? reinterpret_cast<u64>(src_a) + static_cast<u64>(static_cast<long long>(q0 - run_a))
                : reinterpret_cast<u64>(src_b) + static_cast<u64>(static_cast<long long>(q0 - run_a - row_bytes + gap));
  if (src_a && src_b && src_b != src_a + run_bytes && db < 16 * kU) fast = false;
  if (!fast) {
#pragma unroll 1
    for (int u = 0; u < kU; ++u) {
      const I w = w0 + u;
      if (w < static_cast<I>(p.windows)) window_by_rows<kBytes, kIndex64>(p, 16 * w - p.out_phase, out16 + 16 * w);
    }
    return;
  }
  // The stream's bytes used, [lo, hi) from `from` plus its phase s (none: hi = 0); granule k, at
  // g + 16 k, is bytes [16 k, 16 k + 16) of it and is loaded where it meets them.
  const u64 from = a - static_cast<u64>(static_cast<long long>(gap));
  const unsigned s = static_cast<unsigned>(from & 15);
  const u64 g = from - s;
  const int lo = (da > 0 ? static_cast<int>(gap) : db) + static_cast<int>(s);
  const int hi = db < 16 * kU ? 16 * kU + static_cast<int>(s) : da > 0 ? static_cast<int>(gap) + da + static_cast<int>(s) : 0;
  u32 wd[kWords];
#pragma unroll
  for (int k = 0; k < kG; ++k) {
    const Word<16> v = load_or_zero(reinterpret_cast<const void*>(g + 16 * k), 16 * k < hi && 16 * k + 16 > lo);
#pragma unroll
    for (int i = 0; i < 4; ++i) wd[4 * k + i] = v.w[i];
  }
  // The stream from `from` in words: y[k] is bytes [4 k, 4 k + 4) of it.
  constexpr int kY = 4 * kU + 2;
  u32 y[kY];
  {
    u32 x[kY + 1];
#pragma unroll
    for (int k = 0; k < kY + 1; ++k) {
      const u32 lo_w = (s & 8) ? wd[k + 2] : wd[k], hi_w = (s & 8) ? wd[k + 3] : wd[k + 1];
      x[k] = kBytes == 4 ? lo_w : __funnelshift_r(lo_w, hi_w, (s & 3) * 8);
    }
#pragma unroll
    for (int k = 0; k < kY; ++k) y[k] = (s & 4) ? x[k + 1] : x[k];
  }
  const bool gap8 = gap == 8;
  unsigned char* const dst = out16 + 16 * w0;
  const int bits_a = 8 * da, bits_b = 8 * db;
#pragma unroll
  for (int u = 0; u < kU; ++u) {
    Word<16> v;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int k = 4 * u + i;
      const u32 from_a = gap8 ? y[k + 2] : y[k + 1], from_b = y[k];
      const int na = bits_a - 32 * k, nb = bits_b - 32 * k;  // bits of the word before A's end, B's start
      // ~0 << n, n clamped to [0, 32]: the word's bytes from A's end on, from B's start on.
      const u32 past_a = __funnelshift_lc(0u, ~0u, na > 0 ? na : 0), past_b = __funnelshift_lc(0u, ~0u, nb > 0 ? nb : 0);
      v.w[i] = (from_a & ~past_a) | (from_b & past_b);
    }
    store_word<16>(dst + 16 * u, v);
  }
}

// One step of the aligned kernel: windows first + 32 u + lane, each in one row's run or zeros.
template <bool kIndex64>
__device__ __forceinline__ void aligned_step(const CausalConv3dCatPadParams& p, const FramePair<kIndex64>& fp,
                                             typename IndexOf<kIndex64>::type first, int lane, unsigned char* out) {
  using I = typename IndexOf<kIndex64>::type;
  constexpr int kU = kCcpUnrollAligned;
  const I row_bytes = static_cast<I>(p.row_bytes), head = static_cast<I>(p.head_bytes);
  const I run_bytes = static_cast<I>(p.run_bytes), gap = row_bytes - run_bytes;
  const I split = fp.row0 + static_cast<I>(p.rows_out), pair_end = split + static_cast<I>(p.rows_out);
  Word<16> v[kU];
#pragma unroll
  for (int u = 0; u < kU; ++u) {
    const I w = first + 32 * u + lane;
    const bool active = w < static_cast<I>(p.windows);
    const I q = 16 * (active ? w : first);
    const I r = quotient<kIndex64>(q, p.row_bytes_div, p.row_bytes_div64);
    const I col = q - r * row_bytes - head;  // offset in the source row
    const bool second = r >= split;
    bool load = active && col >= 0 && col < run_bytes && r >= (second ? fp.lo[1] : fp.lo[0]) &&
                r < (second ? fp.hi[1] : fp.hi[0]);
    u64 src = (second ? fp.k[1] : fp.k[0]) + static_cast<u64>(static_cast<long long>(q - r * gap));
    if (active && r >= pair_end) {  // frames shorter than the step
      const unsigned char* row = source_row<kIndex64>(p, r);
      load = row != nullptr && col >= 0 && col < run_bytes;
      src = reinterpret_cast<u64>(row) + static_cast<u64>(static_cast<long long>(col));
    }
    v[u] = load_or_zero(reinterpret_cast<const void*>(src), load);
  }
#pragma unroll
  for (int u = 0; u < kU; ++u)
    if (first + 32 * u + lane < static_cast<I>(p.windows)) store_word<16>(out + 16 * (first + 32 * u + lane), v[u]);
}

}  // namespace ccp_detail

// The kernel body: kBytes the element size (2 or 4; the op copies bits), kPath the kernel
// (ccp_path: kCcpGeneral, kCcpAligned, kCcpParts or kCcpChunks), kIndex64 for outs of kCcpIndex32Bytes or
// more. Any grid of whole warps: each warp takes steps of ccp_unroll(kPath) x 32 windows in
// kCcpStepOrder's order.
template <int kBytes, int kPath, bool kPdl, bool kIndex64>
__device__ void causal_conv3d_cat_pad(const CausalConv3dCatPadParams& p) {
  using namespace ccp_detail;
  using I = typename IndexOf<kIndex64>::type;
  static_assert(kBytes == 2 || kBytes == 4, "2- or 4-byte elements");
  static_assert(kPath == kCcpGeneral || kPath == kCcpAligned || kPath == kCcpParts || kPath == kCcpChunks,
                "a kernel of ccp_path");
  constexpr int kStep = 32 * ccp_unroll(kPath);
  const int lane = static_cast<int>(threadIdx.x & 31);
  const I warp = static_cast<I>((blockIdx.x * blockDim.x + threadIdx.x) >> 5);
  const I warps = static_cast<I>((gridDim.x * blockDim.x) >> 5);
  const I steps = static_cast<I>((p.windows + kStep - 1) / kStep);
  I begin, end, stride = 1;
  if constexpr (kCcpStepOrder == 0) {
    const I per_warp = (steps + warps - 1) / warps;  // once per thread
    begin = warp * per_warp;
    end = begin + per_warp < steps ? begin + per_warp : steps;
  } else {
    begin = warp;
    end = steps;
    stride = warps;
  }
  // out rounded down to 16 bytes: window w is out16 + 16 w.
  unsigned char* const out16 = static_cast<unsigned char*>(p.out) - p.out_phase;
  const I rows_out = static_cast<I>(p.rows_out);
  FramePair<kIndex64> fp;
  bool held = false;
  if constexpr (kPdl) pdl_wait();  // out may still be read, and x / cache written, by the grid before
  for (I step = begin; step < end; step += stride) {
    if constexpr (kPath == kCcpChunks) {  // its own row arithmetic, once per chunk
      chunks_step<kBytes, kIndex64>(p, step * kStep, lane, out16);
      continue;
    }
    const I first = step * kStep;
    const I q0 = 16 * first - p.out_phase;
    const I r0 = quotient<kIndex64>(q0 > 0 ? q0 : 0, p.row_bytes_div, p.row_bytes_div64);
    if (!held || r0 < fp.row0 || r0 >= fp.row0 + rows_out) {  // the step's first row in the held pair's first frame
      frame_pair<kIndex64>(p, quotient<kIndex64>(r0, p.rows_out_div, p.rows_out_div64), fp);
      held = true;
    }
    if constexpr (kPath == kCcpAligned) aligned_step<kIndex64>(p, fp, first, lane, out16);
    else if constexpr (kPath == kCcpParts) parts_step<kBytes, kIndex64>(p, fp, first, lane, out16);
    else general_step<kBytes, kIndex64>(p, fp, first, lane, out16);
  }
  if constexpr (kPdl) pdl_launch_dependents();
}

}  // namespace ditops

#endif  // __CUDACC__ || __CUDACC_RTC__
