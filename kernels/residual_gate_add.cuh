// Gated residual add: out = residual + update * gate.
//
// Numerics contract (docs/residual_gate_add.md is the full statement):
// * Every element: p = rne_T(fmul_rn(float(u), float(g))), out = rne_T(fadd_rn(float(r), p)),
//   with T the tensors' dtype. Widening is exact, both roundings are round-to-nearest-even (the
//   PTX cvt.rn of common/types.cuh) and the multiply and the add are explicit __fmul_rn /
//   __fadd_rn, so the compiler cannot contract them into an FMA (NVRTC runs with --fmad=true).
//   That is eager PyTorch's `residual + update * gate` on CUDA (mul and add each compute in fp32
//   and round to the dtype). For fp32, rne_T is the identity: two fp32 roundings, no FMA, which is
//   eager's fp32 result too. Contract: bit_exact against eager PyTorch on CUDA, every dtype.
// * Promoted (an fp32 gate G beside 16-bit T, Wan's `(x.float() + update * gate).type_as(x)`):
//   out = rne_T(fadd_rn(float(r), fmul_rn(float(u), g))): torch's type promotion runs the product
//   and the sum in fp32 (two kernels, no FMA) and only the final .type_as rounds. Flat kernel only.
// * No reduction, no accumulation: the order of elements never matters, so every path (vector,
//   scalar, transposed tile) gives identical bits.
//
// Flat kernel (contiguous layout): a grid-stride loop over units (kElems consecutive elements of
// one row: a 16-byte vector, or one element on the scalar path). A thread's units are one grid
// width apart, kUnroll of them per iteration with every load issued before any arithmetic, so each
// thread keeps 3 * kUnroll independent loads in flight. With one unit per thread the grid covers
// the tensor and (32-bit indices) a single round runs, no loop. Indices are 32-bit unless the host
// needs 64 (kIndex64: 2^31 units or more, the host's flat_index64); a separate kernel each, so a
// launch runs no branch on the width. On 32 bits a thread finds its gate by a multiply and a shift
// (common/fast_divide.h, divisors computed by the host) where a division by a run-time divisor
// takes ~20 instructions through the MUFU reciprocal (64-bit: ~70), which ptxas placed before the
// first load (sm_90a: first load at instruction 25 instead of 39; faster on short calls,
// docs/tuning/residual_gate_add.md).
//
// Transposed kernel (SANA-Video): residual/out are [B, T, H] stored as [B, H, T] (T contiguous),
// update is [B, T, H] (H contiguous). A tile of kTokenTile tokens x kTile channels: update is read
// along H, its product with the gate rounded and parked in shared memory, then residual is read and
// out written along T, so every global access is coalesced. A tile's accesses are pieces of many
// rows (kTile elements of each update row, kTokenTile of each residual line); the block order
// decides which pieces are in flight together (see kChannelTilesFastest). Residual lines off 16
// bytes (odd T) go by aligned 16-byte chunks (see kChunkedResidual). kTokenTile = 2 kTile (aligned
// lines only): two of the three streams (residual, out) in 256-byte pieces instead of 128; measured
// next to transposed_token_tile in the host file.
#pragma once

#include "common/fast_divide.h"  // also DITOPS_HOST_DEVICE

