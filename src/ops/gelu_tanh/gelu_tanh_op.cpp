// gelu_tanh: the description, argument matching, the kernel functions (src/ops/common/act_rows: key, request, launch), the
// registry entries (the jit implementation, the CPU reference) and the reference. The kernel is
// kernels/gelu_tanh.cuh, the numerics common/gelu.cuh's (shared with fp8_rowwise_quant's act=gelu_tanh).
#include <cstdint>
#include <string>
#include <vector>

#include "core/builtin_ops.h"
#include "core/implementation.h"
#include "core/matcher.h"
#include "core/op_builder.h"
#include "ditops/gelu_tanh.h"
#include "ops/common/act_rows.h"
#include "reference/fp8_rowwise.h"

namespace ditops {

namespace {

constexpr const char* kOp = "gelu_tanh";

std::string num(int64_t v) { return std::to_string(v); }

void complete(GeluTanhCall& call, Matcher& m);  // the op's own rules, after the slots'

// The op described once: its slots state the checks every call gets (core/op_builder.h).
OpBuilder<GeluTanhCall> describe() {
  using C = GeluTanhCall;
  OpBuilder<C> b(kOp, "out = F.gelu(x, approximate='tanh') (FLUX.1's and HunyuanVideo's GELU), rounded as eager",
                 "x [..., N] bf16|f16|f32 (rows of one stride); out [..., N] (x's leading dims) or [M, N], rows of "
                 "one stride >= N (a column slice of a cat buffer); prefix [..., Kp] optional: out [..., Kp + N] = "
                 "cat([prefix, gelu(x)], -1). include/ditops/gelu_tanh.h, docs/gelu_tanh.md");
  b.dims("M=4608,N=12288");
  // x's and out's ranks, extents and row strides are the op's own rules.
  b.tensor<&C::x>({.dtypes = "bf16|f16|f32", .shape = "M,N", .own = "shape"});
  // out is the caller's (a column slice of a cat buffer): written, never read.
  b.tensor<&C::out>({.role = TensorRole::inout, .dtypes = "=x", .shape = "M,N", .own = "shape"});
  // prefix (the attention output): out = cat([prefix, act(x)], -1), its columns copied in the same pass.
  b.tensor<&C::prefix>({.optional = true, .dtypes = "=x", .shape = "M,Kp", .own = "shape"});
  b.pdl_option<&GeluTanhOptions::use_pdl>();
  b.complete(complete);
  return b;
}

void complete(GeluTanhCall& call, Matcher& m) {
  const TensorView& x = call.x;
  if (x.rank < 1) m.fail("x must have rank >= 1 ([..., N]) but has rank 0");
  const int r = x.rank;
  call.width = x.shape[r - 1];
  complete_act_rows(call, m, "x.shape[" + num(r - 1) + "]");
}

constexpr KernelFunctions<GeluTanhCall, ActRowsKey> kKernels{
    .key = act_rows_key<GeluTanhCall>,
    .request = [](const ActRowsKey& k) { return act_rows_request(kOp, k); },
    .launch = act_rows_launch<GeluTanhCall>,
    .nothing_to_do = act_rows_nothing_to_do<GeluTanhCall>,
    .variant_keys = act_rows_variant_keys};
using Kernels = OpKernels<describe, kKernels>;

void register_gelu_tanh(Registry& registry) {
  const std::string eager =
      "eager PyTorch on CUDA: F.gelu(x, approximate='tanh') (ditops.eager.gelu_tanh: ATen's GeluCUDAKernelImpl in "
      "fp32 with nvcc's fma of x + 0.044715 x^3, CUDA's tanhf, rounded to the dtype)";
  add_jit<Kernels>(registry,
                   {.contract = Contract::bit_exact(eager).verified(
                        "H100 (sm_90) at 18174c5: torch.equal in 14 of 14 cases of bench/gelu_tanh_torch.py and in "
                        "graph replay, the driver's cases on the GPU, and the FLUX.1 / HunyuanVideo GPU tests of "
                        "tests/python/test_diffusers.py (the single blocks' cat sites equal to the model's code); the "
                        "prefix (the whole cat buffer) on an H100 at 7d62f24: 17 of 17 with its 3 prefix cases, graph "
                        "replay, the five diffusers modules' GPU tests; not yet on the H200"),
                    .description = "a thread per 16 bytes of out (one 16-byte streaming load of x), scalar "
                                   "elements where unaligned; NVRTC at first use"});
  add_reference<Kernels>(
      registry, gelu_tanh_reference,
      Contract::close(eager,
                      "tanh in double rounded to fp32 where CUDA's tanhf is within 2 ulp, so a value may differ by "
                      "one ulp of the dtype (f32: a few ulps)")
          .verified("on every CI run (CPU) by the op's tests against a float64 transcription"),
      "CPU reference: each element's fp32 operations, each one IEEE binary32 operation");
}

}  // namespace

// The CPU oracle: per row and column, ref::gelu_tanh with the fma (tanh in double rounded to fp32),
// rounded to the dtype as eager does (f32: no rounding).
void gelu_tanh_reference(const GeluTanhCall& c) {
  for (const TensorView* t : {&c.x, &c.out, &c.prefix})
    if (t->data && t->device.kind != DeviceKind::cpu) throw Error("gelu_tanh reference: every tensor must be on the cpu");
  const int64_t N = c.width;
  for (int64_t r = 0; r < c.rows; ++r) {
    if (c.x.dtype == DType::f32) {
      const float* x = static_cast<const float*>(c.x.data) + r * c.x_row_stride;
      float* out = act_reference_row<float>(c, r);
      for (int64_t j = 0; j < N; ++j) out[j] = ref::gelu_tanh(x[j]);
    } else {
      const uint16_t* x = static_cast<const uint16_t*>(c.x.data) + r * c.x_row_stride;
      uint16_t* out = act_reference_row<uint16_t>(c, r);
      for (int64_t j = 0; j < N; ++j)
        out[j] = ref::float_to_act_bits(ref::gelu_tanh(ref::act_bits_to_float(x[j], c.x.dtype)), c.x.dtype);
    }
  }
}

DITOPS_OP_ENTRIES(gelu_tanh, Kernels, register_gelu_tanh);

}  // namespace ditops
