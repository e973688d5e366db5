// rope_tables: the description, argument matching, the kernel key, its request and launch, the
// registry entries (the jit implementation, the CPU reference) and the reference. The kernel is
// kernels/rope_tables.cuh.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/builtin_ops.h"
#include "core/implementation.h"
#include "core/matcher.h"
#include "core/op_builder.h"
#include "ditops/rope_tables.h"
#include "jit/cuda_driver.h"
#include "jit/jit.h"
#include "jit/kernel_family.h"
#include "kernels/rope_tables.cuh"

namespace ditops {

namespace {

constexpr const char* kOp = "rope_tables";
constexpr int kThreads = 256;
constexpr int64_t kMaxGrid = int64_t{1} << 20;  // CTAs; more units loop (the kernel's grid stride)

std::string num(int64_t v) { return std::to_string(v); }

// The widths the options give, in order, up to the first 0.
int axes_of(const RopeTablesOptions& o, int64_t dims[kRopeTablesMaxAxes]) {
  const int64_t all[kRopeTablesMaxAxes] = {o.axes_dim0, o.axes_dim1, o.axes_dim2, o.axes_dim3};
  int n = 0;
  while (n < kRopeTablesMaxAxes && all[n] != 0) {
    dims[n] = all[n];
    ++n;
  }
  return n;
}

// axes_dim: each width even and positive, the first 0 ending the list (named before any tensor).
void check_axes(const RopeTablesCall& c) {
  const RopeTablesOptions& o = c.options;
  const int64_t all[kRopeTablesMaxAxes] = {o.axes_dim0, o.axes_dim1, o.axes_dim2, o.axes_dim3};
  const auto fail = [](const std::string& message) { throw InvalidArgument(std::string(kOp) + ": " + message); };
  if (all[0] == 0) fail("axes_dim0 must be even and positive (the first axis's rotary width) but is 0");
  bool ended = false;
  for (int a = 0; a < kRopeTablesMaxAxes; ++a) {
    const std::string name = "axes_dim" + num(a);
    if (all[a] == 0) {
      ended = true;
    } else if (ended) {
      fail(name + " must be 0 (axes_dim" + num(a - 1) + " = 0 ended the axes) but is " + num(all[a]));
    } else if (all[a] < 0 || all[a] % 2) {
      fail(name + " must be even and positive (a rotary width: pairs of columns) or 0 (no more axes) but is " +
           num(all[a]));
    }
  }
}

std::string sum_text(const RopeTablesOptions& o) {
  int64_t dims[kRopeTablesMaxAxes];
  const int n = axes_of(o, dims);
  std::string s;
  for (int a = 0; a < n; ++a) s += (a ? "+" : "") + num(dims[a]);
  return s;
}

// ids needs a column per axis.
std::string axes_fit_ids(int64_t A, const RopeTablesCall& c) {
  int64_t dims[kRopeTablesMaxAxes];
  const int n = axes_of(c.options, dims);
  if (A >= n) return "";
  return "ids.shape[1] must be >= " + num(n) + " (a column per axis of axes_dim: " + sum_text(c.options) +
         ") but is " + num(A);
}

// cos and sin are [S, D], D the sum of the widths.
std::string width_is_sum(int64_t D, const RopeTablesCall& c) {
  int64_t dims[kRopeTablesMaxAxes];
  const int n = axes_of(c.options, dims);
  int64_t sum = 0;
  for (int a = 0; a < n; ++a) sum += dims[a];
  if (D == sum) return "";
  return "cos.shape[1] must equal D=" + num(sum) + " (the sum of axes_dim: " + sum_text(c.options) + ") but is " +
         num(D);
}

void complete(RopeTablesCall& call, Matcher& m);  // the op's own rules, after the slots'

// The op described once: its slots state the checks every call gets (core/op_builder.h).
OpBuilder<RopeTablesCall> describe() {
  using C = RopeTablesCall;
  using O = RopeTablesOptions;
  OpBuilder<C> b(kOp,
                 "cos, sin = FLUX's RoPE tables of ids (diffusers' FluxPosEmbed / Flux2PosEmbed: float64 "
                 "frequencies, each pair's value twice), each step rounded as eager",
                 "ids [S, A] f32 (any strides; column a is axis a's position); cos, sin [S, D] f32 contiguous, "
                 "D = axes_dim0 + ... (the caller's, written in place). include/ditops/rope_tables.h, "
                 "docs/rope_tables.md");
  b.dims("S=4608,A=4,D=128");
  b.before_slots(check_axes);
  b.tensor<&C::ids>({.dtypes = "f32", .shape = "S,A"});
  // cos and sin are the caller's: written, never read.
  b.tensor<&C::cos>({.role = TensorRole::inout, .dtypes = "f32", .shape = "S,D", .layout = "contiguous"});
  b.tensor<&C::sin>({.role = TensorRole::inout, .dtypes = "f32", .shape = "S,D", .layout = "contiguous"});
  b.dim_rule("A", axes_fit_ids);
  b.dim_rule("D", width_is_sum);
  b.option<&O::axes_dim0>("the rotary width of ids' column 0 (even, > 0)");
  b.option<&O::axes_dim1>("the rotary width of ids' column 1 (even; 0: one axis)");
  b.option<&O::axes_dim2>("the rotary width of ids' column 2 (even; 0: two axes)");
  b.option<&O::axes_dim3>("the rotary width of ids' column 3 (even; 0: three axes)");
  b.option<&O::theta>("the RoPE base (FLUX.2: 2000, FLUX.1: 10000)");
  b.pdl_option<&O::use_pdl>();
  b.complete(complete);
  return b;
}

void complete(RopeTablesCall& call, Matcher& m) {
  m.require_disjoint(call.sin, "sin", call.cos, "cos");
  call.rows = *m.value("S");
  call.width = *m.value("D");
  call.axes = axes_of(call.options, call.dims);
  call.ids_row_stride = call.ids.strides[0];
  call.ids_col_stride = call.ids.strides[1];
}

// The template key: exactly the kernel's template parameters.
struct RopeTablesKey {
  bool pdl = true;