// Launch parameters of the gated residual add kernels. Plain data, shared by the host op and the
// device code (built by the host, passed by value as a __grid_constant__ kernel argument).
namespace ditops {

// Gate modes (template parameter kMode of the kernels); docs/residual_gate_add.md.
enum : int { kRgaGateFull = 0, kRgaGateRow = 1, kRgaGateToken = 2, kRgaGateBatch = 3, kRgaGateStrided = 4 };

// Field order: the first 48 bytes hold everything the flat kernel of 32-bit indices reads before
// its loads. The parameters start at byte 0x210 of the constant bank on sm_90, so these fields
// share the 64-byte line at 0x200 with the global memory descriptor; the first touch of each line
// is a constant-cache miss the warp waits for. With the 64-bit sizes first, the row divisor sat
// in the line at 0x240 and ptxas loaded it (for the gate's address) before the first load: three
// lines (0x0, 0x200, 0x240) in front of the loads, now two (sm_90a SASS; the time moved inside the
// spread: docs/tuning/residual_gate_add.md).
struct ResidualGateAddParams {
  const void* residual;
  const void* update;
  const void* gate;
  // Flat kernel (contiguous layout), counted in units of kElems elements (one 16-byte vector on
  // the vector path, one element on the scalar path); a unit never straddles two rows. The kernel
  // of 32-bit indices (every unit index the grid forms below 2^31: the host's flat_index64) reads
  // these and divides through the two FastDivisors; rga_set_flat_sizes fills them.
  unsigned units32;    // numel / kElems
  unsigned row_units32;  // D / kElems
  FastDivisor row_units_divisor;
  FastDivisor units_per_gate_row_divisor;
  void* out;
  // The same sizes for the kernel of 64-bit indices.
  long long units;
  long long row_units;
  long long units_per_gate_row;  // batch and strided modes: the units of the rows that share one gate row
  long long gate_row_stride;     // strided mode: elements from one gate row to the next (after the
                                 // first constant line: the other modes' kernels read the same lines)
  // Transposed kernel: residual/out [B, T, H] stored as [B, H, T]; update [B, T, H] row-major.
  // A 1-D grid of B * tiles_t * tiles_h blocks (< 2^31), token tiles fastest.
  long long tokens;  // T
  long long hidden;  // H
  long long tiles_t;  // ceil(T / token tile) (one more on chunked lines: the host's token_tiles)
  long long tiles_h;  // ceil(H / tile)
};

// The flat kernel's sizes: the 64-bit fields always; from 1 to 2^31 - 1 units also the
// 32-bit ones and the divisors (the divisor of the gate rows capped at `units`: a batch gate of
// one batch row block covers every unit).
DITOPS_HOST_DEVICE
inline void rga_set_flat_sizes(ResidualGateAddParams& p, long long units, long long row_units,
                               long long units_per_gate_row) {
  p.units = units;
  p.row_units = row_units;
  p.units_per_gate_row = units_per_gate_row;
  if (units >= 1 && units <= 0x7fffffff && row_units >= 1 && units_per_gate_row >= 1) {
    p.units32 = static_cast<unsigned>(units);
    p.row_units32 = static_cast<unsigned>(row_units);
    p.row_units_divisor = fast_divisor(static_cast<unsigned>(row_units));
    p.units_per_gate_row_divisor =
        fast_divisor(static_cast<unsigned>(units_per_gate_row < units ? units_per_gate_row : units));
  }
}

// Threads of a transposed-kernel block: one per 16-byte unit (or element) of a tile, at most 256
// per square of `tile` x `tile` (a token tile twice the channel tile: 512). A 32-tile of 16-bit
// elements has 128 units: a 256-thread block would leave half its threads idle.
DITOPS_HOST_DEVICE
constexpr int rga_transposed_threads(int tile, int elems_per_unit, int token_tile) {
  return token_tile * (tile / elems_per_unit) < 256 * (token_tile / tile) ? token_tile * (tile / elems_per_unit)
                                                                          : 256 * (token_tile / tile);
}

}  // namespace ditops

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

#include "common/fast_divide.h"
#include "common/memory.cuh"
#include "common/types.cuh"

