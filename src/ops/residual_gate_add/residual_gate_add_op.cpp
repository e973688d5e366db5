// residual_gate_add: argument matching, the registry entries (provenance, capability, contract,
// predicate) and the launch of the flat and transposed kernels.
#include <algorithm>
#include <mutex>
#include <unordered_map>

#include "core/enum_name.h"
#include "core/builtin_ops.h"
#include "core/implementation.h"
#include "core/matcher.h"
#include "core/op_builder.h"
#include "ditops/residual_gate_add.h"
#include "jit/cuda_driver.h"
#include "jit/jit.h"
#include "jit/kernel_family.h"
#include "kernels/residual_gate_add.cuh"
#include "ops/residual_gate_add/residual_gate_add_kernels.h"

namespace ditops {

// ---------------------------------------------------------------- the kernel key and its request

const char* gate_mode_name(GateMode mode) { return enumerator_name(mode); }

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
  return pack_key({dtype, {mode, 5}, transposed, vector, {tile, 128}, tokens_per_tile() != tile, one_wave, index64,
                   vector_update, chunked_residual, gate_f32, pdl});
}

namespace {
// The kernel's gate-mode constant (kernels/residual_gate_add.cuh).
constexpr auto kModeConstants = enum_texts<GateMode>(
    {{GateMode::full, "ditops::kRgaGateFull"}, {GateMode::row, "ditops::kRgaGateRow"},
     {GateMode::token, "ditops::kRgaGateToken"}, {GateMode::batch, "ditops::kRgaGateBatch"},
     {GateMode::strided, "ditops::kRgaGateStrided"}});
}  // namespace

int rga_flat_units(const RgaKernelKey& key) {
  // One 16-byte unit per thread (fastest of 1-4); the scalar path keeps 8 in flight, except within
  // one resident wave, where one element per thread is faster (docs/tuning/residual_gate_add.md).
  return key.vector || key.one_wave ? 1 : 8;
}

// The transposed kernel has no __launch_bounds__ minimum of blocks: ptxas' choice (58 registers
// for the bf16 64-tile, 4 blocks of 256 threads per SM) was as fast as minima of 4 to 6 blocks
// (docs/tuning/residual_gate_add.md).
int rga_block_threads(const RgaKernelKey& key) {
  if (!key.transposed) return kRgaThreads;
  const int elems = key.vector || key.chunked_residual ? 16 / static_cast<int>(dtype_size(key.dtype)) : 1;
  return rga_transposed_threads(key.tile, elems, key.tokens_per_tile());
}

KernelRequest rga_kernel_request(const RgaKernelKey& key) {
  const bool vector_residual = key.vector || (key.transposed && key.chunked_residual);
  KernelRequest r{.header = "residual_gate_add.cuh",
                  .params_type = "ditops::ResidualGateAddParams",
                  .max_threads = rga_block_threads(key),
                  .template_key = "residual_gate_add:" + key.to_string()};
  if (!key.transposed) {
    r.function = "ditops::residual_gate_add_flat";
    r.template_args = jit::kernel_args(key.dtype, kModeConstants(key.mode), vector_residual, key.pdl,
                                       rga_flat_units(key), false, key.index64) +
                      (key.gate_f32 ? ", float" : "");
    return r;
  }
  r.function = "ditops::residual_gate_add_transposed";
  r.template_args = jit::kernel_args(key.dtype, kModeConstants(key.mode), vector_residual, key.tile, key.pdl,
                                     key.vector || key.vector_update, key.chunked_residual && !key.vector);
  if (key.tokens_per_tile() != key.tile) r.template_args += ", " + jit::kernel_args(false, key.tokens_per_tile());
  return r;
}

