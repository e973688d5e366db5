// The template key of the gated residual add kernels and the kernel request it maps to. Pure data.
#pragma once

#include <cstdint>
#include <string>

#include "ditops/residual_gate_add.h"
#include "jit/kernel_request.h"

namespace ditops {

struct RgaKernelKey {
  DType dtype = DType::bf16;
  GateMode mode = GateMode::row;
  bool transposed = false;
  bool vector = true;  // 16-byte accesses
  int tile = 0;        // transposed: channels per tile (16, 32 or 64); 0 for the flat kernel
  int token_tile = 0;  // transposed: tokens per tile, `tile` or 2 * `tile` (16-byte units, unchunked); 0 = `tile`
  bool one_wave = false;  // flat scalar path over at most one wave of resident threads
  bool index64 = false;   // flat: 64-bit unit indices (2^31 units or more; flat_index64)
  bool vector_update = false;  // transposed: update and gate by 16-byte units (true with vector)
  bool chunked_residual = false;  // transposed: residual/out by the aligned 16-byte chunks of each line
  bool gate_f32 = false;  // flat: an fp32 gate beside 16-bit data (the promoted chain)
  bool pdl = true;

  // "bf16,row,flat,vec16,pdl" / "bf16,row,transposed64,vec16,pdl" / "...,transposed128x64,vec16,pdl" /
  // "...,transposed64,chunk16,pdl" / "...,transposed32,update16,pdl" / "bf16,strided,flat,vec16,gate_f32,pdl"
  std::string to_string() const;
  uint64_t packed() const;  // unique small integer (memo key)
  int tokens_per_tile() const { return token_tile > 0 ? token_tile : tile; }
};

// Flat kernel blocks: 256 threads; 128 measured the same at every shape
// (docs/tuning/residual_gate_add.md).
constexpr int kRgaThreads = 256;

// Whether a flat call of `units` units needs the kernel of 64-bit indices: the 32-bit one divides
// unit indices below `units` through FastDivisors, exact below 2^31 (kernels/common/fast_divide.h),
// and its grid-stride index stays below units + 8 x (threads of a resident grid) < 2^32.
constexpr bool flat_index64(int64_t units) { return units > int64_t{0x7fffffff}; }

KernelRequest rga_kernel_request(const RgaKernelKey& key);
// Units (16-byte vectors, or single elements on the scalar path) per thread and iteration of
// the flat kernel; with one unit the grid covers the tensor once (no grid-stride rounds).
int rga_flat_units(const RgaKernelKey& key);
// Threads per block: kRgaThreads for the flat kernel; one per unit of a tile (at most 256 per
// square of `tile`) for the transposed one (rga_transposed_threads, shared with the kernel).
int rga_block_threads(const RgaKernelKey& key);

}  // namespace ditops