namespace ditops {

namespace rga_detail {

using namespace ditops::kernel;

// The contract's two roundings, spelled with explicit round-to-nearest operations.
template <typename T>
__device__ __forceinline__ T gated_sum(T r, T u, T g) {
  const float product = round_to<T>(__fmul_rn(to_float(u), to_float(g)));
  return from_float<T>(__fadd_rn(to_float(r), product));
}

// The promoted chain's two fp32 operations and its one rounding (an fp32 gate beside 16-bit T).
template <typename T>
__device__ __forceinline__ T gated_sum_promoted(T r, T u, float g) {
  return from_float<T>(__fadd_rn(to_float(r), __fmul_rn(to_float(u), g)));
}

// The rounded products of a transposed tile as kept in shared memory: fp32, or (kAsT) T itself.
template <typename T, bool kAsT>
struct TileProducts {
  using Value = float;
  static __device__ __forceinline__ float rounded(float x) { return round_to<T>(x); }
};
template <typename T>
struct TileProducts<T, true> {
  using Value = T;
  static __device__ __forceinline__ T rounded(float x) { return from_float<T>(x); }
};

// One unit of kElems elements as loaded: a 16-byte vector kept as four packed 32-bit words (16-bit
// elements unpacked into a register each would double the register count of the flat kernel and
// halve its occupancy), or a single element.
template <typename T, bool kVector>
struct Unit {
  static constexpr int kElems = 16 / static_cast<int>(sizeof(T));
  Word<16> word;
  __device__ __forceinline__ void load(const T* p) { word = load_word<16, false>(p); }
  __device__ __forceinline__ void load_streaming(const T* p) { word = load_word_streaming(p); }
  __device__ __forceinline__ T get(int e) const { return word_element<T>(word, e); }
};
template <typename T>
struct Unit<T, false> {
  static constexpr int kElems = 1;
  T value;
  __device__ __forceinline__ void load(const T* p) { value = *p; }
  __device__ __forceinline__ void load_streaming(const T* p) { value = *p; }
  __device__ __forceinline__ T get(int) const { return value; }
};

// The gate values of one unit of kElems elements of T: a Unit of T itself, or (G = float beside
// 16-bit T) the unit's kElems fp32 values, two 16-byte loads on the vector path.
template <typename T, typename G, bool kVector>
struct GateUnit : Unit<T, kVector> {};
template <typename T, bool kVector>
struct GateUnit<T, float, kVector> {
  static_assert(sizeof(T) == 2, "an fp32 gate beside a 16-bit residual");
  static constexpr int kWords = kVector ? 2 : 1;
  Word<16> word[kWords];
  float value;
  __device__ __forceinline__ void load(const float* p) {
    if constexpr (kVector) {
      word[0] = load_word<16, false>(p);
      word[1] = load_word<16, false>(p + 4);
    } else {
      value = *p;
    }
  }
  __device__ __forceinline__ float get(int e) const {
    if constexpr (kVector) return __uint_as_float(word[e / 4].w[e % 4]);
    else return value;
  }
};
template <>
struct GateUnit<float, float, true> : Unit<float, true> {};
template <>
struct GateUnit<float, float, false> : Unit<float, false> {};

// The flat kernel's unit index type.
template <bool kIndex64>
struct FlatIndex {
  using type = unsigned;
};
template <>
struct FlatIndex<true> {
  using type = unsigned long long;
};

// The gate of `unit`: the element offset of its gate vector (of its one gate on token mode).
// 32-bit indices divide through the host's FastDivisors (unit < units < 2^31), 64-bit ones by `/`;
// the offset is formed in 64 bits (numel may pass 2^32 where units do not).
template <int kMode, typename Index>
__device__ __forceinline__ unsigned long long gate_offset(Index unit, Index row_units, Index units_per_gate_row,
                                                          const ResidualGateAddParams& p, int elems) {
  using Offset = unsigned long long;
  constexpr bool kFast = sizeof(Index) == 4;
  if constexpr (kMode == kRgaGateFull) return static_cast<Offset>(unit) * elems;
  const Index row = kFast ? fast_quotient(unit, p.row_units_divisor) : unit / row_units;
  if constexpr (kMode == kRgaGateToken) return row;  // one gate per row
  const Index column = unit - row * row_units;
  if constexpr (kMode == kRgaGateRow) return static_cast<Offset>(column) * elems;
  const Index gate_row = kFast ? fast_quotient(unit, p.units_per_gate_row_divisor) : unit / units_per_gate_row;
  if constexpr (kMode == kRgaGateStrided)
    return static_cast<Offset>(gate_row) * static_cast<Offset>(p.gate_row_stride) + static_cast<Offset>(column) * elems;
  return (static_cast<Offset>(gate_row) * row_units + column) * elems;  // batch
}

template <typename Index, typename T, int kMode, bool kVector, int kUnroll, bool kStreaming, typename G>
__device__ __forceinline__ void flat_units(const ResidualGateAddParams& p) {
  using U = Unit<T, kVector>;
  using GU = GateUnit<T, G, kVector>;
  constexpr int kElems = U::kElems;
  constexpr bool kGateUnit = kMode != kRgaGateToken;  // token mode: one scalar gate per row
  constexpr bool kPromoted = sizeof(G) != sizeof(T);
  const T* residual = static_cast<const T*>(p.residual);
  const T* update = static_cast<const T*>(p.update);
  const G* gate = static_cast<const G*>(p.gate);
  T* out = static_cast<T*>(p.out);
  // The 32-bit kernel reads the sizes of the params' first constant line (ResidualGateAddParams above).
  constexpr bool k32 = sizeof(Index) == 4;
  const Index units = k32 ? static_cast<Index>(p.units32) : static_cast<Index>(p.units);
  const Index row_units = k32 ? static_cast<Index>(p.row_units32) : static_cast<Index>(p.row_units);
  const Index units_per_gate_row = static_cast<Index>(p.units_per_gate_row);  // 64-bit batch mode only
  const Index threads = static_cast<Index>(gridDim.x) * blockDim.x;
  const Index first = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x;

  // One unit per thread on 32-bit indices: the host's grid covers the tensor (at most 2^23
  // blocks), so no grid-stride round follows the first, and its loop's exit path is left out
  // (measurably slower on short calls: docs/tuning/residual_gate_add.md).
  constexpr bool kOneRound = kUnroll == 1 && sizeof(Index) == 4;
  for (Index base = first; base < units; base += kUnroll * threads) {
    U r[kUnroll], u[kUnroll];
    GU g[kGateUnit ? kUnroll : 1];
    G g_scalar[kGateUnit ? 1 : kUnroll];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const Index unit = base + k * threads;
      if (unit < units) {
        if constexpr (kStreaming) {
          r[k].load_streaming(residual + static_cast<unsigned long long>(unit) * kElems);
          u[k].load_streaming(update + static_cast<unsigned long long>(unit) * kElems);
        } else {
          r[k].load(residual + static_cast<unsigned long long>(unit) * kElems);
          u[k].load(update + static_cast<unsigned long long>(unit) * kElems);
        }
        const unsigned long long at = gate_offset<kMode>(unit, row_units, units_per_gate_row, p, kElems);
        if constexpr (kGateUnit) g[k].load(gate + at);
        else g_scalar[k] = gate[at];
      }
    }
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const Index unit = base + k * threads;
      if (unit < units) {
        T o[kElems];
#pragma unroll
        for (int e = 0; e < kElems; ++e) {
          if constexpr (kPromoted && kGateUnit)
            o[e] = gated_sum_promoted(r[k].get(e), u[k].get(e), g[k].get(e));
          else if constexpr (kPromoted)
            o[e] = gated_sum_promoted(r[k].get(e), u[k].get(e), g_scalar[k]);
          else if constexpr (kGateUnit)
            o[e] = gated_sum(r[k].get(e), u[k].get(e), g[k].get(e));
          else
            o[e] = gated_sum(r[k].get(e), u[k].get(e), g_scalar[k]);
        }
        if constexpr (kStreaming && kVector) {
          Word<16> w;
          elements_to_word(o, w);
          store_word_streaming(out + static_cast<unsigned long long>(unit) * kElems, w);
        } else {
          store_elements<T, kElems, kVector>(out + static_cast<unsigned long long>(unit) * kElems, o);
        }
      }
    }
    if constexpr (kOneRound) break;
  }
}

}  // namespace rga_detail

