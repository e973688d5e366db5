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
// Three paths (kPath, the host's ccp_path):
// - kCcpAligned (ccp_aligned: 16-byte rows, heads, runs and pointers, as channels-last model
//   shapes are): every window lies in one row's run or one row's zeros, so a window is one load
//   and one store with no shifts, masks or shuffles.
// - kCcpParts (rows of 16 bytes or more, the NCTHW model shapes): the same windows, but each is
//   its row A part and its row B part, each read from its own two aligned granules and shifted,
//   with no ballot, shuffle or branch: every lane runs the same instructions whether its window
//   meets a row end or not (the general path's divergent row-end code was most of the step where
//   rows are short: 108-420-byte rows, 61-78 % of a copy on the H100).
// - kCcpGeneral (everything else: rows under 16 bytes): the shuffle path described above.
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

// Rows the parts kernel serves (unaligned calls): from 16 bytes (a window then meets two rows at
// most) to below kCcpPartsMaxRowBytes. The bound is where the general kernel's warps stop meeting
// a row end in most steps: on the H100 (ccp_tune.cu, 19999c5) it reached 66-78 % of a copy at
// the 108-420-byte NCTHW rows and 90-93 % at 836 and 1284 bytes, where its straight path (about
// 370 instructions a step, sm_90a) costs about what the parts kernel's does without row B and masks
// (about 400). Not measured yet for the parts kernel: ccp_tune.cu prints both kernels at every NCTHW
// case and bench/experiments/ccp_ab_run.sh ditops against ditops:base; move the bound where they cross.
constexpr long long kCcpPartsMinRowBytes = 16;
#ifndef DITOPS_CCP_PARTS_MAX_ROW_BYTES
#define DITOPS_CCP_PARTS_MAX_ROW_BYTES 512
#endif
constexpr long long kCcpPartsMaxRowBytes = DITOPS_CCP_PARTS_MAX_ROW_BYTES;

// The kernel of a call (ccp_finish_params done or not): aligned where ccp_aligned, else parts
// where rows are kCcpPartsMinRowBytes to below kCcpPartsMaxRowBytes, else the general one.
DITOPS_HOST_DEVICE
inline int ccp_path(const CausalConv3dCatPadParams& p) {
  if (ccp_aligned(p)) return kCcpAligned;
  return p.row_bytes >= kCcpPartsMinRowBytes && p.row_bytes < kCcpPartsMaxRowBytes ? kCcpParts : kCcpGeneral;
}

// Windows per lane and step, all their loads issued before the first store: the general kernel
// holds two granules per window in registers (63 registers at 2, the cap of 4 resident blocks of
// 256 threads), the aligned one a single one (48 at 4: 5 blocks). Measurement: PLACEHOLDER
// (bench/experiments/ccp_tune.cu on the H200, docs/causal_conv3d_cat_pad.md).
#ifndef DITOPS_CCP_UNROLL_GENERAL
#define DITOPS_CCP_UNROLL_GENERAL 2  // bench/experiments/ccp_tune.cu builds other values
#endif
#ifndef DITOPS_CCP_UNROLL_ALIGNED
#define DITOPS_CCP_UNROLL_ALIGNED 4
#endif
// The parts kernel holds four granules per window (two per row part): at 2 windows 78 registers
// at 3 blocks of 256 (capped at 64 it spills 32-56 bytes; ptxas 13.0, sm_90a). Measurement: not
// run yet (ccp_tune.cu's parts rows: 2 windows at 3 blocks, 1 at 4).
#ifndef DITOPS_CCP_UNROLL_PARTS
#define DITOPS_CCP_UNROLL_PARTS 2
#endif
constexpr int kCcpUnrollGeneral = DITOPS_CCP_UNROLL_GENERAL;
constexpr int kCcpUnrollAligned = DITOPS_CCP_UNROLL_ALIGNED;
constexpr int kCcpUnrollParts = DITOPS_CCP_UNROLL_PARTS;

// Windows per lane and step of a kernel.
DITOPS_HOST_DEVICE constexpr int ccp_unroll(int path) {
  return path == kCcpAligned ? kCcpUnrollAligned : path == kCcpParts ? kCcpUnrollParts : kCcpUnrollGeneral;
}

// Which steps a warp takes: 0, one contiguous range (its frame pair changes about once per
// frame); 1, the steps of its block's turn in a grid-stride walk (the grid's warps on
// neighbouring memory at a time, a frame pair per step where frames are shorter than the walk's
// stride). Measurement: PLACEHOLDER (bench/experiments/ccp_tune.cu).
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

// The source row of out row r, or NULL for a zero row (no source frame or row, or W = 0).
template <bool kIndex64>
__device__ __forceinline__ const unsigned char* source_row(const CausalConv3dCatPadParams& p,
                                                           typename IndexOf<kIndex64>::type r) {
  using I = typename IndexOf<kIndex64>::type;
  const I th = quotient<kIndex64>(r, p.rows_out_div, p.rows_out_div64);
  const I h = r - th * static_cast<I>(p.rows_out);
  const I n = quotient<kIndex64>(th, p.frames_out_div, p.frames_out_div64);
  const I t = th - n * static_cast<I>(p.frames_out);
  const I st = t - static_cast<I>(p.frame_offset), ih = h - static_cast<I>(p.row_offset);
  const I ct = static_cast<I>(p.cache_frames), tx = static_cast<I>(p.x_frames);
  if (st < 0 || st >= ct + tx || ih < 0 || ih >= static_cast<I>(p.src_rows) || p.run_bytes == 0) return nullptr;
  const bool from_cache = st < ct;
  const unsigned char* base = static_cast<const unsigned char*>(from_cache ? p.cache : p.x);
  const I row = (n * (from_cache ? ct : tx) + (from_cache ? st : st - ct)) * static_cast<I>(p.src_rows) + ih;
  return base + row * static_cast<I>(p.run_bytes);  // within x or cache: below 2^31 in the 32-bit kernel
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
// (ccp_path: kCcpGeneral, kCcpAligned or kCcpParts), kIndex64 for outs of kCcpIndex32Bytes or
// more. Any grid of whole warps: each warp takes steps of ccp_unroll(kPath) x 32 windows in
// kCcpStepOrder's order.
template <int kBytes, int kPath, bool kPdl, bool kIndex64>
__device__ void causal_conv3d_cat_pad(const CausalConv3dCatPadParams& p) {
  using namespace ccp_detail;
  using I = typename IndexOf<kIndex64>::type;
  static_assert(kBytes == 2 || kBytes == 4, "2- or 4-byte elements");
  static_assert(kPath == kCcpGeneral || kPath == kCcpAligned || kPath == kCcpParts, "a kernel of ccp_path");
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
