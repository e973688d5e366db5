// token_cat_fp8: argument matching, the kernel key, its request and launch, the registry entries
// (one jit implementation per reciprocal mode, the CPU reference) and the op's description.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/builtin_ops.h"
#include "core/implementation.h"
#include "core/matcher.h"
#include "core/op_builder.h"
#include "ditops/token_cat_fp8.h"
#include "jit/cuda_driver.h"
#include "jit/jit.h"
#include "jit/kernel_family.h"
#include "kernels/token_cat_fp8.cuh"
#include "ops/common/fp8.h"
#include "ops/token_cat_fp8/token_cat_fp8_kernels.h"

namespace ditops {

namespace {

constexpr const char* kOp = "token_cat_fp8";
constexpr int kThreads = 256;

// The op's own rules after the slots' and the fields they derive.
void complete(TokenCatFp8Call& call, Matcher& m) {
  const int64_t Da = *m.value("Da"), Dm = *m.value("Dm");
  call.rows = *m.value("B") * *m.value("S");
  call.attn_width = Da;
  call.mlp_width = Dm;
  call.width = Da + Dm;
  call.aligned16 = Da % 16 == 0 && Dm % 16 == 0 && is_aligned(call.attn.data, 16) && is_aligned(call.mlp.data, 16) &&
                   is_aligned(call.out.data, 16);
}

// The op described once: its slots state the checks every call gets (core/op_builder.h).
OpBuilder<TokenCatFp8Call> describe() {
  using C = TokenCatFp8Call;
  OpBuilder<C> b(kOp, "e4m3(clamp(cat([attn, mlp], -1) * (1 / input_scale), +-448)) in one pass",
                 "attn [B, S, Da], mlp [B, S, Dm] bf16|f16 contiguous; input_scale one fp32 (read on "
                 "the device; > 0 and finite, checked on the cpu only); out [B, S, Da + Dm] e4m3fn. "
                 "include/ditops/token_cat_fp8.h, docs/token_cat_fp8.md");
  b.dims("B=1,S=4608,Da=6144,Dm=18432");
  b.tensor<&C::attn>({.dtypes = "bf16|f16", .shape = "B,S,Da", .layout = "contiguous"});
  b.tensor<&C::mlp>({.dtypes = "=attn", .shape = "B,S,Dm", .layout = "contiguous"});
  b.tensor<&C::input_scale>({.dtypes = "f32", .shape = "1"});
  b.tensor<&C::out>({.role = TensorRole::out, .keyword = true, .dtypes = "f8e4m3fn", .shape = "B,S,Da+Dm",
                     .alloc = "dim(attn,0),dim(attn,1),last(attn)+last(mlp)", .alloc_dtype = "f8e4m3fn",
                     .layout = "contiguous"});
  describe_fp8_reciprocal<&TokenCatFp8Options::fp8_reciprocal>(b, "input_scale");
  b.pdl_option<&TokenCatFp8Options::use_pdl>();
  b.complete(complete);
  b.check_before_run([](const C& c) { check_host_scale(kOp, "input_scale", c.input_scale); });
  return b;
}

int64_t elems_per_unit(bool vector) { return vector ? 16 : 1; }
int64_t units_of(const TokenCatFp8Call& c) { return c.rows * c.width / elems_per_unit(c.aligned16); }

}  // namespace

std::string TokenCatFp8Key::to_string() const {
  return std::string(dtype_name(dtype)) + (vector ? ",vec16" : ",scalar") + (div_full ? ",div_full" : ",ieee") +
         (index64 ? ",index64" : "") + (pdl ? ",pdl" : ",nopdl");
}

uint64_t TokenCatFp8Key::packed() const { return pack_key({dtype, vector, div_full, index64, pdl}); }

TokenCatFp8Key token_cat_fp8_key(const TokenCatFp8Call& c, const DeviceInfo& device) {
  TokenCatFp8Key key;
  key.dtype = c.attn.dtype;
  key.vector = c.aligned16;
  key.div_full = c.options.fp8_reciprocal == Fp8Reciprocal::div_full;
  key.index64 = units_of(c) > int64_t{0x7fffffff};
  key.pdl = c.options.use_pdl && (device.features & kFeaturePdl);
  return key;
}

KernelRequest token_cat_fp8_request(const TokenCatFp8Key& key) {
  return {.header = "token_cat_fp8.cuh",
          .function = "ditops::token_cat_fp8_body",
          .template_args = jit::kernel_args(key.dtype, key.vector, key.div_full, key.index64, key.pdl),
          .params_type = "ditops::TokenCatFp8Params",
          .max_threads = kThreads,
          .template_key = std::string(kOp) + ":" + key.to_string()};
}

void token_cat_fp8_launch(const TokenCatFp8Call& c, const TokenCatFp8Key& key, const jit::LoadedKernel& kernel) {
  const int64_t elems = elems_per_unit(key.vector);
  TokenCatFp8Params p{};
  p.attn = c.attn.data;
  p.mlp = c.mlp.data;
  p.input_scale = static_cast<const float*>(c.input_scale.data);
  p.out = c.out.data;
  p.units = c.rows * c.width / elems;
  p.row_units = c.width / elems;
  p.attn_units = c.attn_width / elems;
  if (!key.index64) {
    p.units32 = static_cast<unsigned>(p.units);
    p.row_units32 = static_cast<unsigned>(p.row_units);
    p.attn_units32 = static_cast<unsigned>(p.attn_units);
    p.row_units_divisor = fast_divisor(p.row_units32);  // row_units >= 1: units > 0 here
  }
  // A resident grid (occupancy cached with the kernel), fewer blocks when there is less work. The
  // 32-bit kernel's grid-stride index stays below units + threads * unroll < 2^32.
  const int64_t per_block = int64_t{kThreads} * token_cat_fp8_unroll(key.vector);
  const int64_t resident = std::max<int64_t>(1, int64_t{kernel.blocks_per_sm} * kernel.multiprocessors);
  const int64_t grid = std::max<int64_t>(1, std::min<int64_t>(resident, (p.units + per_block - 1) / per_block));
  jit::launch(kernel, static_cast<unsigned>(grid), kThreads, &p, sizeof p, static_cast<CUstream>(c.stream), key.pdl);
}

Contract token_cat_fp8_reference_contract(const std::string& eager, const std::string& sglang, const std::string& scale) {
  return Contract::close(eager + "; with fp8_reciprocal=div_full, " + sglang,
                         "ieee: byte-equal (IEEE reciprocal and product, exact e4m3 RNE); div_full: the reciprocal "
                         "is an IEEE division, so a byte may differ by one code where div.full.f32's 1/" + scale +
                             " differs from it (<= 2 ulp)");
}

namespace {

// Every code path: both dtypes x vector/scalar x both reciprocals (32-bit, PDL), then the
// 64-bit indices and the launch without PDL.
std::vector<TokenCatFp8Key> token_cat_fp8_variant_keys() {
  std::vector<TokenCatFp8Key> keys;
  for (DType dtype : {DType::bf16, DType::f16})
    for (bool vector : {true, false})
      for (bool div_full : {false, true}) {
        TokenCatFp8Key k;
        k.dtype = dtype;
        k.vector = vector;
        k.div_full = div_full;
        keys.push_back(k);
      }
  for (bool vector : {true, false}) {
    TokenCatFp8Key k;
    k.vector = vector;
    k.index64 = true;
    keys.push_back(k);
  }
  TokenCatFp8Key nopdl;
  nopdl.pdl = false;
  keys.push_back(nopdl);
  return keys;
}

constexpr KernelFunctions<TokenCatFp8Call, TokenCatFp8Key> kKernels{
    .key = token_cat_fp8_key, .request = token_cat_fp8_request, .launch = token_cat_fp8_launch,
    .nothing_to_do = [](const TokenCatFp8Call& c) { return c.rows * c.width == 0; },
    .variant_keys = token_cat_fp8_variant_keys};
using Kernels = OpKernels<describe, kKernels>;

void register_token_cat_fp8(Registry& registry) {
  const std::string eager =
      "eager PyTorch on CUDA: (torch.cat([attn, mlp], -1).float() * (1.0 / input_scale)).clamp(-448, 448)"
      ".to(torch.float8_e4m3fn)";
  const std::string sglang =
      "SGLang's try_flux2_token_cat_fp8 / static_quant_fp8(cat([attn, mlp], -1), input_scale) (Triton: "
      "inv = div.full.f32 1/input_scale)";
  // cvt e4m3x2: sm_89+
  add_per_reciprocal(registry, kOp, jit_implementation<Kernels>({.sm_min = 89}), [&](auto& impl, bool div_full) {
    impl.contract = Contract::bit_exact(div_full ? sglang : eager)
                        .verified(std::string("H200 (sm_90), scripts/device_run.sh ops at 8dea671: "
                                              "bench/token_cat_fp8_torch.py's torch.equal against ") +
                                  (div_full ? "a Triton kernel evaluating SGLang's static_quant_fp8 expression (not SGLang's package)"
                                            : "the eager chain") + ", and a CUDA-graph replay with a changed scale");
    impl.description = std::string("flat grid-stride kernel, 16 outputs per unit from two 16-byte loads (scalar "
                                   "units for other widths or alignments); NVRTC at first use; fp8_reciprocal=") +
                       (div_full ? "div_full" : "ieee");
  });
  add_reference<Kernels>(
      registry, token_cat_fp8_reference,
      token_cat_fp8_reference_contract(eager, sglang, "input_scale")
          .verified("on every CI run (CPU) by the op's tests; on the GPU every CUDA implementation matched it "
                    "within each case's bound (H200 (sm_90), scripts/device_run.sh ops at 8dea671)"),
      "CPU reference: exact e4m3 RNE of clamp(x * (1 / input_scale)), compiled without FP contraction");
}

}  // namespace

DITOPS_OP_ENTRIES(token_cat_fp8, Kernels, register_token_cat_fp8);

}  // namespace ditops