// kUnits: units per thread per iteration (0: 2 on the vector path, 8 on the scalar one).
// kStreaming: residual and update read with ld.global.cs, out written with st.global.cs
// (evict-first: every byte is touched once). Measured: see the host's rga_flat_units.
// kIndex64: 64-bit unit indices and divisions (tensors of 2^31 units or more).
// G: the gate's type, T or (the promoted chain) float beside a 16-bit T.
template <typename T, int kMode, bool kVector, bool kPdl, int kUnits = 0, bool kStreaming = false, bool kIndex64 = false,
          typename G = T>
__device__ void residual_gate_add_flat(const ResidualGateAddParams& p) {
  using namespace rga_detail;
  constexpr int kUnroll = kUnits > 0 ? kUnits : kVector ? 2 : 8;
  if constexpr (kPdl) pdl_wait();
  flat_units<typename FlatIndex<kIndex64>::type, T, kMode, kVector, kUnroll, kStreaming, G>(p);
  if constexpr (kPdl) pdl_launch_dependents();
}

// kVectorResidual: residual and out by 16-byte units along T (needs T % 8 (16-bit) / 4 (fp32) and
// aligned pointers); kVectorUpdate: update and the gate by 16-byte units along H (H % 8 / 4,
// aligned pointers). The update side may be vectorized alone (an odd T), as Inductor's tiled
// kernel does (faster than all-scalar: docs/tuning/residual_gate_add.md).
// kChannelTilesFastest: consecutive blocks take consecutive channel tiles of the same tokens (the
// blocks in flight then read whole update rows) instead of consecutive token tiles (whole
// residual rows). Token tiles fastest won (docs/tuning/residual_gate_add.md, with groups of
// channel tiles).
// kChunkedResidual (with kVectorResidual): residual and out lines that do not start on 16 bytes
// (an odd T, or residual off 16 bytes; out shares residual's offset within 16 bytes, the host
// checks). A line is walked by the aligned 16-byte chunks of memory: the block of token tile i
// takes, on each line, the kTile / kElems chunks that start at t0 - mis (mis: the line's element
// offset from 16 bytes at t0), so consecutive tiles share no chunk and every chunk is one 16-byte
// load and store except where it crosses the line's ends (element stores there; the load of a
// chunk holding one element of the tensor cannot fault: it does not cross a page). A line's
// window reaches up to kElems - 1 tokens before t0: the update side parks kElems more token rows,
// and the token tiles number ceil((T + kElems - 1) / kTile). The residual side reads its line's
// products from row unit * kElems + e + kElems - mis; the products' row stride is kTile + 1, or
// kTile + 3 where T % 4 == 1, so that the lines a warp reads, whose mis step by T, fall in
// distinct banks (at most 2-way conflicts on both sides, as on aligned lines).
template <typename T, int kMode, bool kVectorResidual, int kTile, bool kPdl, bool kVectorUpdate = kVectorResidual,
          bool kChunkedResidual = false, bool kChannelTilesFastest = false, int kTokenTile = kTile>
