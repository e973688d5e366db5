// Launch parameters of the gated residual add kernels. Plain data, shared by the host op and the
// device code (built by the host, passed by value as a __grid_constant__ kernel argument).
#pragma once

#include "common/fast_divide.h"  // also DITOPS_HOST_DEVICE

namespace ditops {

// Gate modes (template parameter kMode of the kernels); docs/residual_gate_add.md.
enum : int { kRgaGateFull = 0, kRgaGateRow = 1, kRgaGateToken = 2, kRgaGateBatch = 3, kRgaGateStrided = 4 };

// Field order: the first 48 bytes hold everything the flat kernel of 32-bit indices reads before
// its loads. The parameters start at byte 0x210 of the constant bank on sm_90, so these fields
// share the 64-byte line at 0x200 with the global memory descriptor; the first touch of each line
// is a constant-cache miss the warp waits for. With the 64-bit sizes first, the row divisor sat
// in the line at 0x240 and ptxas loaded it (for the gate's address) before the first load: three
// lines (0x0, 0x200, 0x240) in front of the loads, now two (sm_90a SASS). Measured alone in a
// CUDA graph from a cleared L2 (H200): 0-0.09 us per call, inside the spread.
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
