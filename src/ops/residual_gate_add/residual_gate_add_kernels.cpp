#include "ops/residual_gate_add/residual_gate_add_kernels.h"

#include "kernels/residual_gate_add_params.h"

namespace ditops {

const char* gate_mode_name(GateMode mode) {
  switch (mode) {
    case GateMode::full: return "full";
    case GateMode::row: return "row";
    case GateMode::token: return "token";
    case GateMode::batch: return "batch";
    case GateMode::strided: return "strided";
  }
  return "?";
}

std::string RgaKernelKey::to_string() const {
  return std::string(dtype_name(dtype)) + "," + gate_mode_name(mode) + "," +
         (transposed ? "transposed" +
                           (tokens_per_tile() != tile ? std::to_string(tokens_per_tile()) + "x" : std::string()) +
                           std::to_string(tile)
                     : std::string("flat")) +
         (vector                          ? ",vec16"
          : transposed && chunked_residual ? ",chunk16"
          : transposed && vector_update    ? ",update16"
                                           : ",scalar") +
         (one_wave ? ",one_wave" : "") + (index64 ? ",index64" : "") + (gate_f32 ? ",gate_f32" : "") +
         (pdl ? ",pdl" : ",nopdl");
}

uint64_t RgaKernelKey::packed() const {
  uint64_t v = static_cast<uint64_t>(dtype);
  v = v * 8 + static_cast<uint64_t>(mode);
  v = v * 2 + transposed;
  v = v * 2 + vector;
  v = v * 128 + static_cast<uint64_t>(tile);
  v = v * 2 + (tokens_per_tile() != tile);
  v = v * 2 + one_wave;
  v = v * 2 + index64;
  v = v * 2 + vector_update;
  v = v * 2 + chunked_residual;
  v = v * 2 + gate_f32;
  v = v * 2 + pdl;
  return v;
}

namespace {
const char* mode_constant(GateMode m) {
  switch (m) {
    case GateMode::full: return "ditops::kRgaGateFull";
    case GateMode::row: return "ditops::kRgaGateRow";
    case GateMode::token: return "ditops::kRgaGateToken";
    case GateMode::batch: return "ditops::kRgaGateBatch";
    case GateMode::strided: return "ditops::kRgaGateStrided";
  }
  return "?";
}
}  // namespace

int rga_flat_units(const RgaKernelKey& key) {
  // H200, FLUX (1,4608,3072) bf16 cold: one 16-byte unit per thread 25.4 us (106 % of a copy),
  // 2-4 units 25.8-27.2. The scalar path keeps 8 in flight, except within one resident wave:
  // (2,33,65) one element per thread 1.10 us against 1.76 (rotated). docs/tuning/residual_gate_add.md.
  return key.vector || key.one_wave ? 1 : 8;
}

// The transposed kernel has no __launch_bounds__ minimum of blocks: ptxas took 58 registers for
// the bf16 64-tile of 16-byte units (nvcc -Xptxas -v, sm_90a), 4 blocks of 256 threads per SM.
// Minima of 4 / 5 / 6 blocks at SANA (1,32760,2240) bf16 rotated: 108.0-110.3 us against
// 108.6-109.0 without (docs/tuning/residual_gate_add.md).
int rga_block_threads(const RgaKernelKey& key) {
  if (!key.transposed) return kRgaThreads;
  const int elems = key.vector || key.chunked_residual ? 16 / static_cast<int>(dtype_size(key.dtype)) : 1;
  return rga_transposed_threads(key.tile, elems, key.tokens_per_tile());
}

jit::KernelRequest rga_kernel_request(const RgaKernelKey& key) {
  jit::KernelRequest r;
  r.header = "residual_gate_add.cuh";
  r.function = key.transposed ? "ditops::residual_gate_add_transposed" : "ditops::residual_gate_add_flat";
  const bool vector_residual = key.vector || (key.transposed && key.chunked_residual);
  r.template_args = std::string(jit::kernel_type_name(key.dtype)) + ", " + mode_constant(key.mode) + ", " +
                    jit::kernel_bool(vector_residual) +
                    (key.transposed ? ", " + std::to_string(key.tile) : std::string()) + ", " + jit::kernel_bool(key.pdl);
  if (!key.transposed)
    r.template_args += ", " + std::to_string(rga_flat_units(key)) + ", false, " + jit::kernel_bool(key.index64) +
                       (key.gate_f32 ? ", float" : "");
  else
    r.template_args += std::string(", ") + jit::kernel_bool(key.vector || key.vector_update) + ", " +
                       jit::kernel_bool(key.chunked_residual && !key.vector) +
                       (key.tokens_per_tile() != key.tile ? ", false, " + std::to_string(key.tokens_per_tile()) : std::string());
  r.params_type = "ditops::ResidualGateAddParams";
  r.max_threads = rga_block_threads(key);
  r.template_key = "residual_gate_add:" + key.to_string();
  return r;
}

}  // namespace ditops