__device__ void residual_gate_add_transposed(const ResidualGateAddParams& p) {
  using namespace rga_detail;
  static_assert(!kChunkedResidual || (kVectorResidual && kVectorUpdate), "chunks need 16-byte units on both sides");
  constexpr int kElemsR = kVectorResidual ? 16 / static_cast<int>(sizeof(T)) : 1;
  constexpr int kElemsU = kVectorUpdate ? 16 / static_cast<int>(sizeof(T)) : 1;
  static_assert(kElemsR <= kElemsU, "a vectorized residual side needs a vectorized update side");
  static_assert(kTokenTile == kTile || (kTokenTile == 2 * kTile && !kChunkedResidual && !kChannelTilesFastest),
                "a token tile of twice the channel tile on unchunked lines only");
  constexpr int kThreads = rga_transposed_threads(kTile, kElemsR, kTokenTile);  // the launch's block size
  // Units of a tile and per thread: residual/out along T (kTile lines = channels of kTokenTile
  // tokens), update/gate along H (kTokenTile lines = tokens of kTile channels).
  constexpr int kLineUnitsR = kTokenTile / kElemsR, kTileUnitsR = kTile * kLineUnitsR;
  constexpr int kLineUnitsU = kTile / kElemsU, kTileUnitsU = kTokenTile * kLineUnitsU;
  constexpr int kPerThreadR = (kTileUnitsR + kThreads - 1) / kThreads;
  // Token rows the update side reads: the tile's, and on chunked lines kElems before it.
  constexpr int kLeadRows = kChunkedResidual ? kElemsR : 0;
  constexpr int kRowsU = kTokenTile + kLeadRows;
  constexpr int kPerThreadU = (kRowsU * kLineUnitsU + kThreads - 1) / kThreads;
  static_assert(kTile % kElemsU == 0, "tile lines hold whole units");
  // Products as fp32 (exact: they are T values), [token row][channel offset] with a row stride of
  // kTile + 1 (one word of padding keeps the transposed read at most 2-way bank conflicted;
  // shared bandwidth is far from the limit here) or, chunked, kTile + 3 (see above). The tall
  // tile keeps them as T (rounded to T, so the same values): 16.6 KB of shared memory for a bf16
  // 128 x 64 tile where fp32 takes 33 KB, and as fast (docs/tuning/residual_gate_add.md).
  using Products = rga_detail::TileProducts<T, kTokenTile != kTile>;
  using Product = typename Products::Value;
  __shared__ Product product[kRowsU * (kTile + (kChunkedResidual ? 3 : 1))];

  const long long T_ = p.tokens, H = p.hidden;
  // The grid has < 2^31 blocks (the host checks): the block's coordinates in 32-bit divisions.
  const unsigned tiles_t = static_cast<unsigned>(p.tiles_t), tiles_h = static_cast<unsigned>(p.tiles_h);
  const unsigned b = blockIdx.x / (tiles_t * tiles_h);
  const unsigned tile_in_batch = blockIdx.x - b * tiles_t * tiles_h;
  const unsigned h_tile = kChannelTilesFastest ? tile_in_batch % tiles_h : tile_in_batch / tiles_t;
  const unsigned t_tile = kChannelTilesFastest ? tile_in_batch / tiles_h : tile_in_batch % tiles_t;
  const long long h0 = static_cast<long long>(h_tile) * kTile, t0 = static_cast<long long>(t_tile) * kTokenTile;
  const long long batch_offset = static_cast<long long>(b) * T_ * H;
  const T* residual = static_cast<const T*>(p.residual) + batch_offset;  // [H, T] of batch b
  const T* update = static_cast<const T*>(p.update) + batch_offset;      // [T, H] of batch b
  const T* gate = static_cast<const T*>(p.gate);
  T* out = static_cast<T*>(p.out) + batch_offset;
  // Chunked: the element offset from 16 bytes of (channel h0 + c, token t0) is
  // (mis_base + c * T) mod kElems.
  const int t_mod = static_cast<int>(T_ % kElemsR);
  const int mis_base =
      kChunkedResidual
          ? static_cast<int>((reinterpret_cast<unsigned long long>(residual + h0 * T_ + t0) / sizeof(T)) % kElemsR)
          : 0;
  const int stride = kChunkedResidual && t_mod % 4 == 1 ? kTile + 3 : kTile + 1;  // of the product rows

  if constexpr (kPdl) pdl_wait();

  // Every global load first. Units stay packed words: with T arrays ptxas took 64 registers for
  // bf16 (48 for f16) and the bf16 kernel ran at 68 % of a copy against 96 % for f16 (H200, SANA
  // (1,32760,2240), cold).
  using UU = Unit<T, kVectorUpdate>;
  using UR = Unit<T, kVectorResidual>;
  UU u[kPerThreadU], g[kPerThreadU];
  UR r[kPerThreadR];
  T g_token[kMode == kRgaGateToken ? kPerThreadU : 1];
  // Where whole passes of the block cover whole tile lines (all but a 16-byte update side with
  // fewer units than the block has threads), a thread keeps its offset along the line and steps
  // kLinesPerPass lines per unit: one base offset and one stride instead of an address per unit
  // (a scalar 64-tile took 224 registers with per-unit addresses, 64 this way).
  constexpr bool kFixedU = kThreads % kLineUnitsU == 0 && kTileUnitsU % kThreads == 0;
  static_assert(!kChunkedResidual || kFixedU, "chunked tiles keep one unit position per thread");
  constexpr int kLinesPerPassU = kFixedU ? kThreads / kLineUnitsU : 0;
  const int u_line0 = static_cast<int>(threadIdx.x) / kLineUnitsU;
  const int u_offset0 = (static_cast<int>(threadIdx.x) % kLineUnitsU) * kElemsU;
  const long long u_t0 = t0 - kLeadRows;  // the token of update row 0
  const long long u_first = (u_t0 + u_line0) * H + h0 + u_offset0;
  // Where this thread's update unit k lies: its row of the tile (line), its channel offset in the
  // tile, its token, and whether it is inside both the tile and the tensor. The load loop and
  // the product loop below walk the same units.
  struct UpdateUnit {
    int line, offset;
    long long t;
    bool inside;
  };
  const auto update_unit = [&](int k) {
    const int idx = static_cast<int>(threadIdx.x) + k * kThreads;
    UpdateUnit q;
    q.line = kFixedU ? u_line0 + k * kLinesPerPassU : idx / kLineUnitsU;
    q.offset = kFixedU ? u_offset0 : (idx % kLineUnitsU) * kElemsU;
    q.t = u_t0 + q.line;
    const bool in_tile = !(!kFixedU && kTileUnitsU % kThreads != 0 && idx >= kTileUnitsU) &&
                         !(kRowsU * kLineUnitsU % kThreads != 0 && q.line >= kRowsU);
    q.inside = in_tile && q.t >= 0 && q.t < T_ && h0 + q.offset < H;
    return q;
  };
#pragma unroll
  for (int k = 0; k < kPerThreadU; ++k) {
    const UpdateUnit q = update_unit(k);
    if (q.inside) {
      const long long t = q.t, h = h0 + q.offset;
      const long long at = kFixedU ? u_first + k * kLinesPerPassU * H : t * H + h;
      u[k].load(update + at);
      if constexpr (kMode == kRgaGateFull) {
        g[k].load(gate + batch_offset + at);
      } else if constexpr (kMode == kRgaGateRow) {
        g[k].load(gate + h);
      } else if constexpr (kMode == kRgaGateBatch) {
        g[k].load(gate + b * H + h);
      } else {
        static_assert(kMode == kRgaGateToken, "gate mode");
        g_token[k] = gate[b * T_ + t];
      }
    }
  }
  // Residual/out the same way along T (line = channel). Chunked: chunk `r_unit` of a line starts
  // at element t0 - mis + r_unit * kElems.
  constexpr bool kFixedOffset = kThreads % kLineUnitsR == 0 && kTileUnitsR % kThreads == 0;
  static_assert(!kChunkedResidual || kFixedOffset, "chunked lines keep one unit position per thread");
  constexpr int kLinesPerPass = kFixedOffset ? kThreads / kLineUnitsR : 0;
  const int r_line0 = static_cast<int>(threadIdx.x) / kLineUnitsR;
  const int r_unit = static_cast<int>(threadIdx.x) % kLineUnitsR;
  const long long r_t = t0 + r_unit * kElemsR;
  const long long r_first = (h0 + r_line0) * T_ + r_t;
  int r_mis[kChunkedResidual ? kPerThreadR : 1];
#pragma unroll
  for (int k = 0; k < kPerThreadR; ++k) {
    if constexpr (kChunkedResidual) {
      const int line = r_line0 + k * kLinesPerPass;
      r_mis[k] = (mis_base + line * t_mod) & (kElemsR - 1);
      const long long chunk_t = r_t - r_mis[k];  // the token of the chunk's element 0
      if (h0 + line < H && chunk_t + kElemsR > 0 && chunk_t < T_)
        r[k].load(residual + r_first + k * kLinesPerPass * T_ - r_mis[k]);
    } else if constexpr (kFixedOffset) {
      if (h0 + r_line0 + k * kLinesPerPass < H && r_t < T_) r[k].load(residual + r_first + k * kLinesPerPass * T_);
    } else {
      const int idx = static_cast<int>(threadIdx.x) + k * kThreads;
      if (kTileUnitsR % kThreads != 0 && idx >= kTileUnitsR) continue;
      const int line = idx / kLineUnitsR, offset = (idx % kLineUnitsR) * kElemsR;
      const long long rh = h0 + line, rt = t0 + offset;
      if (rh < H && rt < T_) r[k].load(residual + rh * T_ + rt);
    }
  }

#pragma unroll
  for (int k = 0; k < kPerThreadU; ++k) {
    const UpdateUnit q = update_unit(k);
    if (q.inside) {
#pragma unroll
      for (int e = 0; e < kElemsU; ++e) {
        const T gate_e = kMode == kRgaGateToken ? g_token[kMode == kRgaGateToken ? k : 0] : g[k].get(e);
        product[q.line * stride + q.offset + e] =
            Products::rounded(__fmul_rn(to_float(u[k].get(e)), to_float(gate_e)));
      }
    }
  }
  __syncthreads();

#pragma unroll
  for (int k = 0; k < kPerThreadR; ++k) {
    if constexpr (kChunkedResidual) {
      const int line = r_line0 + k * kLinesPerPass;
      if (h0 + line >= H) continue;
      const long long chunk_t = r_t - r_mis[k];
      if (chunk_t + kElemsR <= 0 || chunk_t >= T_) continue;
      T o[kElemsR];
      const Product* products = product + (r_unit * kElemsR + kLeadRows - r_mis[k]) * stride + line;
#pragma unroll
      for (int e = 0; e < kElemsR; ++e)
        o[e] = from_float<T>(__fadd_rn(to_float(r[k].get(e)), to_float(products[e * stride])));
      T* chunk = out + r_first + k * kLinesPerPass * T_ - r_mis[k];
      if (chunk_t >= 0 && chunk_t + kElemsR <= T_) {
        store_elements<T, kElemsR, true>(chunk, o);
      } else {  // the chunk crosses an end of the line: its elements inside, one by one
#pragma unroll
        for (int e = 0; e < kElemsR; ++e)
          if (chunk_t + e >= 0 && chunk_t + e < T_) chunk[e] = o[e];
      }
      continue;
    }
    const int idx = static_cast<int>(threadIdx.x) + k * kThreads;
    if (!kFixedOffset && kTileUnitsR % kThreads != 0 && idx >= kTileUnitsR) continue;
    const int line = kFixedOffset ? r_line0 + k * kLinesPerPass : idx / kLineUnitsR;
    const int offset = kFixedOffset ? static_cast<int>(r_t - t0) : (idx % kLineUnitsR) * kElemsR;
    const long long rh = h0 + line, rt = t0 + offset;
    if (rh < H && rt < T_) {
      T o[kElemsR];
#pragma unroll
      for (int e = 0; e < kElemsR; ++e)
        o[e] = from_float<T>(__fadd_rn(to_float(r[k].get(e)), to_float(product[(offset + e) * stride + line])));
      const long long at = kFixedOffset ? r_first + k * kLinesPerPass * T_ : rh * T_ + rt;
      store_elements<T, kElemsR, kVectorResidual>(out + at, o);
    }
  }

  if constexpr (kPdl) pdl_launch_dependents();
}

}  // namespace ditops

#endif  // __CUDACC__ || __CUDACC_RTC__
