// swiglu: the description, argument matching, the kernel key, its request and launch, the registry
// entries (the jit implementation, the CPU reference) and the reference. The kernel is
// kernels/swiglu.cuh, the numerics common/swiglu.cuh's (shared with fp8_rowwise_quant's act=swiglu).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/builtin_ops.h"
#include "core/implementation.h"
#include "core/matcher.h"
#include "core/op_builder.h"
#include "ditops/swiglu.h"
#include "jit/cuda_driver.h"
#include "jit/jit.h"
#include "jit/kernel_family.h"
#include "kernels/swiglu.cuh"
#include "ops/common/rows.h"
#include "reference/fp8_rowwise.h"

namespace ditops {

namespace {

constexpr const char* kOp = "swiglu";
constexpr int kMaxThreads = 256;
constexpr int64_t kMaxGrid = int64_t{1} << 20;  // CTAs; more pieces loop (the kernel's grid stride)

std::string num(int64_t v) { return std::to_string(v); }

void complete(SwigluCall& call, Matcher& m);  // the op's own rules, after the slots'

// The op described once: its slots state the checks every call gets (core/op_builder.h).
OpBuilder<SwigluCall> describe() {
  using C = SwigluCall;
  OpBuilder<C> b(kOp, "out = F.silu(x[..., :N]) * x[..., N:] (FLUX.2's SwiGLU), each step rounded as eager",
                 "x [..., K] bf16|f16|f32 (K = 2N, rows of one stride); out [..., N] (x's leading dims) or [M, N], "
                 "rows of one stride >= N (a column slice of a cat buffer). include/ditops/swiglu.h, docs/swiglu.md");
  b.dims("M=4608,K=36864");
  // x's and out's ranks, extents and row strides are the op's own rules.
  b.tensor<&C::x>({.dtypes = "bf16|f16|f32", .shape = "M,K", .own = "shape"});
  // out is the caller's (a column slice of a cat buffer): written, never read.
  b.tensor<&C::out>({.role = TensorRole::inout, .dtypes = "=x", .shape = "M,K/2", .own = "shape"});
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
  const ActRows a = match_act_rows(m, x, call.out, call.width, "x.shape[" + num(r - 1) + "]=" + num(K) + " / 2");
  call.rows = a.rows;
  call.x_row_stride = a.x_row_stride;
  call.out_row_stride = a.out_row_stride;
  call.aligned16 = a.aligned16;
}

// The template key: exactly the kernel's template parameters.
struct SwigluKey {
  DType dtype = DType::bf16;
  bool vector = true;
  bool pdl = true;

  std::string to_string() const {
    return std::string(dtype_name(dtype)) + (vector ? ",vec16" : ",scalar") + (pdl ? ",pdl" : ",nopdl");
  }
  uint64_t packed() const { return pack_key({dtype, vector, pdl}); }
};

SwigluKey key_for(const SwigluCall& c, const DeviceInfo& device) {
  return {.dtype = c.x.dtype, .vector = c.aligned16, .pdl = c.options.use_pdl && (device.features & kFeaturePdl)};
}

KernelRequest request_for(const SwigluKey& k) {
  return {.header = "swiglu.cuh",
          .function = "ditops::swiglu_body",
          .template_args = jit::kernel_args(k.dtype, k.vector, k.pdl),
          .params_type = "ditops::SwigluParams",
          .max_threads = kMaxThreads,
          .template_key = std::string(kOp) + ":" + k.to_string()};
}

// A CTA per piece of a row: up to kMaxThreads units (16 bytes each on the vector path), the threads
// rounded up to a warp. Not tuned yet (no device run).
void launch(const SwigluCall& c, const SwigluKey& k, const jit::LoadedKernel& kernel) {
  SwigluParams p{};
  p.x = c.x.data;
  p.out = c.out.data;
  p.rows = c.rows;
  p.x_row_stride = c.x_row_stride;
  p.out_row_stride = c.out_row_stride;
  p.width = c.width;
  p.units = k.vector ? c.width / (16 / static_cast<int64_t>(dtype_size(k.dtype))) : c.width;
  const long long threads = std::min<long long>(kMaxThreads, (p.units + 31) / 32 * 32);
  p.blocks_per_row = (p.units + threads - 1) / threads;
  p.blocks = c.rows * p.blocks_per_row;
  const unsigned grid = static_cast<unsigned>(std::min<long long>(p.blocks, kMaxGrid));
  jit::launch(kernel, grid, static_cast<unsigned>(threads), &p, sizeof p, static_cast<CUstream>(c.stream), k.pdl);
}

// The compile test's keys: every dtype on both paths, and one without PDL.
std::vector<SwigluKey> variant_keys() {
  std::vector<SwigluKey> keys;
  for (DType dt : {DType::bf16, DType::f16, DType::f32})
    for (bool vector : {true, false}) keys.push_back({dt, vector, true});
  keys.push_back({DType::bf16, true, false});
  return keys;
}

constexpr KernelFunctions<SwigluCall, SwigluKey> kKernels{
    .key = key_for, .request = request_for, .launch = launch,
    .nothing_to_do = [](const SwigluCall& c) { return c.rows == 0 || c.width == 0; },
    .variant_keys = variant_keys};
using Kernels = OpKernels<describe, kKernels>;

void register_swiglu(Registry& registry) {
  const std::string eager =
      "eager PyTorch on CUDA: F.silu(x[..., :N]) * x[..., N:] (ditops.eager.swiglu: ATen's silu, x / (1 + expf(-x)) "
      "in fp32, rounded to the dtype; the product in fp32, rounded)";
  add_jit<Kernels>(registry,
                   {.contract = Contract::bit_exact(eager).verified(
                        "H100 (sm_90), scripts/device_run.sh verify at 1db554a: torch.equal in 14 of 14 cases of "
                        "bench/swiglu_torch.py and in graph replay, and tests/python/test_diffusers_flux2.py's GPU "
                        "tests (FLUX.2's two sites equal to the model's code); not yet on the H200"),
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
  for (const TensorView* t : {&c.x, &c.out})
    if (t->data && t->device.kind != DeviceKind::cpu) throw Error("swiglu reference: every tensor must be on the cpu");
  const int64_t N = c.width;
  for (int64_t r = 0; r < c.rows; ++r) {
    if (c.x.dtype == DType::f32) {
      const float* x = static_cast<const float*>(c.x.data) + r * c.x_row_stride;
      float* out = static_cast<float*>(c.out.data) + r * c.out_row_stride;
      for (int64_t j = 0; j < N; ++j) out[j] = ref::silu(x[j]) * x[j + N];
    } else {
      const uint16_t* x = static_cast<const uint16_t*>(c.x.data) + r * c.x_row_stride;
      uint16_t* out = static_cast<uint16_t*>(c.out.data) + r * c.out_row_stride;
      for (int64_t j = 0; j < N; ++j) out[j] = ref::swiglu(x[j], x[j + N], c.x.dtype);
    }
  }
}

DITOPS_OP_ENTRIES(swiglu, Kernels, register_swiglu);

}  // namespace ditops
