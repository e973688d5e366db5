// gelu_tanh: the description, argument matching, the kernel key, its request and launch, the
// registry entries (the jit implementation, the CPU reference) and the reference. The kernel is
// kernels/gelu_tanh.cuh, the numerics common/gelu.cuh's (shared with fp8_rowwise_quant's act=gelu_tanh).
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "core/builtin_ops.h"
#include "core/implementation.h"
#include "core/matcher.h"
#include "core/op_builder.h"
#include "ditops/gelu_tanh.h"
#include "jit/cuda_driver.h"
#include "jit/jit.h"
#include "jit/kernel_family.h"
#include "kernels/gelu_tanh.cuh"
#include "ops/common/rows.h"
#include "reference/fp8_rowwise.h"

namespace ditops {

namespace {

constexpr const char* kOp = "gelu_tanh";
constexpr int kMaxThreads = 256;
constexpr int64_t kMaxGrid = int64_t{1} << 20;  // CTAs; more pieces loop (the kernel's grid stride)

std::string num(int64_t v) { return std::to_string(v); }

void complete(GeluTanhCall& call, Matcher& m);  // the op's own rules, after the slots'

// The op described once: its slots state the checks every call gets (core/op_builder.h).
OpBuilder<GeluTanhCall> describe() {
  using C = GeluTanhCall;
  OpBuilder<C> b(kOp, "out = F.gelu(x, approximate='tanh') (FLUX.1's and HunyuanVideo's GELU), rounded as eager",
                 "x [..., N] bf16|f16|f32 (rows of one stride); out [..., N] (x's leading dims) or [M, N], rows of "
                 "one stride >= N (a column slice of a cat buffer). include/ditops/gelu_tanh.h, docs/gelu_tanh.md");
  b.dims("M=4608,N=12288");
  // x's and out's ranks, extents and row strides are the op's own rules.
  b.tensor<&C::x>({.dtypes = "bf16|f16|f32", .shape = "M,N", .own = "shape"});
  // out is the caller's (a column slice of a cat buffer): written, never read.
  b.tensor<&C::out>({.role = TensorRole::inout, .dtypes = "=x", .shape = "M,N", .own = "shape"});
  b.pdl_option<&GeluTanhOptions::use_pdl>();
  b.complete(complete);
  return b;
}

void complete(GeluTanhCall& call, Matcher& m) {
  const TensorView& x = call.x;
  if (x.rank < 1) m.fail("x must have rank >= 1 ([..., N]) but has rank 0");
  const int r = x.rank;
  call.width = x.shape[r - 1];
  const ActRows a = match_act_rows(m, x, call.out, call.width, "x.shape[" + num(r - 1) + "]");
  call.rows = a.rows;
  call.x_row_stride = a.x_row_stride;
  call.out_row_stride = a.out_row_stride;
  call.aligned16 = a.aligned16;
}

// The template key: exactly the kernel's template parameters.
struct GeluTanhKey {
  DType dtype = DType::bf16;
  bool vector = true;
  bool pdl = true;

  std::string to_string() const {
    return std::string(dtype_name(dtype)) + (vector ? ",vec16" : ",scalar") + (pdl ? ",pdl" : ",nopdl");
  }
  uint64_t packed() const { return pack_key({dtype, vector, pdl}); }
};

GeluTanhKey key_for(const GeluTanhCall& c, const DeviceInfo& device) {
  return {.dtype = c.x.dtype, .vector = c.aligned16, .pdl = c.options.use_pdl && (device.features & kFeaturePdl)};
}

KernelRequest request_for(const GeluTanhKey& k) {
  return {.header = "gelu_tanh.cuh",
          .function = "ditops::gelu_tanh_body",
          .template_args = jit::kernel_args(k.dtype, k.vector, k.pdl),
          .params_type = "ditops::GeluTanhParams",
          .max_threads = kMaxThreads,
          .template_key = std::string(kOp) + ":" + k.to_string()};
}

// A CTA per piece of a row: up to kMaxThreads units (16 bytes each on the vector path), the threads
// rounded up to a warp: swiglu's schedule (95-99.9 % of a copy at FLUX.2's widths, H100).
void launch(const GeluTanhCall& c, const GeluTanhKey& k, const jit::LoadedKernel& kernel) {
  GeluTanhParams p{};
  p.x = c.x.data;
  p.out = c.out.data;
  p.rows = c.rows;
  p.x_row_stride = c.x_row_stride;
  p.out_row_stride = c.out_row_stride;
  p.units = k.vector ? c.width / (16 / static_cast<int64_t>(dtype_size(k.dtype))) : c.width;
  const long long threads = std::min<long long>(kMaxThreads, (p.units + 31) / 32 * 32);
  p.blocks_per_row = (p.units + threads - 1) / threads;
  p.blocks = c.rows * p.blocks_per_row;
  const unsigned grid = static_cast<unsigned>(std::min<long long>(p.blocks, kMaxGrid));
  jit::launch(kernel, grid, static_cast<unsigned>(threads), &p, sizeof p, static_cast<CUstream>(c.stream), k.pdl);
}

// The compile test's keys: every dtype on both paths, and one without PDL.
std::vector<GeluTanhKey> variant_keys() {
  std::vector<GeluTanhKey> keys;
  for (DType dt : {DType::bf16, DType::f16, DType::f32})
    for (bool vector : {true, false}) keys.push_back({dt, vector, true});
  keys.push_back({DType::bf16, true, false});
  return keys;
}

constexpr KernelFunctions<GeluTanhCall, GeluTanhKey> kKernels{
    .key = key_for, .request = request_for, .launch = launch,
    .nothing_to_do = [](const GeluTanhCall& c) { return c.rows == 0 || c.width == 0; },
    .variant_keys = variant_keys};
using Kernels = OpKernels<describe, kKernels>;

void register_gelu_tanh(Registry& registry) {
  const std::string eager =
      "eager PyTorch on CUDA: F.gelu(x, approximate='tanh') (ditops.eager.gelu_tanh: ATen's GeluCUDAKernelImpl in "
      "fp32 with nvcc's fma of x + 0.044715 x^3, CUDA's tanhf, rounded to the dtype)";
  add_jit<Kernels>(registry,
                   {.contract = Contract::bit_exact(eager).unverified(
                        "not yet run on a device; the operations are those of the sm_90 SASS of torch 2.11.0+cu130's "
                        "GELU(tanh) kernel (docs/gelu_tanh.md)"),
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
  for (const TensorView* t : {&c.x, &c.out})
    if (t->data && t->device.kind != DeviceKind::cpu) throw Error("gelu_tanh reference: every tensor must be on the cpu");
  const int64_t N = c.width;
  for (int64_t r = 0; r < c.rows; ++r) {
    if (c.x.dtype == DType::f32) {
      const float* x = static_cast<const float*>(c.x.data) + r * c.x_row_stride;
      float* out = static_cast<float*>(c.out.data) + r * c.out_row_stride;
      for (int64_t j = 0; j < N; ++j) out[j] = ref::gelu_tanh(x[j], true);
    } else {
      const uint16_t* x = static_cast<const uint16_t*>(c.x.data) + r * c.x_row_stride;
      uint16_t* out = static_cast<uint16_t*>(c.out.data) + r * c.out_row_stride;
      for (int64_t j = 0; j < N; ++j)
        out[j] = ref::float_to_act_bits(ref::gelu_tanh(ref::act_bits_to_float(x[j], c.x.dtype), true), c.x.dtype);
    }
  }
}

DITOPS_OP_ENTRIES(gelu_tanh, Kernels, register_gelu_tanh);

}  // namespace ditops
