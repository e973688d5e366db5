// fp8_rowwise_quant: the description, argument matching, the kernel key, its request and launch, the
// registry entries (the jit implementation, the CPU reference). The reference is in
// src/reference/fp8_rowwise_quant_reference.cpp, the kernel in kernels/fp8_rowwise_quant.cuh.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "core/builtin_ops.h"
#include "core/implementation.h"
#include "core/matcher.h"
#include "core/op_builder.h"
#include "ditops/fp8_rowwise_quant.h"
#include "jit/cuda_driver.h"
#include "jit/jit.h"
#include "jit/kernel_family.h"
#include "kernels/fp8_rowwise_quant.cuh"
#include "ops/common/rows.h"

namespace ditops {

namespace {

constexpr const char* kOp = "fp8_rowwise_quant";
// Threads per row (CTA) up to 512: the fewest slots that cover the row at that many threads, so a
// wide row is spread over more warps (FLUX.1's FF-down input: 2 slots of 384 threads, not 3 of 256).
constexpr int kMaxThreads = 512;
// The GELU table's CTAs keep the next row in flight (twice the registers of a slot) and walk many
// rows each: up to 256 threads (H100, 7a438af: FLUX.1's FF-down input 81.99 us with 512, against
// 69.71 us with 256 at c2e432c and 70.62 us evaluated at 512).
constexpr int kTableMaxThreads = 256;
// SwiGLU's evaluated vector rows hold every gate and up word of the row before the first SiLU (16
// registers a slot): 72 registers at 3 slots uncapped, one CTA of 512 threads an SM at FLUX.2's
// single-block cat. Up to 3 slots they are held to 2 CTAs an SM (sm_90 ptxas at (512, 2): 60 / 63 /
// 64 registers at 1 / 2 / 3 slots, no spill); at 4 the cap would spill 120 bytes, so 4 stay uncapped.
// With it (H100, 39d1a9a): the single-block cat 173.05 us, 0.99 of a copy (uncapped: not measured).
constexpr int kSwigluTwoCtasMaxSlots = 3;
constexpr int kUnitColumns = 16;
constexpr int kSlotBuckets[] = {1, 2, 3, 4, 6, 8};
// 32768 columns: a row in registers, 8 slots of the table's 256 threads (4 of the others' 512).
constexpr int64_t kMaxUnits = int64_t{8} * kTableMaxThreads;
// GELU by table (kernels/common/gelu_table.cuh) where a call has rows enough for a grid of
// kTableCtasPerSm CTAs per SM to take several each: each CTA builds the table once (3840 entries:
// 15 evaluations a thread of 256), so it pays where a CTA then takes several rows of 48-96 elements
// a thread. The bounds are the arithmetic's, not a sweep's (H100: 0.76 -> 0.81 of a copy at FLUX.1's
// FF-down input with every unit in the table); taken only where DITOPS_GELU_TABLE=1 opts in
// (kFeatureGeluTable): the random-weight FLUX.1 forward lost 1.5 ms by it (docs/fp8_rowwise_quant.md).
constexpr int kTableCtasPerSm = 4;
// A build knob for one A/B (bench/experiments/gelu_table_run.sh, GT_FEW_ROWS=1): at 0 calls of few
// rows take the table too, a CTA a row building it before its PDL wait (FLUX.1's 512 text rows:
// 66 % of a copy evaluated on an H100 at 7fe1bca; not yet measured with the table).
#ifndef DITOPS_FRQ_TABLE_MIN_ROWS_PER_CTA
#define DITOPS_FRQ_TABLE_MIN_ROWS_PER_CTA 4
#endif
constexpr int kTableMinRowsPerCta = DITOPS_FRQ_TABLE_MIN_ROWS_PER_CTA;

std::string num(int64_t v) { return std::to_string(v); }

void complete(Fp8RowwiseQuantCall& call, Matcher& m);  // the op's own rules, after the slots'

// The op described once: its slots state the checks every call gets (core/op_builder.h).
OpBuilder<Fp8RowwiseQuantCall> describe() {
  using C = Fp8RowwiseQuantCall;
  using O = Fp8RowwiseQuantOptions;
  OpBuilder<C> b(kOp, "per-token dynamic e4m3 of cat([prefix, act(x)], -1) with its fp32 scales (torchao's rowwise recipe)",
                 "x [..., K] bf16|f16 (rows of one stride), prefix [..., Kp] optional; out [M, Kp + N] e4m3fn "
                 "(N = K, or K / 2 for act=swiglu), out_scale [M, 1] f32. include/ditops/fp8_rowwise_quant.h, "
                 "docs/fp8_rowwise_quant.md");
  b.dims("M=4608,Kp=3072,K=12288");
  // x's and prefix's ranks, row strides and the outputs' extents are the op's own rules.
  b.tensor<&C::x>({.dtypes = "bf16|f16", .shape = "M,K", .own = "shape"});
  b.tensor<&C::prefix>({.optional = true, .dtypes = "=x", .shape = "M,Kp", .own = "shape"});
  // act=swiglu halves x's width: is(act,swiglu) is 1 for that choice, 0 otherwise.
  b.tensor<&C::out>({.role = TensorRole::out, .keyword = true, .dtypes = "f8e4m3fn", .shape = "M,Kp+K",
                     .alloc = "rows(x),last(x)/(1+is(act,swiglu))+last_or_0(prefix)", .alloc_dtype = "f8e4m3fn",
                     .layout = "contiguous", .own = "shape"});
  b.tensor<&C::out_scale>({.role = TensorRole::out, .keyword = true, .dtypes = "f32", .shape = "M,1",
                           .alloc = "rows(x),1", .alloc_dtype = "f32",
                           .doc = "the per-row fp32 scales (out * out_scale ~ the row)", .layout = "contiguous",
                           .own = "shape"});
  b.choice<&O::act>({Fp8RowwiseAct::none, Fp8RowwiseAct::gelu_tanh, Fp8RowwiseAct::swiglu},
                    "applied to x (not prefix) before the quantization: none, F.gelu(x, approximate='tanh'), or "
                    "swiglu: F.silu(x[..., :K/2]) * x[..., K/2:] (K even; out gets K/2 columns of x)");
  b.pdl_option<&O::use_pdl>();
  b.complete(complete);
  return b;
}

void complete(Fp8RowwiseQuantCall& call, Matcher& m) {
  const TensorView &x = call.x, &out = call.out, &out_scale = call.out_scale;
  if (x.rank < 1) m.fail("x must have rank >= 1 ([..., K]) but has rank 0");
  const int r = x.rank;
  int64_t rows = 1;
  for (int d = 0; d + 1 < r; ++d) rows *= x.shape[d];
  call.rows = rows;
  call.width = x.shape[r - 1];
  call.act_width = call.width;
  if (call.options.act == Fp8RowwiseAct::swiglu) {
    if (call.width % 2)
      m.fail("x.shape[" + num(r - 1) + "] must be even for act=swiglu (F.silu(x[..., :K/2]) * x[..., K/2:]) but is " +
             num(call.width));
    call.act_width = call.width / 2;
  }
  call.x_row_stride = collapsed_row_stride(m, x, "x");
  const bool has_prefix = !slot_absent(call.prefix);
  if (has_prefix) {
    const TensorView& prefix = call.prefix;
    if (prefix.rank != r) m.fail("prefix must have rank " + num(r) + " (as x) but has rank " + num(prefix.rank));
    for (int d = 0; d + 1 < r; ++d)
      if (prefix.shape[d] != x.shape[d])
        m.fail("prefix.shape[" + num(d) + "] must equal x.shape[" + num(d) + "]=" + num(x.shape[d]) + " but is " +
               num(prefix.shape[d]));
    call.prefix_width = prefix.shape[r - 1];
    call.prefix_row_stride = collapsed_row_stride(m, prefix, "prefix");
  } else {
    call.prefix = TensorView{};
  }
  const int64_t W = call.prefix_width + call.act_width;
  if (W < 1) m.fail("x.shape[" + num(r - 1) + "] + prefix's width must be >= 1 (a row to quantize) but is 0");
  if (out.rank != 2 || out.shape[0] != rows || out.shape[1] != W) {
    const bool swiglu = call.options.act == Fp8RowwiseAct::swiglu;
    m.fail(std::string("out must be [M, Kp + ") + (swiglu ? "K/2] (act=swiglu)" : "K]") + " = [" + num(rows) + ", " +
           num(W) + "] (M: the rows of x) but is " + out.describe());
  }
  if (out_scale.rank != 2 || out_scale.shape[0] != rows || out_scale.shape[1] != 1)
    m.fail("out_scale must be [M, 1] = [" + num(rows) + ", 1] but is " + out_scale.describe());
  m.require_disjoint(out, "out", out_scale, "out_scale");
  const auto rows_aligned = [&](const TensorView& t, int64_t stride) {
    return is_aligned(t.data, 16) && (rows <= 1 || (stride * 2) % 16 == 0);
  };
  call.aligned16 = call.act_width % kUnitColumns == 0 && call.prefix_width % kUnitColumns == 0 &&
                   rows_aligned(x, call.x_row_stride) &&
                   (!has_prefix || rows_aligned(call.prefix, call.prefix_row_stride)) && is_aligned(out.data, 16);
}

// The template key: exactly the kernel's template parameters.
struct Fp8RowwiseQuantKey {
  DType dtype = DType::bf16;
  int slots = 1;
  bool vector = true;
  int act = kFp8RowwiseActNone;
  bool table = false;  // GELU by table (bf16, vector, GELU)
  bool pdl = true;

