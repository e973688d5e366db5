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
// * No reduction, no accumulation: the order of elements never matters, so every path (vector,
//   scalar, transposed tile) gives identical bits.
//
// Flat kernel (contiguous layout): a grid-stride loop over units (kElems consecutive elements of
// one row: a 16-byte vector, or one element on the scalar path). A thread's units are one grid
// width apart, kUnroll of them per iteration with every load issued before any arithmetic, so each
// thread keeps 3 * kUnroll independent loads in flight. The gate index comes from a (row, col)
// cursor advanced without division.
//
// Transposed kernel (SANA-Video): residual/out are [B, T, H] stored as [B, H, T] (T contiguous),
// update is [B, T, H] (H contiguous). A tile of kTile tokens x kTile channels: update is read along
// H, its product with the gate rounded and parked in shared memory, then residual is read and out
// written along T, so every global access is coalesced. A tile's accesses are kTile-element pieces
// of many rows; the block order decides which pieces are in flight together (see
// kChannelTilesFastest).
#pragma once

#include "common/memory.cuh"
#include "common/types.cuh"
#include "residual_gate_add_params.h"

namespace ditops {

namespace rga_detail {

using namespace ditops::kernel;

// The contract's two roundings, spelled with explicit round-to-nearest operations.
template <typename T>
__device__ __forceinline__ T gated_sum(T r, T u, T g) {
  const float product = round_to<T>(__fmul_rn(to_float(u), to_float(g)));
  return from_float<T>(__fadd_rn(to_float(r), product));
}

// A division-free (row, col) cursor over units: col in [0, row_units).
struct Cursor {
  long long row, col;
  __device__ __forceinline__ void advance(long long step_rows, long long step_units, long long row_units) {
    row += step_rows;
    col += step_units;
    if (col >= row_units) {
      col -= row_units;
      ++row;
    }
  }
};

__device__ __forceinline__ long long divide(long long a, long long b) {
  // 32-bit division where it fits (always, for real tensors): a fraction of the 64-bit cost.
  if (a < 0xffffffffll && b < 0xffffffffll)
    return static_cast<long long>(static_cast<unsigned>(a) / static_cast<unsigned>(b));
  return a / b;
}

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

}  // namespace rga_detail

// kUnits: units per thread per iteration (0: 2 on the vector path, 8 on the scalar one).
// kStreaming: residual and update read with ld.global.cs, out written with st.global.cs
// (evict-first: every byte is touched once). Measured: see the host's key_for.
template <typename T, int kMode, bool kVector, bool kPdl, int kUnits = 0, bool kStreaming = false>
__device__ void residual_gate_add_flat(const ResidualGateAddParams& p) {
  using namespace rga_detail;
  using U = Unit<T, kVector>;
  constexpr int kElems = U::kElems;
  // Bytes in flight: the vector path keeps 2 x 3 x 16 B per thread outstanding (48 registers,
  // 5 resident blocks of 256). H200, 2026-11-29, bf16 row gate, cold L2: 4 units per thread
  // (80 registers, 3 blocks) ran FLUX (1,4608,3072) in 27.2 us, 1-7% behind torch.compile; see
  // bench/results for 2 units. The scalar path moves 2-4 bytes per load and needs more of them.
  constexpr int kUnroll = kUnits > 0 ? kUnits : kVector ? 2 : 8;
  constexpr bool kGateUnit = kMode != kRgaGateToken;  // token mode: one scalar gate per row

  const T* residual = static_cast<const T*>(p.residual);
  const T* update = static_cast<const T*>(p.update);
  const T* gate = static_cast<const T*>(p.gate);
  T* out = static_cast<T*>(p.out);

  const long long threads = static_cast<long long>(gridDim.x) * blockDim.x;
  const long long first = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  Cursor cursor{0, 0};
  if constexpr (kMode != kRgaGateFull) {
    cursor.row = first / p.row_units;
    cursor.col = first - cursor.row * p.row_units;
  }

  if constexpr (kPdl) pdl_wait();

  for (long long base = first; base < p.units; base += kUnroll * threads) {
    U r[kUnroll], u[kUnroll], g[kGateUnit ? kUnroll : 1];
    T g_scalar[kGateUnit ? 1 : kUnroll];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const long long unit = base + k * threads;
      if (unit < p.units) {
        if constexpr (kStreaming) {
          r[k].load_streaming(residual + unit * kElems);
          u[k].load_streaming(update + unit * kElems);
        } else {
          r[k].load(residual + unit * kElems);
          u[k].load(update + unit * kElems);
        }
        if constexpr (kMode == kRgaGateFull) {
          g[k].load(gate + unit * kElems);
        } else if constexpr (kMode == kRgaGateRow) {
          g[k].load(gate + cursor.col * kElems);
        } else if constexpr (kMode == kRgaGateBatch) {
          g[k].load(gate + (divide(cursor.row, p.rows_per_batch) * p.row_units + cursor.col) * kElems);
        } else {
          static_assert(kMode == kRgaGateToken, "gate mode");
          g_scalar[k] = gate[cursor.row];
        }
      }
      if constexpr (kMode != kRgaGateFull) cursor.advance(p.step_rows, p.step_units, p.row_units);
    }
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const long long unit = base + k * threads;
      if (unit < p.units) {
        T o[kElems];
#pragma unroll
        for (int e = 0; e < kElems; ++e) {
          if constexpr (kGateUnit)
            o[e] = gated_sum(r[k].get(e), u[k].get(e), g[k].get(e));
          else
            o[e] = gated_sum(r[k].get(e), u[k].get(e), g_scalar[k]);
        }
        if constexpr (kStreaming && kVector) {
          Word<16> w;
          elements_to_word(o, w);
          store_word_streaming(out + unit * kElems, w);
        } else {
          store_elements<T, kElems, kVector>(out + unit * kElems, o);
        }
      }
    }
  }

  if constexpr (kPdl) pdl_launch_dependents();
}

