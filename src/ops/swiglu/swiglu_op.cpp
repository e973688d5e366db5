// swiglu: the description, argument matching, the kernel functions (src/ops/common/act_rows: key, request, launch), the registry
// entries (the jit implementation, the CPU reference) and the reference. The kernel is
// kernels/swiglu.cuh, the numerics common/swiglu.cuh's (shared with fp8_rowwise_quant's act=swiglu).
#include <cstdint>
#include <string>
#include <vector>

#include "core/builtin_ops.h"
#include "core/implementation.h"
#include "core/matcher.h"
#include "core/op_builder.h"
#include "ditops/swiglu.h"
#include "ops/common/act_rows.h"
#include "reference/fp8_rowwise.h"

namespace ditops {

namespace {

constexpr const char* kOp = "swiglu";

std::string num(int64_t v) { return std::to_string(v); }

void complete(SwigluCall& call, Matcher& m);  // the op's own rules, after the slots'

// The op described once: its slots state the checks every call gets (core/op_builder.h).
OpBuilder<SwigluCall> describe() {
  using C = SwigluCall;
  OpBuilder<C> b(kOp, "out = F.silu(x[..., :N]) * x[..., N:] (FLUX.2's SwiGLU), each step rounded as eager",
                 "x [..., K] bf16|f16|f32 (K = 2N, rows of one stride); out [..., N] (x's leading dims) or [M, N], "
                 "rows of one stride >= N (a column slice of a cat buffer); prefix [..., Kp] optional: out [..., Kp + N] = "
                 "cat([prefix, act(x)], -1). include/ditops/swiglu.h, docs/swiglu.md");
  b.dims("M=4608,K=36864");
  // x's and out's ranks, extents and row strides are the op's own rules.
  b.tensor<&C::x>({.dtypes = "bf16|f16|f32", .shape = "M,K", .own = "shape"});
  // out is the caller's (a column slice of a cat buffer): written, never read.
  b.tensor<&C::out>({.role = TensorRole::inout, .dtypes = "=x", .shape = "M,K/2", .own = "shape"});
  // prefix (the attention output): out = cat([prefix, act(x)], -1), its columns copied in the same pass.
  b.tensor<&C::prefix>({.optional = true, .dtypes = "=x", .shape = "M,Kp", .own = "shape"});
  b.pdl_option<&SwigluOptions::use_pdl>();
  b.complete(complete);
  return b;
}

void complete(SwigluCall& call, Matcher& m) {
  const TensorView& x = call.x;
  if (x.rank < 1) m.fail("x must have rank >= 1 ([..., 2N]) but has rank 0");
  const int r = x.rank;
  const int64_t K = x.shape[r - 1];
  if (K % 2)
    m.fail("x.shape[" + num(r - 1) + "] must be even (F.silu(x[..., :N]) * x[..., N:], N = K / 2) but is " + num(K));
  call.width = K / 2;
  complete_act_rows(call, m, "x.shape[" + num(r - 1) + "]=" + num(K) + " / 2");
}

constexpr KernelFunctions<SwigluCall, ActRowsKey> kKernels{
    .key = act_rows_key<SwigluCall>,
    .request = [](const ActRowsKey& k) { return act_rows_request(kOp, k); },
    .launch = act_rows_launch<SwigluCall>,
    .nothing_to_do = act_rows_nothing_to_do<SwigluCall>,
    .variant_keys = act_rows_variant_keys};
using Kernels = OpKernels<describe, kKernels>;

void register_swiglu(Registry& registry) {
  const std::string eager =
      "eager PyTorch on CUDA: F.silu(x[..., :N]) * x[..., N:] (ditops.eager.swiglu: ATen's silu, x / (1 + expf(-x)) "
      "in fp32, rounded to the dtype; the product in fp32, rounded)";
  add_jit<Kernels>(registry,
                   {.contract = Contract::bit_exact(eager).verified(
                        "H100 (sm_90), scripts/device_run.sh verify at 1db554a: torch.equal in 14 of 14 cases of "
                        "bench/swiglu_torch.py and in graph replay, and tests/python/test_diffusers_flux2.py's GPU "
                        "tests (FLUX.2's two sites equal to the model's code); the prefix (the whole cat buffer) on an "
                        "H100 at 7d62f24: 16 of 16 with its 2 prefix cases, graph replay, the FLUX.2 GPU tests; not "
                        "yet on the H200"),
                    .description = "a thread per 16 bytes of out (two 16-byte streaming loads of x), scalar "
                                   "elements where unaligned; NVRTC at first use"});
  add_reference<Kernels>(
      registry, swiglu_reference,
      Contract::close(eager,
                      "exp in double rounded to fp32 where CUDA's expf is within 2 ulp, so a silu value may differ "
                      "by one ulp of the dtype and the product by two (f32: up to four ulps, in about 12 % of the "
                      "elements on an H100)")
          .verified("on every CI run (CPU) by the op's tests against a float64 transcription"),
      "CPU reference: each element's fp32 operations, each one IEEE binary32 operation");
}

}  // namespace

// The CPU oracle: per row and column, ref::silu (exp in double rounded to fp32) and the product,
// rounded to the dtype at each step as eager does (f32: no rounding in between).
void swiglu_reference(const SwigluCall& c) {
  for (const TensorView* t : {&c.x, &c.out, &c.prefix})
    if (t->data && t->device.kind != DeviceKind::cpu) throw Error("swiglu reference: every tensor must be on the cpu");
  const int64_t N = c.width;
  for (int64_t r = 0; r < c.rows; ++r) {
    if (c.x.dtype == DType::f32) {
      const float* x = static_cast<const float*>(c.x.data) + r * c.x_row_stride;
      float* out = act_reference_row<float>(c, r);
      for (int64_t j = 0; j < N; ++j) out[j] = ref::silu(x[j]) * x[j + N];
    } else {
      const uint16_t* x = static_cast<const uint16_t*>(c.x.data) + r * c.x_row_stride;
      uint16_t* out = act_reference_row<uint16_t>(c, r);
      for (int64_t j = 0; j < N; ++j) out[j] = ref::swiglu(x[j], x[j + N], c.x.dtype);
    }
  }
}

DITOPS_OP_ENTRIES(swiglu, Kernels, register_swiglu);

}  // namespace ditops
