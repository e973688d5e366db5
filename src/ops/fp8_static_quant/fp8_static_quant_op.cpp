// fp8_static_quant: argument matching, the kernel family (token_cat_fp8's
// kernel with one input: Da = K, Dm = 0), the registry entries (one jit implementation per
// reciprocal mode, the CPU reference) and the op's description.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/builtin_ops.h"
#include "core/implementation.h"
#include "core/matcher.h"
#include "core/op_builder.h"
#include "ditops/fp8_static_quant.h"
#include "ditops/token_cat_fp8.h"
#include "jit/cuda_driver.h"
#include "jit/jit.h"
#include "jit/kernel_family.h"
#include "ops/common/fp8.h"
#include "ops/token_cat_fp8/token_cat_fp8_kernels.h"

namespace ditops {

namespace {

constexpr const char* kOp = "fp8_static_quant";

// The op's own rules after the slots' and the fields they derive.
void complete(Fp8StaticQuantCall& call, Matcher& m) {
  call.rows = *m.value("M");
  call.width = *m.value("K");
  call.aligned16 = call.width % 16 == 0 && is_aligned(call.x.data, 16) && is_aligned(call.out.data, 16);
}

// The op described once: its slots state the checks every call gets (core/op_builder.h).
OpBuilder<Fp8StaticQuantCall> describe() {
  using C = Fp8StaticQuantCall;
  OpBuilder<C> b(kOp, "e4m3(clamp(x * (1 / scale), +-448)): static per-tensor FP8 quantization",
                 "x [M, K] bf16|f16 contiguous; scale one fp32 (read on the device; > 0 and finite, checked on "
                 "the cpu only); out [M, K] e4m3fn. include/ditops/fp8_static_quant.h, docs/fp8_linear.md");
  b.dims("M=16,K=5120");
  b.tensor<&C::x>({.dtypes = "bf16|f16", .shape = "M,K", .layout = "contiguous"});
  b.tensor<&C::scale>({.dtypes = "f32", .shape = "1"});
  b.tensor<&C::out>({.role = TensorRole::out, .keyword = true, .dtypes = "f8e4m3fn", .shape = "M,K",
                     .alloc = "dim(x,0),dim(x,1)", .alloc_dtype = "f8e4m3fn", .layout = "contiguous"});
  describe_fp8_reciprocal<&Fp8StaticQuantOptions::fp8_reciprocal>(b, "scale");
  b.pdl_option<&Fp8StaticQuantOptions::use_pdl>();
  b.complete(complete);
  b.check_before_run([](const C& c) { check_host_scale(kOp, "scale", c.scale); });
  return b;
}

// The same call as token_cat_fp8's with no mlp columns.
TokenCatFp8Call as_token_cat(const Fp8StaticQuantCall& c) {
  TokenCatFp8Call t;
  t.attn = c.x;
  t.mlp = TensorView::contiguous(c.x.data, c.x.dtype, c.x.device, {c.rows, int64_t{0}});
  t.input_scale = c.scale;
  t.out = c.out;
  t.options.fp8_reciprocal = c.options.fp8_reciprocal;
  t.options.use_pdl = c.options.use_pdl;
  t.rows = c.rows;
  t.attn_width = c.width;
  t.mlp_width = 0;
  t.width = c.width;
  t.aligned16 = c.aligned16;
  t.stream = c.stream;
  return t;
}

// token_cat_fp8's key, request and launch: its request names the same template key, so one
// compile and one cache entry serve both ops. No variant keys: token_cat_fp8's compile them.
constexpr KernelFunctions<Fp8StaticQuantCall, TokenCatFp8Key> kKernels{
    .key = [](const Fp8StaticQuantCall& c, const DeviceInfo& d) { return token_cat_fp8_key(as_token_cat(c), d); },
    .request = token_cat_fp8_request,
    .launch = [](const Fp8StaticQuantCall& c, const TokenCatFp8Key& k,
                 const jit::LoadedKernel& l) { token_cat_fp8_launch(as_token_cat(c), k, l); },
    .nothing_to_do = [](const Fp8StaticQuantCall& c) { return c.rows * c.width == 0; }};
using Kernels = OpKernels<describe, kKernels>;

void register_fp8_static_quant(Registry& registry) {
  const std::string eager =
      "eager PyTorch on CUDA: (x.float() * (1.0 / scale)).clamp(-448, 448).to(torch.float8_e4m3fn)";
  const std::string sglang = "SGLang's static_quant_fp8(x, scale) (Triton: inv = div.full.f32 1/scale)";
  // cvt e4m3x2: sm_89+
  add_per_reciprocal(registry, kOp, jit_implementation<Kernels>({.sm_min = 89}), [&](auto& impl, bool div_full) {
    impl.contract = Contract::bit_exact(div_full ? sglang : eager)
                        .verified("H200 (sm_90) at b3fce58: torch.equal (uint8 views) to its oracle at 4 shapes x 2 "
                                  "scales of bench/fp8_linear_torch.py (div_full: the Triton div.full.f32 "
                                  "reciprocal, then the eager chain; bench/results/h200/checks/fp8_linear_checks.json)");
    impl.description = std::string("token_cat_fp8's flat grid-stride kernel with one input: 16 outputs per unit "
                                   "from two 16-byte loads (scalar units for other widths or alignments); NVRTC at "
                                   "first use; fp8_reciprocal=") +
                       (div_full ? "div_full" : "ieee");
  });
  add_reference<Kernels>(
      registry, fp8_static_quant_reference,
      token_cat_fp8_reference_contract(eager, sglang, "scale")
          .verified("on every CI run (CPU) by the op's tests (token_cat_fp8's reference, which every CUDA "
                    "implementation of token_cat_fp8 matched on the H200)"),
      "CPU reference: token_cat_fp8's (exact e4m3 RNE of clamp(x * (1 / scale)), no FP contraction)");
}

}  // namespace

void fp8_static_quant_reference(const Fp8StaticQuantCall& call) { token_cat_fp8_reference(as_token_cat(call)); }

DITOPS_OP_ENTRIES(fp8_static_quant, Kernels, register_fp8_static_quant);

}  // namespace ditops
