// fractional_rope_tables: the description, argument matching, the kernel key, its request and
// launch, the registry entries (the jit implementation, the CPU reference) and the reference. The
// kernel is kernels/fractional_rope_tables.cuh.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/builtin_ops.h"
#include "core/enum_name.h"
#include "core/implementation.h"
#include "core/matcher.h"
#include "core/op_builder.h"
#include "ditops/fractional_rope_tables.h"
#include "jit/cuda_driver.h"
#include "jit/jit.h"
#include "jit/kernel_family.h"
#include "kernels/fractional_rope_tables.cuh"

namespace ditops {

namespace {

constexpr const char* kOp = "fractional_rope_tables";
constexpr int kThreads = 256;
constexpr int64_t kMaxRowBlocks = int64_t{1} << 20;  // CTAs; more rows loop (the kernel's row stride)

std::string num(int64_t v) { return std::to_string(v); }

void complete(FractionalRopeTablesCall& call, Matcher& m);  // the op's own rules, after the slots'

// The op described once: its slots state the checks every call gets (core/op_builder.h).
OpBuilder<FractionalRopeTablesCall> describe() {
  using C = FractionalRopeTablesCall;
  using O = FractionalRopeTablesOptions;
  OpBuilder<C> b(kOp,
                 "cos, sin = LTX-2's RoPE tables of fractional positions (LTX2AudioVideoRotaryPosEmbed after its "
                 "frequencies), each step rounded as eager",
                 "coords [B, A, P, 2] or [B, A, P] f32 (any strides; A <= 3); freqs [F] f32; cos, sin [B, P, W] f32 "
                 "contiguous (the caller's, written in place), W >= A F (split) or 2 A F (interleaved). "
                 "include/ditops/fractional_rope_tables.h, docs/fractional_rope_tables.md");
  b.dims("B=1,A=3,P=6144,E=2,F=682,W=2048");
  // coords' rank (3 or 4) and its bound dim are the op's own rules.
  b.tensor<&C::coords>({.dtypes = "f32", .shape = "B,A,P,E", .own = "shape"});
  b.tensor<&C::freqs>({.dtypes = "f32", .shape = "F", .layout = "contiguous"});
  // cos and sin are the caller's: written, never read.
  b.tensor<&C::cos>({.role = TensorRole::inout, .dtypes = "f32", .shape = "B,P,W", .layout = "contiguous",
                     .own = "shape"});
  b.tensor<&C::sin>({.role = TensorRole::inout, .dtypes = "f32", .shape = "B,P,W", .layout = "contiguous",
                     .own = "shape"});
  b.option<&O::max_pos0>("axis 0's base size: positions are divided by it (LTX-2: base_num_frames)");
  b.option<&O::max_pos1>("axis 1's base size (LTX-2 video: base_height)");
  b.option<&O::max_pos2>("axis 2's base size (LTX-2 video: base_width)");
  b.choice<&O::layout>({FractionalRopeLayout::split, FractionalRopeLayout::interleaved},
                       "split: each pair once (LTX-2's rope_type 'split'); interleaved: each value twice");
  b.pdl_option<&O::use_pdl>();
  b.complete(complete);
  return b;
}

void complete(FractionalRopeTablesCall& call, Matcher& m) {
  const TensorView &coords = call.coords, &cos = call.cos, &sin = call.sin;
  if (coords.rank != 3 && coords.rank != 4)
    m.fail("coords must be [B, A, P, 2] (bounds) or [B, A, P] (positions) but is " + coords.describe());
  call.bounds = coords.rank == 4;
  if (call.bounds && coords.shape[3] != 2)
    m.fail("coords.shape[3] must equal 2 ([start, end) bounds) but is " + num(coords.shape[3]));
  call.batch = coords.shape[0];
  call.axes = coords.shape[1];
  call.positions = coords.shape[2];
  if (call.axes < 1 || call.axes > kFractionalRopeMaxAxes)
    m.fail("coords.shape[1] must be 1 to " + num(kFractionalRopeMaxAxes) + " (the position axes) but is " +
           num(call.axes));
  const int64_t max_pos[kFractionalRopeMaxAxes] = {call.options.max_pos0, call.options.max_pos1,
                                                   call.options.max_pos2};
  for (int a = 0; a < call.axes; ++a)
    if (max_pos[a] <= 0)
      m.fail("max_pos" + num(a) + " must be > 0 (axis " + num(a) + "'s base size) but is " + num(max_pos[a]));
  m.require_nonnegative_strides(coords, "coords");
  call.stride_b = coords.strides[0];
  call.stride_a = coords.strides[1];
  call.stride_p = coords.strides[2];
  call.stride_e = call.bounds ? coords.strides[3] : 0;
  call.frequencies = call.freqs.shape[0];
  const int64_t per_frequency = call.options.layout == FractionalRopeLayout::interleaved ? 2 * call.axes : call.axes;
  for (const auto& [t, name] : {std::pair<const TensorView*, const char*>{&cos, "cos"}, {&sin, "sin"}}) {
    if (t->rank != 3 || t->shape[0] != call.batch || t->shape[1] != call.positions)
      m.fail(std::string(name) + " must be [B, P, W] = [" + num(call.batch) + ", " + num(call.positions) +
             ", W] (coords' batch and positions) but is " + t->describe());
  }
  call.width = cos.shape[2];
  if (sin.shape[2] != call.width)
    m.fail("sin.shape[2] must equal cos.shape[2]=" + num(call.width) + " but is " + num(sin.shape[2]));
  if (call.width < per_frequency * call.frequencies)
    m.fail("cos.shape[2] must be >= " + num(per_frequency * call.frequencies) + " (" +
           (call.options.layout == FractionalRopeLayout::interleaved ? "2 A F = 2 x " : "A F = ") + num(call.axes) +
           " x " + num(call.frequencies) + ") but is " + num(call.width));
  call.pad = call.width - per_frequency * call.frequencies;
  m.require_disjoint(call.sin, "sin", call.cos, "cos");
  call.aligned16 = call.width % 4 == 0 && is_aligned(cos.data, 16) && is_aligned(sin.data, 16);
}

// The template key: exactly the kernel's template parameters.
struct FractionalRopeTablesKey {
  int axes = 3;
  bool interleaved = false;
  bool vector = true;
  bool pdl = true;

