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

// The op described once: its slots state the checks every call gets (core/op_builder.h).
const OpBuilder<Fp8StaticQuantCall>& description() {
  static const OpBuilder<Fp8StaticQuantCall> b = [] {
    OpBuilder<Fp8StaticQuantCall> b(kOp, "e4m3(clamp(x * (1 / scale), +-448)): static per-tensor FP8 quantization",
                                    "x [M, K] bf16|f16 contiguous; scale one fp32 (read on the device; > 0 and finite, "
                                    "checked on the cpu only); out [M, K] e4m3fn. include/ditops/fp8_static_quant.h, "
                                    "docs/fp8_linear.md");
    b.dims("M=16,K=5120");
    b.tensor({.name = "x", .dtypes = "bf16|f16", .shape = "M,K", .layout = "contiguous"}, &Fp8StaticQuantCall::x);
    b.tensor({.name = "scale", .dtypes = "f32", .shape = "1"}, &Fp8StaticQuantCall::scale);
    b.tensor({.name = "out", .role = TensorRole::out, .keyword = true, .dtypes = "f8e4m3fn", .shape = "M,K",
              .alloc = "dim(x,0),dim(x,1)", .alloc_dtype = "f8e4m3fn", .layout = "contiguous"},
             &Fp8StaticQuantCall::out);
    describe_fp8_reciprocal(b, &Fp8StaticQuantOptions::fp8_reciprocal, "scale");
    b.option("use_pdl", &Fp8StaticQuantOptions::use_pdl, "programmatic dependent launch where the device has it");
    return b;
  }();
  return b;
}

}  // namespace

Fp8StaticQuantCall match_fp8_static_quant(const TensorView& x, const TensorView& scale, const TensorView& out,
                                          const Fp8StaticQuantOptions& options, Stream stream) {
  Fp8StaticQuantCall call{.x = x, .scale = scale, .out = out, .options = options};
  const Matcher m = description().match(call);
  call.rows = *m.value("M");
  call.width = *m.value("K");
  call.aligned16 = call.width % 16 == 0 && is_aligned(x.data, 16) && is_aligned(out.data, 16);
  call.stream = stream;
  return call;
}

namespace {

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
struct Kernels {
  using Call = Fp8StaticQuantCall;
  using Key = TokenCatFp8Key;
  static constexpr const char* op = kOp;
  static constexpr const char* device_tensor = "x";
  static Device device(const Call& c) { return c.x.device; }
  static Key key(const Call& c, const DeviceInfo& d) { return token_cat_fp8_key(as_token_cat(c), d); }
  static KernelRequest request(const Key& k) { return token_cat_fp8_request(k); }
  static void launch(const Call& c, const Key& k, const jit::LoadedKernel& l) {
    token_cat_fp8_launch(as_token_cat(c), k, l);
  }
  static bool nothing_to_do(const Call& c) { return c.rows * c.width == 0; }
};

}  // namespace

void fp8_static_quant_reference(const Fp8StaticQuantCall& call) { token_cat_fp8_reference(as_token_cat(call)); }

std::string fp8_static_quant(const TensorView& x, const TensorView& scale, const TensorView& out,
                             const Fp8StaticQuantOptions& options, Stream stream) {
  const Fp8StaticQuantCall call = match_fp8_static_quant(x, scale, out, options, stream);
  check_host_scale(kOp, "scale", call.scale);
  return dispatch<Kernels>(call, stream, options.dispatch);
}

DispatchReport explain_fp8_static_quant(const Fp8StaticQuantCall& call) {
  return explain<Kernels>(call, call.options.dispatch);
}

void register_fp8_static_quant(Registry& registry) {
  registry.describe(description().build(
      [](const Fp8StaticQuantCall& a, Stream s) { return fp8_static_quant(a.x, a.scale, a.out, a.options, s); },
      [](const Fp8StaticQuantCall& a) {
        return explain_fp8_static_quant(match_fp8_static_quant(a.x, a.scale, a.out, a.options));
      }));
  const std::string eager =
      "eager PyTorch on CUDA: (x.float() * (1.0 / scale)).clamp(-448, 448).to(torch.float8_e4m3fn)";
  const std::string sglang = "SGLang's static_quant_fp8(x, scale) (Triton: inv = div.full.f32 1/scale)";
  Implementation<Fp8StaticQuantCall, TokenCatFp8Key> jit = jit_implementation<Kernels>();
  jit.name = "fp8_static_quant.jit";
  jit.capabilities = {{DeviceKind::cuda, 89, 1 << 20, kFeatureNvrtc}};  // cvt e4m3x2: sm_89+
  add_per_reciprocal(registry, kOp, jit, [&](auto& impl, bool div_full) {
    impl.contract = Contract::bit_exact(div_full ? sglang : eager)
                        .verified("H200 (sm_90) at b3fce58: torch.equal (uint8 views) to its oracle at 4 shapes x 2 "
                                  "scales of bench/fp8_linear_torch.py (div_full: the Triton div.full.f32 "
                                  "reciprocal, then the eager chain; bench/results/h200/checks/fp8_linear_checks.json)");
    impl.description = std::string("token_cat_fp8's flat grid-stride kernel with one input: 16 outputs per unit "
                                   "from two 16-byte loads (scalar units for other widths or alignments); NVRTC at "
                                   "first use; fp8_reciprocal=") +
                       (div_full ? "div_full" : "ieee");
  });
  add_implementation(
      registry, kOp,
      reference_implementation<Kernels>(
          fp8_static_quant_reference,
          Contract::close(eager + "; with fp8_reciprocal=div_full, " + sglang,
                          "ieee: byte-equal (IEEE reciprocal and product, exact e4m3 RNE); div_full: the "
                          "reciprocal is an IEEE division, so a byte may differ by one code where div.full.f32's "
                          "1/scale differs from it (<= 2 ulp)")
              .verified("on every CI run (CPU) by the op's tests (token_cat_fp8's reference, which every CUDA "
                        "implementation of token_cat_fp8 matched on the H200)"),
          "CPU reference: token_cat_fp8's (exact e4m3 RNE of clamp(x * (1 / scale)), no FP contraction)"));
}

DITOPS_REGISTER_OP(register_fp8_static_quant);

}  // namespace ditops