  std::string to_string() const { return pdl ? "pdl" : "nopdl"; }
  uint64_t packed() const { return pack_key({pdl}); }
};

RopeTablesKey key_for(const RopeTablesCall& c, const DeviceInfo& device) {
  return {.pdl = c.options.use_pdl && (device.features & kFeaturePdl)};
}

KernelRequest request_for(const RopeTablesKey& k) {
  return {.header = "rope_tables.cuh",
          .function = "ditops::rope_tables_body",
          .template_args = jit::kernel_args(k.pdl),
          .params_type = "ditops::RopeTablesParams",
          .max_threads = kThreads,
          .template_key = std::string(kOp) + ":" + k.to_string()};
}

// The parameters of a matched call: the axes' first pairs and their widths' reciprocals.
RopeTablesParams params_of(const RopeTablesCall& c) {
  RopeTablesParams p{};
  p.ids = static_cast<const float*>(c.ids.data);
  p.cos = static_cast<float*>(c.cos.data);
  p.sin = static_cast<float*>(c.sin.data);
  p.rows = c.rows;
  p.ids_row_stride = c.ids_row_stride;
  p.ids_col_stride = c.ids_col_stride;
  p.width = c.width;
  p.pairs = c.width / 2;
  p.units = c.rows * p.pairs;
  p.axes = c.axes;
  long long start = 0;
  for (int a = 0; a < c.axes; ++a) {
    p.pair_start[a] = start;
    start += c.dims[a] / 2;
    // eager divides arange(0, d, 2) by the CPU scalar d as a product with 1.0 / d in double
    p.inv_dim[a] = 1.0 / static_cast<double>(c.dims[a]);
  }
  p.pair_start[c.axes] = start;
  p.theta = c.options.theta;
  return p;
}

// A thread per (row, pair), 256 to a CTA. Not tuned (no device run yet): the FLUX sizes are
// 0.3 M units.
void launch(const RopeTablesCall& c, const RopeTablesKey& k, const jit::LoadedKernel& kernel) {
  const RopeTablesParams p = params_of(c);
  const unsigned grid = static_cast<unsigned>(std::min<long long>((p.units + kThreads - 1) / kThreads, kMaxGrid));
  jit::launch(kernel, grid, kThreads, &p, sizeof p, static_cast<CUstream>(c.stream), k.pdl);
}

// The compile test's keys: with and without PDL.
std::vector<RopeTablesKey> variant_keys() { return {{true}, {false}}; }

constexpr KernelFunctions<RopeTablesCall, RopeTablesKey> kKernels{
    .key = key_for, .request = request_for, .launch = launch,
    .nothing_to_do = [](const RopeTablesCall& c) { return c.rows == 0; },
    .variant_keys = variant_keys};
using Kernels = OpKernels<describe, kKernels>;

void register_rope_tables(Registry& registry) {
  const std::string eager =
      "eager PyTorch on CUDA: diffusers' FluxPosEmbed / Flux2PosEmbed chain (ditops.eager.rope_tables: "
      "arange(0, d, 2, float64) / d, theta ** it, 1.0 / it, torch.outer with the float32 positions, cos and sin "
      "in float64, repeat_interleave(2), .float(), cat over the axes)";
  add_jit<Kernels>(registry, {.contract = Contract::bit_exact(eager).verified(
                                  "H100 (sm_90) at 98b332f: torch.equal to the eager chain in 30 of 30 calls "
                                  "(FLUX.1 joint 4608, FLUX.2 image 4096 and text 512), graph replays equal"),
                              .description = "a thread per (row, rotary pair): CUDA's double pow, cos and sin, "
                                             "each value stored twice in cos and in sin; NVRTC at first use"});
  add_reference<Kernels>(
      registry, rope_tables_reference,
      Contract::close(eager,
                      "the C library's double pow, cos and sin where CUDA's double functions are within 2 ulp of "
                      "a double: a float32 value may differ by one ulp (below 2^-10 in magnitude: one ulp of "
                      "2^-10)")
          .verified("on every CI run (CPU) by the op's tests against a long-double transcription"),
      "CPU reference: the double steps with the C library's pow, cos and sin, each IEEE binary64");
}

}  // namespace

// The CPU oracle: per row and pair, the kernel's double steps with the C library's functions.
void rope_tables_reference(const RopeTablesCall& c) {
  for (const TensorView* t : {&c.ids, &c.cos, &c.sin})
    if (t->data && t->device.kind != DeviceKind::cpu)
      throw Error("rope_tables reference: every tensor must be on the cpu");
  const RopeTablesParams p = params_of(c);
  std::vector<double> freqs(static_cast<size_t>(p.pairs));
  for (int a = 0; a < p.axes; ++a)
    for (long long j = p.pair_start[a]; j < p.pair_start[a + 1]; ++j) {
      const double e = static_cast<double>(2 * (j - p.pair_start[a])) * p.inv_dim[a];
      freqs[static_cast<size_t>(j)] = 1.0 / std::pow(p.theta, e);
    }
  for (long long s = 0; s < p.rows; ++s) {
    for (int a = 0; a < p.axes; ++a) {
      const double pos = static_cast<double>(p.ids[s * p.ids_row_stride + a * p.ids_col_stride]);
      for (long long j = p.pair_start[a]; j < p.pair_start[a + 1]; ++j) {
        const double angle = pos * freqs[static_cast<size_t>(j)];
        const float cv = static_cast<float>(std::cos(angle)), sv = static_cast<float>(std::sin(angle));
        float* co = p.cos + s * p.width + 2 * j;
        float* si = p.sin + s * p.width + 2 * j;
        co[0] = co[1] = cv;
        si[0] = si[1] = sv;
      }
    }
  }
}

DITOPS_OP_ENTRIES(rope_tables, Kernels, register_rope_tables);

}  // namespace ditops