  std::string to_string() const {
    return "A" + std::to_string(axes) + (interleaved ? ",interleaved" : ",split") + (vector ? ",vec16" : ",scalar") +
           (pdl ? ",pdl" : ",nopdl");
  }
  uint64_t packed() const {
    return pack_key({{static_cast<uint64_t>(axes), kFractionalRopeMaxAxes + 1}, interleaved, vector, pdl});
  }
};

FractionalRopeTablesKey key_for(const FractionalRopeTablesCall& c, const DeviceInfo& device) {
  return {.axes = static_cast<int>(c.axes),
          .interleaved = c.options.layout == FractionalRopeLayout::interleaved,
          .vector = c.aligned16,
          .pdl = c.options.use_pdl && (device.features & kFeaturePdl)};
}

KernelRequest request_for(const FractionalRopeTablesKey& k) {
  return {.header = "fractional_rope_tables.cuh",
          .function = "ditops::fractional_rope_tables_body",
          .template_args = jit::kernel_args(k.axes, k.interleaved, k.vector, k.pdl),
          .params_type = "ditops::FractionalRopeTablesParams",
          .max_threads = kThreads,
          .template_key = std::string(kOp) + ":" + k.to_string()};
}

FractionalRopeTablesParams params_of(const FractionalRopeTablesCall& c) {
  FractionalRopeTablesParams p{};
  p.coords = static_cast<const float*>(c.coords.data);
  p.freqs = static_cast<const float*>(c.freqs.data);
  p.cos = static_cast<float*>(c.cos.data);
  p.sin = static_cast<float*>(c.sin.data);
  p.positions = c.positions;
  p.rows = c.batch * c.positions;
  p.width = static_cast<int>(c.width);
  p.pad = static_cast<int>(c.pad);
  p.stride_b = c.stride_b;
  p.stride_a = c.stride_a;
  p.stride_p = c.stride_p;
  p.stride_e = c.stride_e;
  p.bounds = c.bounds;
  const int64_t max_pos[kFractionalRopeMaxAxes] = {c.options.max_pos0, c.options.max_pos1, c.options.max_pos2};
  // eager divides by the CPU scalar max_pos as a product with its fp32 reciprocal, computed on the host
  for (int a = 0; a < c.axes; ++a) p.inv_max[a] = 1.0f / static_cast<float>(max_pos[a]);
  return p;
}

// A thread per 4 columns, a row's columns over column_blocks CTAs of up to kThreads threads (rounded
// up to a warp), rows over row_blocks, with a row stride past kMaxRowBlocks: 53.09 us at LTX-2's 6144
// video tokens on an H100 at 7d62f24, 72 % of a copy (the walk before it, a unit per thread with 64-bit
// divisions per element: 75.32 us, 52 %).
void launch(const FractionalRopeTablesCall& c, const FractionalRopeTablesKey& k, const jit::LoadedKernel& kernel) {
  FractionalRopeTablesParams p = params_of(c);
  const long long units = (c.width + 3) / 4;
  const long long threads = std::min<long long>(kThreads, (units + 31) / 32 * 32);
  p.column_blocks = static_cast<int>((units + threads - 1) / threads);
  p.row_blocks = static_cast<int>(std::min<long long>(p.rows, kMaxRowBlocks / p.column_blocks));
  const unsigned grid = static_cast<unsigned>(p.row_blocks) * static_cast<unsigned>(p.column_blocks);
  jit::launch(kernel, grid, static_cast<unsigned>(threads), &p, sizeof p, static_cast<CUstream>(c.stream), k.pdl);
}

// The compile test's keys: each axis count, both layouts, both store paths, and one without PDL.
std::vector<FractionalRopeTablesKey> variant_keys() {
  return {{3, false, true, true}, {1, false, true, true}, {2, false, false, true},
          {3, true, true, true},  {1, true, false, true}, {3, false, true, false}};
}

constexpr KernelFunctions<FractionalRopeTablesCall, FractionalRopeTablesKey> kKernels{
    .key = key_for, .request = request_for, .launch = launch,
    .nothing_to_do = [](const FractionalRopeTablesCall& c) { return c.batch * c.positions == 0 || c.width == 0; },
    .variant_keys = variant_keys};
using Kernels = OpKernels<describe, kKernels>;

void register_fractional_rope_tables(Registry& registry) {
  const std::string eager =
      "eager PyTorch on CUDA: LTX2AudioVideoRotaryPosEmbed.forward after its frequencies "
      "(ditops.eager.fractional_rope_tables: the bounds' midpoint, / max_pos per axis, * 2 - 1, * freqs, the "
      "transpose, cos and sin in fp32, the padding's cat)";
  add_jit<Kernels>(registry,
                   {.contract = Contract::bit_exact(eager).verified(
                        "H100 (sm_90) at 7d62f24 (this row walk; the walk before it at 18174c5 too): torch.equal in "
                        "18 of 18 runs of bench/fractional_rope_tables_torch.py (and to the diffusers module's "
                        "forward at LTX-2's video and audio shapes) and in graph replay, the driver's cases on the "
                        "GPU, and the LTX-2 GPU tests of tests/python/test_diffusers.py; not yet on the H200"),
                    .description = "a thread per 4 columns of a row, a CTA walking a row block: the axes' fp32 values "
                                   "once per row, cosf and sinf; NVRTC at first use"});
  add_reference<Kernels>(
      registry, fractional_rope_tables_reference,
      Contract::close(eager,
                      "cos and sin in double rounded to fp32 where CUDA's cosf and sinf are within 2 ulp of that: a "
                      "value may differ by 2 ulp (below 2^-10 in magnitude: 2 ulp of 2^-10)")
          .verified("on every CI run (CPU) by the op's tests against a double transcription"),
      "CPU reference: the fp32 steps, cos and sin in double rounded to fp32");
}

}  // namespace

// The CPU oracle: per row and column, the kernel's fp32 steps; cos and sin in double, rounded.
void fractional_rope_tables_reference(const FractionalRopeTablesCall& c) {
  for (const TensorView* t : {&c.coords, &c.freqs, &c.cos, &c.sin})
    if (t->data && t->device.kind != DeviceKind::cpu)
      throw Error("fractional_rope_tables reference: every tensor must be on the cpu");
  const FractionalRopeTablesParams p = params_of(c);
  const bool interleaved = c.options.layout == FractionalRopeLayout::interleaved;
  for (long long row = 0; row < p.rows; ++row) {
    const long long b = row / p.positions, pos = row - b * p.positions;
    for (long long j = 0; j < p.width; ++j) {
      float cv = 1.0f, sv = 0.0f;
      if (j >= p.pad) {
        const long long jj = interleaved ? (j - p.pad) / 2 : j - p.pad;
        const long long k = jj / c.axes;
        const int a = static_cast<int>(jj - k * c.axes);
        const float* cp = p.coords + b * p.stride_b + a * p.stride_a + pos * p.stride_p;
        const float mid = p.bounds ? (cp[0] + cp[p.stride_e]) * 0.5f : cp[0];
        const float v = (mid * p.inv_max[a]) * 2.0f - 1.0f;
        const float x = v * p.freqs[k];
        cv = static_cast<float>(std::cos(static_cast<double>(x)));
        sv = static_cast<float>(std::sin(static_cast<double>(x)));
      }
      p.cos[row * p.width + j] = cv;
      p.sin[row * p.width + j] = sv;
    }
  }
}

DITOPS_OP_ENTRIES(fractional_rope_tables, Kernels, register_fractional_rope_tables);

}  // namespace ditops