// kChannelTilesFastest: consecutive blocks take consecutive channel tiles of the same tokens.
// With ~1000 blocks resident (H200) the blocks in flight then read whole update rows and
// ~30-tile runs of every residual row; token tiles fastest would read whole residual rows but
// only 1-2 tiles (128-256 bytes) of each update row. Measured: see the host's transposed_tile.
template <typename T, int kMode, bool kVector, int kTile, bool kPdl, bool kChannelTilesFastest = true>
__device__ void residual_gate_add_transposed(const ResidualGateAddParams& p) {
  using namespace rga_detail;
  constexpr int kElems = kVector ? 16 / static_cast<int>(sizeof(T)) : 1;
  constexpr int kThreads = rga_transposed_threads(kTile, kElems);  // the launch's block size
  constexpr int kLineUnits = kTile / kElems;                       // units along one tile line
  constexpr int kTileUnits = kTile * kLineUnits;
  constexpr int kPerThread = (kTileUnits + kThreads - 1) / kThreads;
  static_assert(kTile % kElems == 0, "tile lines hold whole units");
  // Products as fp32 (exact: they are T values). One word of padding per line keeps the
  // transposed read at most 2-way bank conflicted; shared bandwidth is far from the limit here.
  __shared__ float product[kTile][kTile + 1];  // [token offset][channel offset]

  const long long T_ = p.tokens, H = p.hidden;
  const long long block = blockIdx.x;
  const long long b = block / (p.tiles_t * p.tiles_h);
  const long long tile_in_batch = block - b * p.tiles_t * p.tiles_h;
  const long long h_tile = kChannelTilesFastest ? tile_in_batch % p.tiles_h : tile_in_batch / p.tiles_t;
  const long long t_tile = kChannelTilesFastest ? tile_in_batch / p.tiles_h : tile_in_batch % p.tiles_t;
  const long long h0 = h_tile * kTile, t0 = t_tile * kTile;
  const long long batch_offset = b * T_ * H;
  const T* residual = static_cast<const T*>(p.residual) + batch_offset;  // [H, T] of batch b
  const T* update = static_cast<const T*>(p.update) + batch_offset;      // [T, H] of batch b
  const T* gate = static_cast<const T*>(p.gate);
  T* out = static_cast<T*>(p.out) + batch_offset;

  if constexpr (kPdl) pdl_wait();

  // Every global load first: update units along H (line = token), residual units along T
  // (line = channel); the same (line, unit) split serves both. Units stay packed words: with T
  // arrays ptxas took 64 registers for bf16 (48 for f16) and the bf16 kernel ran at 68 % of a
  // copy against 96 % for f16 (H200, SANA (1,32760,2240), bench/results/.../13-tune).
  using U = Unit<T, kVector>;
  U u[kPerThread], g[kPerThread], r[kPerThread];
  T g_token[kMode == kRgaGateToken ? kPerThread : 1];
#pragma unroll
  for (int k = 0; k < kPerThread; ++k) {
    const int idx = static_cast<int>(threadIdx.x) + k * kThreads;
    if (kTileUnits % kThreads != 0 && idx >= kTileUnits) continue;
    const int line = idx / kLineUnits, offset = (idx % kLineUnits) * kElems;
    const long long t = t0 + line, h = h0 + offset;
    if (t < T_ && h < H) {
      u[k].load(update + t * H + h);
      if constexpr (kMode == kRgaGateFull) {
        g[k].load(gate + batch_offset + t * H + h);
      } else if constexpr (kMode == kRgaGateRow) {
        g[k].load(gate + h);
      } else if constexpr (kMode == kRgaGateBatch) {
        g[k].load(gate + b * H + h);
      } else {
        static_assert(kMode == kRgaGateToken, "gate mode");
        g_token[k] = gate[b * T_ + t];
      }
    }
    const long long rh = h0 + line, rt = t0 + offset;
    if (rh < H && rt < T_) r[k].load(residual + rh * T_ + rt);
  }

#pragma unroll
  for (int k = 0; k < kPerThread; ++k) {
    const int idx = static_cast<int>(threadIdx.x) + k * kThreads;
    if (kTileUnits % kThreads != 0 && idx >= kTileUnits) continue;
    const int line = idx / kLineUnits, offset = (idx % kLineUnits) * kElems;
    if (t0 + line < T_ && h0 + offset < H) {
#pragma unroll
      for (int e = 0; e < kElems; ++e) {
        const T gate_e = kMode == kRgaGateToken ? g_token[kMode == kRgaGateToken ? k : 0] : g[k].get(e);
        product[line][offset + e] = round_to<T>(__fmul_rn(to_float(u[k].get(e)), to_float(gate_e)));
      }
    }
  }
  __syncthreads();

#pragma unroll
  for (int k = 0; k < kPerThread; ++k) {
    const int idx = static_cast<int>(threadIdx.x) + k * kThreads;
    if (kTileUnits % kThreads != 0 && idx >= kTileUnits) continue;
    const int line = idx / kLineUnits, offset = (idx % kLineUnits) * kElems;
    const long long rh = h0 + line, rt = t0 + offset;
    if (rh < H && rt < T_) {
      T o[kElems];
#pragma unroll
      for (int e = 0; e < kElems; ++e)
        o[e] = from_float<T>(__fadd_rn(to_float(r[k].get(e)), product[offset + e][line]));
      store_elements<T, kElems, kVector>(out + rh * T_ + rt, o);
    }
  }

  if constexpr (kPdl) pdl_launch_dependents();
}

}  // namespace ditops
