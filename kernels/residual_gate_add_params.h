// Launch parameters of the gated residual add kernels. Plain data, shared by the host op and the
// device code (built by the host, passed by value as a __grid_constant__ kernel argument).
#pragma once

#include "common/fast_divide.h"  // also DITOPS_HOST_DEVICE

namespace ditops {

// Gate modes (template parameter kMode of the kernels); docs/residual_gate_add.md.
enum : int { kRgaGateFull = 0, kRgaGateRow = 1, kRgaGateToken = 2, kRgaGateBatch = 3 };

struct ResidualGateAddParams {
  const void* residual;
  const void* update;
  const void* gate;
  void* out;
  // Flat kernel (contiguous layout), counted in units of kElems elements (one 16-byte vector on
  // the vector path, one element on the scalar path); a unit never straddles two rows.
  long long units;               // numel / kElems
  long long row_units;           // D / kElems
  long long units_per_gate_row;  // batch mode: the units of the rows that share one gate row
  // The kernel of 32-bit indices (every unit index the grid forms below 2^31: the host's
  // flat_index64) divides by row_units and units_per_gate_row through these.
  FastDivisor row_units_divisor;
  FastDivisor units_per_gate_row_divisor;
  // Transposed kernel: residual/out [B, T, H] stored as [B, H, T]; update [B, T, H] row-major.
  // A 1-D grid of B * tiles_t * tiles_h blocks (< 2^31), token tiles fastest.
  long long tokens;  // T
  long long hidden;  // H
  long long tiles_t;  // ceil(T / token tile) (one more on chunked lines: the host's token_tiles)
  long long tiles_h;  // ceil(H / tile)
};

// Threads of a transposed-kernel block: one per 16-byte unit (or element) of a tile, at most 256
// per square of `tile` x `tile` (a token tile twice the channel tile: 512). A 32-tile of 16-bit
// elements has 128 units: a 256-thread block would leave half its threads idle.
DITOPS_HOST_DEVICE
constexpr int rga_transposed_threads(int tile, int elems_per_unit, int token_tile) {
  return token_tile * (tile / elems_per_unit) < 256 * (token_tile / tile) ? token_tile * (tile / elems_per_unit)
                                                                          : 256 * (token_tile / tile);
}

}  // namespace ditops