  std::string to_string() const {
    static const char* acts[] = {"none", "gelu", "swiglu"};
    return std::string(dtype_name(dtype)) + ",slots=" + std::to_string(slots) + (vector ? ",vec16" : ",scalar") + "," +
           acts[act] + (table ? ",table" : "") + (pdl ? ",pdl" : ",nopdl");
  }
  uint64_t packed() const { return pack_key({dtype, {slots, 16}, vector, {act, 4}, table, pdl}); }
};

int64_t units_of(const Fp8RowwiseQuantCall& c) {
  return (c.prefix_width + c.act_width + kUnitColumns - 1) / kUnitColumns;
}

// Units per thread: the fewest slots that cover the row with at most max_threads threads.
int slots_for(int64_t units, int max_threads) {
  for (int s : kSlotBuckets)
    if (units <= int64_t{s} * max_threads) return s;
  return kSlotBuckets[std::size(kSlotBuckets) - 1];
}

int max_threads_of(bool table) { return table ? kTableMaxThreads : kMaxThreads; }

Fp8RowwiseQuantKey key_for(const Fp8RowwiseQuantCall& c, const DeviceInfo& device) {
  Fp8RowwiseQuantKey k;
  k.dtype = c.x.dtype;
  k.vector = c.aligned16;
  k.act = c.options.act == Fp8RowwiseAct::none     ? kFp8RowwiseActNone
          : c.options.act == Fp8RowwiseAct::swiglu ? kFp8RowwiseSwiglu
                                                   : kFp8RowwiseGelu;
  k.table = k.act == kFp8RowwiseGelu && (device.features & kFeatureGeluTable) && k.dtype == DType::bf16 &&
            k.vector && c.rows >= int64_t{kTableMinRowsPerCta} * kTableCtasPerSm * device.multiprocessors;
  k.slots = slots_for(units_of(c), max_threads_of(k.table));
  k.pdl = c.options.use_pdl && (device.features & kFeaturePdl);
  return k;
}

KernelRequest request_for(const Fp8RowwiseQuantKey& k) {
  return {.header = "fp8_rowwise_quant.cuh",
          .function = "ditops::fp8_rowwise_quant_body",
          .template_args = jit::kernel_args(k.dtype, k.slots, k.vector, k.act, k.table, k.pdl),
          .params_type = "ditops::Fp8RowwiseQuantParams",
          .max_threads = max_threads_of(k.table),
          .min_blocks = k.act == kFp8RowwiseSwiglu && k.vector && k.slots <= kSwigluTwoCtasMaxSlots ? 2 : 0,
          .template_key = std::string(kOp) + ":" + k.to_string()};
}

// One CTA per row (a row per CTA at a time: the grid covers the rows once up to the grid limit),
// ceil(units / slots) threads rounded up to a warp; with the table, kTableCtasPerSm CTAs per SM,
// each walking its rows.
void launch(const Fp8RowwiseQuantCall& c, const Fp8RowwiseQuantKey& k, const jit::LoadedKernel& kernel) {
  Fp8RowwiseQuantParams p{};
  p.x = c.x.data;
  p.prefix = c.prefix_width ? c.prefix.data : nullptr;
  p.out = c.out.data;
  p.out_scale = static_cast<float*>(c.out_scale.data);
  p.rows = c.rows;
  p.x_row_stride = c.x_row_stride;
  p.prefix_row_stride = c.prefix_row_stride;
  p.width = static_cast<int>(c.act_width);
  p.up_offset = static_cast<int>(c.width - c.act_width);
  p.prefix_width = static_cast<int>(c.prefix_width);
  p.units = static_cast<int>(units_of(c));
  const int64_t threads = (p.units + k.slots - 1) / k.slots;
  const unsigned block = static_cast<unsigned>((threads + 31) / 32 * 32);
  // The table's grid: kTableCtasPerSm CTAs per SM, fewer where the kernel's occupancy allows fewer.
  const int64_t ctas =
      k.table ? int64_t{std::min(kTableCtasPerSm, kernel.blocks_per_sm)} * kernel.multiprocessors : int64_t{0x7fffffff};
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(c.rows, ctas));
  jit::launch(kernel, grid, block, &p, sizeof p, static_cast<CUstream>(c.stream), k.pdl);
}

// The compile test's keys: every slot bucket (bf16, vector, the GELU), no act, SwiGLU at slots 1, 3
// (FLUX.2: 18432 and 6144 + 18432 columns) and 4, and on the scalar path; f16 and the scalar path,
// PDL off; the table's GELU at slots 3 and 4 (FLUX.1's FF-down input and single-block cat), 4 without
// PDL, and 6 (Wan's FF-down input).
std::vector<Fp8RowwiseQuantKey> variant_keys() {
  std::vector<Fp8RowwiseQuantKey> keys;
  for (int s : kSlotBuckets) keys.push_back({DType::bf16, s, true, kFp8RowwiseGelu, false, true});
  keys.push_back({DType::bf16, 3, true, kFp8RowwiseActNone, false, true});
  for (int act : {kFp8RowwiseActNone, kFp8RowwiseGelu})
    keys.push_back({DType::f16, 2, act != kFp8RowwiseGelu, act, false, true});
  keys.push_back({DType::bf16, 8, false, kFp8RowwiseGelu, false, false});
  for (int s : {1, 3, 4}) keys.push_back({DType::bf16, s, true, kFp8RowwiseSwiglu, false, true});
  keys.push_back({DType::f16, 2, false, kFp8RowwiseSwiglu, false, false});
  keys.push_back({DType::f16, 1, true, kFp8RowwiseActNone, false, false});
  for (int s : {3, 4, 6}) keys.push_back({DType::bf16, s, true, kFp8RowwiseGelu, true, true});
  keys.push_back({DType::bf16, 4, true, kFp8RowwiseGelu, true, false});
  return keys;
}

std::string refusal(const Fp8RowwiseQuantCall& c) {
  if (units_of(c) <= kMaxUnits) return "";
  return "rows of Kp + N = " + num(c.prefix_width + c.act_width) + " columns are wider than the kernel's " +
         num(kMaxUnits * kUnitColumns) + " (a row lives in registers)";
}

constexpr KernelFunctions<Fp8RowwiseQuantCall, Fp8RowwiseQuantKey> kKernels{
    .key = key_for, .request = request_for, .launch = launch,
    .nothing_to_do = [](const Fp8RowwiseQuantCall& c) { return c.rows == 0; }, .refusal = refusal,
    .variant_keys = variant_keys};
using Kernels = OpKernels<describe, kKernels>;

void register_fp8_rowwise_quant(Registry& registry) {
  const std::string eager =
      "eager PyTorch on CUDA: ditops.eager.fp8_rowwise_quant_eager (fp8_rowwise_eager of torch.cat([prefix, act(x)], "
      "-1): torchao 0.18's float8 rowwise recipe, amax / 448.0 rounded to x's dtype, 1 for a zero scale, "
      "(y.float() / s).clamp(-448, 448).to(torch.float8_e4m3fn)); act=gelu_tanh: F.gelu(x, approximate='tanh'); "
      "act=swiglu: "
      "F.silu(x[..., :K/2]) * x[..., K/2:] (ATen's silu: x / (1 + expf(-x)) in fp32, rounded; the product rounded)";
  add_jit<Kernels>(
      registry,
      {.sm_min = 89,  // cvt e4m3x2
       .contract = Contract::bit_exact(eager).verified(
           "H200 (sm_90), scripts/device_run.sh verify at bf0f87e: torch.equal in 63 of 63 cases of bench/fp8_rowwise_quant_torch.py (act none and gelu_tanh) and in "
           "graph replay; act=swiglu (added after that run): on an H100 (sm_90), verify at 2670cc6: torch.equal "
           "in 15 of 15 swiglu cases (78 of 78 in all) and tests/python/test_fp8_rowwise.py's swiglu test; the one "
           "GELU form (the fma) on an H100 at 1610988: 60 of 60 (none 27, gelu_tanh 18, swiglu 15) and graph replay; "
           "not yet on the H200"),
       .description = "a CTA per row holding it in registers (16 columns a unit: two 16-byte loads, one 16-byte "
                      "store), the amax reduced over the CTA; NVRTC at first use"});
  add_reference<Kernels>(
      registry, fp8_rowwise_quant_reference,
      Contract::close(eager,
                      "act=none: byte-equal (the same IEEE operations; a NaN scale's payload is unspecified); "
                      "act=gelu_tanh: tanh in double rounded to fp32 where CUDA's tanhf is within 2 ulp, so a "
                      "GELU value may differ by one ulp of the dtype, its e4m3 byte by one code, and the row's "
                      "scale by one ulp of the dtype where that value is the row's amax; act=swiglu: exp in double "
                      "rounded to fp32 where CUDA's expf is within 2 ulp, so a silu value may differ by one ulp of the "
                      "dtype, the product by two, its e4m3 byte by two codes and the row's scale by four ulps")
          .verified("on every CI run (CPU) by the op's tests against a float64 transcription"),
      "CPU reference: the recipe per row, each operation one IEEE binary32 operation");
}

}  // namespace

DITOPS_OP_ENTRIES(fp8_rowwise_quant, Kernels, register_fp8_rowwise_quant);

}  // namespace ditops