namespace {

constexpr const char* kOp = "residual_gate_add";
// The promoted chain's oracle: diffusers' Wan gated residuals (WanTransformerBlock.forward).
constexpr const char* kPromotedOracle =
    "with an f32 gate beside bf16/f16 residual and update: diffusers 0.42.1 Wan's eager `(residual.float() + "
    "update * gate).type_as(residual)` (and `(residual.float() + update.float() * gate).type_as(residual)`) on "
    "CUDA, PyTorch 2.11: the product and the sum in fp32, one rounding to residual's dtype";

std::string shape_string(const TensorView& t) {
  std::string s = "[";
  for (int d = 0; d < t.rank; ++d) s += (d ? ", " : "") + std::to_string(t.shape[d]);
  return s + "]";
}

void require_contiguous(const Matcher& m, const TensorView& t, const std::string& name, const std::string& why) {
  int64_t expected = 0;
  const int d = dense_layout_mismatch(t, nullptr, &expected);
  if (d >= 0)
    m.fail(name + ".stride(" + std::to_string(d) + ") must be " + std::to_string(expected) + " (" + why +
           ") but is " + std::to_string(t.strides[d]) + " (" + t.describe() + ")");
}

void require_disjoint(const Matcher& m, const TensorView& out, const TensorView& in, const char* name) {
  if (memory_overlaps(out, in))
    m.fail(std::string("out must not overlap ") + name + " (in place is not supported: out is written while " +
           name + " is read); pass a separate buffer");
}

// Classifies the gate against residual (both rank R, D = the last extent). Fails naming the first
// dimension that fits no mode.
GateMode classify_gate(const Matcher& m, const TensorView& residual, const TensorView& gate, int64_t* rows_per_batch) {
  const int R = residual.rank;
  if (gate.rank != R)
    m.fail("gate must have rank " + std::to_string(R) + " (as residual) but has rank " + std::to_string(gate.rank) +
           " (" + gate.describe() + ")");
  const int64_t D = residual.shape[R - 1];
  auto modes = [&] {  // built only for a message: matching runs on every call
    return "gate " + shape_string(gate) + " for residual " + shape_string(residual) +
           " must be full (same shape), row [1, ..., 1, D], per-token [..., 1] or batch [B, 1, ..., 1, D]";
  };
  *rows_per_batch = 0;
  bool same = true;
  for (int d = 0; d < R; ++d) same = same && gate.shape[d] == residual.shape[d];
  if (same) return GateMode::full;
  if (gate.shape[R - 1] == D) {
    bool all_ones = true;
    for (int d = 0; d < R - 1; ++d) all_ones = all_ones && gate.shape[d] == 1;
    if (all_ones) return GateMode::row;
    // Batch broadcast: the leading dims are a prefix of residual's, then only 1s.
    int k = 0;
    while (k < R - 1 && gate.shape[k] == residual.shape[k]) ++k;
    int64_t rpb = 1;
    for (int d = k; d < R - 1; ++d) {
      if (gate.shape[d] == 1) {
        rpb *= residual.shape[d];
        continue;
      }
      if (d == k)
        m.fail("gate.shape[" + std::to_string(d) + "] must be 1 or " + std::to_string(residual.shape[d]) +
               " (as residual.shape[" + std::to_string(d) + "]) but is " + std::to_string(gate.shape[d]) + ": " + modes());
      m.fail("gate.shape[" + std::to_string(d) + "] must be 1 (after gate.shape[" + std::to_string(k) +
             "] broadcasts, every leading dim does) but is " + std::to_string(gate.shape[d]) + ": " + modes());
    }
    *rows_per_batch = rpb;
    return GateMode::batch;
  }
  if (gate.shape[R - 1] == 1) {
    for (int d = 0; d < R - 1; ++d)
      if (gate.shape[d] != residual.shape[d])
        m.fail("gate.shape[" + std::to_string(d) + "] must be " + std::to_string(residual.shape[d]) +
               " (a per-token gate [..., 1] has residual's leading dims) but is " + std::to_string(gate.shape[d]) +
               ": " + modes());
    return GateMode::token;
  }
  m.fail("gate.shape[" + std::to_string(R - 1) + "] must be " + std::to_string(D) + " (as residual.shape[" +
         std::to_string(R - 1) + "]) or 1 (per-token) but is " + std::to_string(gate.shape[R - 1]) + ": " + modes());
}

// A full or batch gate that is not contiguous: its gate rows (the leading dims that are not
// broadcast, flattened) must be one stride apart, as in a chunk of an adaLN projection
// ([B, 6, D].chunk(6, 1), [B, S, 6, D].chunk(6, 2) squeezed). Returns that stride in elements.
int64_t gate_row_stride(const Matcher& m, const TensorView& gate) {
  const int R = gate.rank;
  const char* why = " (a non-contiguous gate takes one stride between its rows of D, as a chunk of [B, 6, D] has)";
  if (gate.shape[R - 1] > 1 && gate.strides[R - 1] != 1)
    m.fail("gate.stride(" + std::to_string(R - 1) + ") must be 1" + why + " but is " + std::to_string(gate.strides[R - 1]));
  int64_t stride = -1, expected = 0;
  for (int d = R - 2; d >= 0; --d) {
    if (gate.shape[d] == 1) continue;
    if (stride < 0) {
      stride = gate.strides[d];
      if (stride < 0)
        m.fail("gate.stride(" + std::to_string(d) + ") must be >= 0" + why + " but is " + std::to_string(stride));
    } else if (gate.strides[d] != expected) {
      m.fail("gate.stride(" + std::to_string(d) + ") must be " + std::to_string(expected) + why + " but is " +
             std::to_string(gate.strides[d]) + " (" + gate.describe() + ")");
    }
    expected = gate.strides[d] * gate.shape[d];
  }
  return stride < 0 ? gate.shape[R - 1] : stride;
}

void complete(ResidualGateAddCall& call, Matcher& m);  // the op's own rules, after the slots'

// The op described once: its slots state the checks every call gets (core/op_builder.h).
OpBuilder<ResidualGateAddCall> describe() {
  using C = ResidualGateAddCall;
  OpBuilder<C> b(kOp, "out = residual + update * gate with eager rounding",
                 "residual/update [..., D] (rank >= 2, contiguous, or SANA's transposed [B, T, H] "
                 "residual); gate full, row [1, .., D], per-token [..., 1] or batch [B, 1, .., D] "
                 "(full and batch gates may be row-strided views: adaLN chunks), residual's dtype "
                 "or f32 beside 16-bit data (Wan's promoted chain); "
                 "out takes residual's shape and strides and must not overlap an input. "
                 "include/ditops/residual_gate_add.h, docs/residual_gate_add.md");
  b.dims("B=1,S=4608,D=3072");
  // Any rank >= 2, a gate in broadcast classes, two layouts and no in-place call: the shapes, the
  // gate's dtype and the overlaps are the op's own rules (complete).
  b.tensor<&C::residual>({.dtypes = "bf16|f16|f32", .shape = "B,S,D", .own = "shape"});
  b.tensor<&C::update>({.dtypes = "=residual", .shape = "B,S,D", .own = "shape"});
  b.tensor<&C::gate>({.dtypes = "=residual|f32", .shape = "B,1,D", .own = "shape,dtype"});
  b.tensor<&C::out>({.role = TensorRole::out, .keyword = true, .dtypes = "=residual", .shape = "B,S,D",
                     .alloc = "strided:residual", .own = "shape,overlap"});
  b.pdl_option<&ResidualGateAddOptions::use_pdl>();
  b.complete(complete);
  return b;
}

void complete(ResidualGateAddCall& call, Matcher& m) {
  // The gate: residual's dtype, or f32 beside a 16-bit residual (the promoted chain).
  const bool gate_f32 = call.gate.dtype == DType::f32 && call.residual.dtype != DType::f32;
  if (!gate_f32 && call.gate.dtype != call.residual.dtype)
    m.fail(std::string("gate.dtype must be ") + dtype_name(call.residual.dtype) + " (as residual)" +
           (call.residual.dtype != DType::f32 ? " or f32 (promoted: residual + update * gate in float32, one rounding)"
                                               : "") +
           " but is " + dtype_name(call.gate.dtype));
  const int R = call.residual.rank;
  if (R < 2)
    m.fail("residual must have rank >= 2 but has rank " + std::to_string(R) + " (" + call.residual.describe() + ")");
  auto same_shape = [&](const TensorView& t, const char* name) {
    if (t.rank != R)
      m.fail(std::string(name) + " must have rank " + std::to_string(R) + " (as residual) but has rank " +
             std::to_string(t.rank) + " (" + t.describe() + ")");
    for (int d = 0; d < R; ++d)
      if (t.shape[d] != call.residual.shape[d])
        m.fail(std::string(name) + ".shape[" + std::to_string(d) + "] must be " +
               std::to_string(call.residual.shape[d]) + " (as residual.shape[" + std::to_string(d) + "]) but is " +
               std::to_string(t.shape[d]));
  };
  same_shape(call.update, "update");
  same_shape(call.out, "out");
  for (int d = 0; d < R; ++d)
    if (call.residual.shape[d] != 1 && call.out.strides[d] != call.residual.strides[d])
      m.fail("out.stride(" + std::to_string(d) + ") must be " + std::to_string(call.residual.strides[d]) +
             " (as residual.stride(" + std::to_string(d) + "): out takes residual's strides) but is " +
             std::to_string(call.out.strides[d]));

  // Layout: contiguous, or SANA-Video's transposed residual stream.
  int64_t expected = 0;
  const int bad = dense_layout_mismatch(call.residual, nullptr, &expected);
  if (bad >= 0) {
    const int64_t T = call.residual.shape[R == 3 ? 1 : 0], H = call.residual.shape[R - 1];
    const bool transposed = R == 3 && (call.residual.shape[0] == 1 || call.residual.strides[0] == T * H) &&
                            (T == 1 || call.residual.strides[1] == 1) && (H == 1 || call.residual.strides[2] == T);
    if (!transposed)
      m.fail("residual.stride(" + std::to_string(bad) + ") must be " + std::to_string(expected) +
             " (contiguous; the one strided layout taken is the transposed [B, T, H] with strides (T*H, 1, T)) "
             "but is " + std::to_string(call.residual.strides[bad]) + " (" + call.residual.describe() + ")");
    call.transposed = true;
    call.batch = call.residual.shape[0];
    call.tokens = T;
    call.hidden = H;
  }
  require_contiguous(m, call.update, "update",
                     call.transposed ? "contiguous [B, T, H] beside a transposed residual" : "contiguous");
  int64_t rows_per_batch = 0;
  GateMode mode = classify_gate(m, call.residual, call.gate, &rows_per_batch);
  int64_t row_stride = 0;
  int64_t unused = 0;
  if ((mode == GateMode::full || mode == GateMode::batch) &&
      dense_layout_mismatch(call.gate, nullptr, &unused) >= 0) {
    // A row-strided view (an adaLN chunk): one gate row per token (full) or per batch row block.
    if (call.transposed)
      m.fail("gate must be contiguous beside a transposed residual (a strided gate takes the contiguous layout) but "
             "is " + call.gate.describe());
    row_stride = gate_row_stride(m, call.gate);
    rows_per_batch = mode == GateMode::full ? 1 : rows_per_batch;
    mode = GateMode::strided;
  } else {
    require_contiguous(m, call.gate, "gate", "contiguous");
  }
  if (gate_f32 && call.transposed)
    m.fail(std::string("gate.dtype must be ") + dtype_name(call.residual.dtype) +
           " (as residual: an f32 gate takes the contiguous layout, not the transposed one) but is f32");

  call.numel = call.residual.numel();
  if (call.numel > 0) {
    require_disjoint(m, call.out, call.residual, "residual");
    require_disjoint(m, call.out, call.update, "update");
    require_disjoint(m, call.out, call.gate, "gate");
  }
  call.gate_mode = mode;
  call.width = call.residual.shape[R - 1];
  call.rows = call.width ? call.numel / call.width : 0;
  call.rows_per_batch = rows_per_batch;
  call.gate_row_stride = row_stride;
  call.gate_f32 = gate_f32;
  const int64_t elems = 16 / static_cast<int64_t>(dtype_size(call.residual.dtype));
  // A unit's gate values: 16 bytes (32 for an f32 gate beside 16-bit data), each gate row starting
  // on 16 bytes.
  const bool gate_vector =
      is_aligned(call.gate.data, 16) &&
      (mode != GateMode::strided || row_stride * static_cast<int64_t>(dtype_size(call.gate.dtype)) % 16 == 0);
  const bool update_side = is_aligned(call.update.data, 16) && (mode == GateMode::token || gate_vector);
  const bool residual_side = is_aligned(call.residual.data, 16) && is_aligned(call.out.data, 16);
  call.aligned16 = update_side && residual_side &&
                   (call.transposed ? call.tokens % elems == 0 && call.hidden % elems == 0 : call.width % elems == 0);
  call.update_aligned16 = call.transposed && update_side && call.hidden % elems == 0;
  const auto r_addr = reinterpret_cast<uintptr_t>(call.residual.data);
  const auto o_addr = reinterpret_cast<uintptr_t>(call.out.data);
  call.residual_chunks16 =
      call.update_aligned16 && !call.aligned16 && (r_addr > o_addr ? r_addr - o_addr : o_addr - r_addr) % 16 == 0;
}

// Token tiles of the transposed kernel: chunked lines reach up to kElems - 1 tokens before their
// tile, so one more tile may be needed at the end (kernels/residual_gate_add.cuh).
int64_t token_tiles(const ResidualGateAddCall& c, int64_t tile, bool chunked) {
  const int64_t lead = chunked ? 16 / static_cast<int64_t>(dtype_size(c.residual.dtype)) - 1 : 0;
  return (c.tokens + lead + tile - 1) / tile;
}

// Blocks of the transposed kernel with 32-tiles, the most any call launches (16-tiles are taken
// only below two 32-tiles per SM): the launch takes a 1-D grid.
int64_t transposed_blocks(const ResidualGateAddCall& c) {
  return c.batch * token_tiles(c, 32, c.residual_chunks16) * ((c.hidden + 31) / 32);
}
bool transposed_grid_fits(const ResidualGateAddCall& c) { return !c.transposed || transposed_blocks(c) <= 0x7fffffff; }

// Tiles of 64 unless that leaves fewer than two blocks per SM (small transposed calls): then 32
// (128-thread blocks for 16-bit vectors: rga_block_threads). Residual lines off 16 bytes (odd T,
// residual off 16 bytes) beside a 16-byte update side are walked by aligned chunks in 64-tiles
// where there are two 64-tiles per SM; below that, and beside a scalar update side, the residual
// side is scalar in 32-tiles (16 below two 32-tiles per SM): each the fastest measured in its
// range (docs/tuning/residual_gate_add.md).
int64_t transposed_tiles(const ResidualGateAddCall& c, int64_t tile) {
  return c.batch * ((c.tokens + tile - 1) / tile) * ((c.hidden + tile - 1) / tile);
}

int64_t two_per_sm(int multiprocessors) { return 2 * static_cast<int64_t>(std::max(multiprocessors, 1)); }

bool chunked_residual(const ResidualGateAddCall& c, int multiprocessors) {
  return c.residual_chunks16 && transposed_tiles(c, 64) >= two_per_sm(multiprocessors);
}

int transposed_tile(const ResidualGateAddCall& c, int multiprocessors) {
  if (chunked_residual(c, multiprocessors)) return 64;
  if (!c.aligned16) return transposed_tiles(c, 32) < two_per_sm(multiprocessors) ? 16 : 32;
  return transposed_tiles(c, 64) < two_per_sm(multiprocessors) ? 32 : 64;
}

// Tokens per tile: twice the 64 channels (512-thread blocks, the products kept as T) on aligned
// 16-bit lines where there are two such tiles per SM, so that residual and out move in 256-byte
// pieces of each line (measured faster than the square tile: docs/tuning/residual_gate_add.md).
// fp32 and chunked lines: square.
int transposed_token_tile(const ResidualGateAddCall& c, int tile, int multiprocessors) {
  const bool tall = tile == 64 && c.aligned16 && dtype_size(c.residual.dtype) == 2 &&
                    c.batch * ((c.tokens + 127) / 128) * ((c.hidden + 63) / 64) >= two_per_sm(multiprocessors);
  return tall ? 2 * tile : tile;
}

// Elements per unit of the flat kernel: a 16-byte vector on aligned calls, one element otherwise.
int64_t flat_elems_per_unit(const ResidualGateAddCall& c) {
  return c.aligned16 ? 16 / static_cast<int64_t>(dtype_size(c.residual.dtype)) : 1;
}

// A scalar flat call that one wave of resident threads covers (2048 per SM on sm_90/sm_100,
// 1536 on sm_120: a threshold, not a limit) runs one element per thread (rga_flat_units).
bool flat_one_wave(const ResidualGateAddCall& c, int multiprocessors) {
  return !c.transposed && !c.aligned16 && c.numel <= int64_t{2048} * std::max(multiprocessors, 1);
}

RgaKernelKey key_for(const ResidualGateAddCall& c, const DeviceInfo& device) {
  RgaKernelKey key;
  key.dtype = c.residual.dtype;
  key.mode = c.gate_mode;
  key.transposed = c.transposed;
  key.vector = c.aligned16;
  key.vector_update = c.transposed && (c.aligned16 || c.update_aligned16);
  key.chunked_residual = c.transposed && chunked_residual(c, device.multiprocessors);
  key.tile = c.transposed ? transposed_tile(c, device.multiprocessors) : 0;
  key.token_tile = c.transposed ? transposed_token_tile(c, key.tile, device.multiprocessors) : 0;
  key.one_wave = flat_one_wave(c, device.multiprocessors);
  key.index64 = !c.transposed && flat_index64(c.numel / flat_elems_per_unit(c));
  key.gate_f32 = c.gate_f32;
  key.pdl = c.options.use_pdl && (device.features & kFeaturePdl);
  return key;
}

void launch_residual_gate_add(const ResidualGateAddCall& c, const RgaKernelKey& key, const jit::LoadedKernel& kernel) {
  ResidualGateAddParams p{};
  p.residual = c.residual.data;
  p.update = c.update.data;
  p.gate = c.gate.data;
  p.out = c.out.data;
  int64_t grid = 0;
  if (c.transposed) {
    p.tokens = c.tokens;
    p.hidden = c.hidden;
    p.tiles_t = token_tiles(c, key.tokens_per_tile(), key.chunked_residual);
    p.tiles_h = (c.hidden + key.tile - 1) / key.tile;
    grid = c.batch * p.tiles_t * p.tiles_h;
  } else {
    const int64_t elems = flat_elems_per_unit(c);
    const int64_t units = c.numel / elems, row_units = c.width / elems;
    rga_set_flat_sizes(p, units, row_units, std::max<int64_t>(c.rows_per_batch, 1) * row_units);
    p.gate_row_stride = c.gate_row_stride;
    // One unit per thread: a grid over the whole tensor (measured, rga_flat_units); the 32-bit
    // kernel then runs a single round (below 2^31 units the grid is under 2^23 blocks, never
    // capped). Otherwise a resident grid (occupancy cached with the kernel), fewer blocks when
    // there is less work.
    const int64_t one_unit_each = (p.units + kRgaThreads - 1) / kRgaThreads;
    const int64_t resident = static_cast<int64_t>(kernel.blocks_per_sm) * kernel.multiprocessors;
    const int64_t cap = rga_flat_units(key) == 1 ? int64_t{0x7fffffff} : resident;
    grid = std::max<int64_t>(1, std::min<int64_t>(cap, one_unit_each));
  }
  jit::launch(kernel, static_cast<unsigned>(grid), static_cast<unsigned>(rga_block_threads(key)), &p, sizeof p, static_cast<CUstream>(c.stream), key.pdl);
}

// The compile test's keys (NVRTC for every target arch, no GPU): the strided gate rows and the
// promoted chain on every flat path; tests/test_residual_gate_add.cpp compiles the older keys.
std::vector<RgaKernelKey> rga_variant_keys() {
  std::vector<RgaKernelKey> keys;
  const auto key = [&](DType dt, GateMode mode, bool vector, bool gate_f32) {
    RgaKernelKey k;
    k.dtype = dt;
    k.mode = mode;
    k.vector = vector;
    k.gate_f32 = gate_f32;
    keys.push_back(k);
    return k;
  };
  for (GateMode mode : {GateMode::full, GateMode::row, GateMode::token, GateMode::batch, GateMode::strided})
    for (bool vector : {true, false}) key(DType::bf16, mode, vector, true);
  RgaKernelKey k = keys.back();  // bf16, strided, scalar, f32 gate
  k.one_wave = true;              // the scalar path of one element per thread
  keys.push_back(k);
  k.one_wave = false;
  k.vector = true;
  k.index64 = true;  // 64-bit unit indices
  keys.push_back(k);
  key(DType::f16, GateMode::row, true, true);
  key(DType::f16, GateMode::strided, false, true);
  key(DType::bf16, GateMode::strided, true, false);  // strided rows of a gate of residual's dtype
  key(DType::f32, GateMode::strided, true, false);
  key(DType::f32, GateMode::strided, false, false);
  return keys;
}

std::string grid_refusal(const ResidualGateAddCall& c) {
  if (!transposed_grid_fits(c))
    return "transposed grid of " + std::to_string(transposed_blocks(c)) + " tiles exceeds 2^31-1 blocks";
  return "";
}

constexpr KernelFunctions<ResidualGateAddCall, RgaKernelKey> kKernels{
    .key = key_for, .request = rga_kernel_request, .launch = launch_residual_gate_add,
    .nothing_to_do = [](const ResidualGateAddCall& c) { return c.numel == 0; },
    .refusal = grid_refusal,
    .variant_keys = rga_variant_keys,
    .extra_signature = [](const ResidualGateAddCall& c) -> uint64_t { return transposed_grid_fits(c); },
    .extra_radix = 2};
using Kernels = OpKernels<describe, kKernels>;

void register_residual_gate_add(Registry& registry) {
  const std::string oracle =
      "eager PyTorch `residual + update * gate` on CUDA (the product rounded to the dtype, then the sum; "
      "fp16, bf16 and fp32)";
  Implementation<ResidualGateAddCall, RgaKernelKey> jit_impl = jit_implementation<Kernels>(
      {.contract = Contract::bit_exact(oracle).verified(
           "H200 (sm_90), scripts/device_run.sh verify at cbc736f: torch.equal on 58 of 58 cases and 6 "
           "CUDA-graph replays"),
       .description =
           "flat 128-bit (or scalar) grid-stride kernel for contiguous layouts, shared-memory tiled kernel for the "
           "transposed layout; NVRTC at first use, explicit __fmul_rn/__fadd_rn (no FMA)"});
  // The two chains are two implementations of one kernel family, so that each has its own contract.
  const auto serves = [](bool gate_f32, std::function<std::string(const ResidualGateAddCall&, const RgaKernelKey&)> cuda) {
    return [gate_f32, cuda](const ResidualGateAddCall& c, const RgaKernelKey& key) -> std::string {
      if (c.residual.device.kind == DeviceKind::cuda && c.gate_f32 != gate_f32)
        return gate_f32 ? "handles an f32 gate beside 16-bit data only (the promoted chain)"
                        : "handles a gate of residual's dtype only (an f32 gate beside 16-bit data: .jit_float32)";
      return cuda(c, key);
    };
  };
  jit_impl.predicate = serves(false, jit_impl.predicate);
  add_implementation(registry, kOp, std::move(jit_impl));

  Implementation<ResidualGateAddCall, RgaKernelKey> promoted = jit_implementation<Kernels>(
      {.variant = "jit_float32",
       .contract =
           Contract::bit_exact(kPromotedOracle)
               .verified("H200 (sm_90) at ee9c29e: torch.equal at every Wan gate of "
                         "bench/residual_gate_add_torch.py (chunks of [B, 6, D] and [B, S, 6, D]) and every f32-gate case of "
                         "tests/python/test_ops_eager.py; at 64c434f the Wan sites of ditops.diffusers (tiny models and the "
                         "14B-width bench, bench/results/h200/models/wan.json) equal to the model"),
       .description = "the flat kernel with an fp32 gate (two 16-byte gate loads per unit), explicit "
                      "__fmul_rn/__fadd_rn in fp32 and one rounding to residual's dtype"});
  promoted.predicate = serves(true, promoted.predicate);
  promoted.variants = nullptr;  // the family's keys, compiled once (under residual_gate_add.jit)
  add_implementation(registry, kOp, std::move(promoted));

  add_reference<Kernels>(
      registry, residual_gate_add_reference,
      Contract::bit_exact(oracle + "; " + kPromotedOracle + "; the portable oracle, compiled without FP contraction")
          .verified("on every CI run (CPU) by the op's tests; on the GPU every CUDA implementation "
                    "matched it within each case's bound (H200 (sm_90), scripts/device_run.sh ops, "
                    "at 8dea671)"),
      "CPU reference: every tensor walked through its own strides, the gate by broadcast");
}

}  // namespace

DITOPS_OP_ENTRIES(residual_gate_add, Kernels, register_residual_gate_add);

}  // namespace ditops
