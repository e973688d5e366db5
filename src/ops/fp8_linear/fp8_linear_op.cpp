// fp8_linear: argument matching, the kernel key (GEMV for M = 1, swap-AB mma.sync for M = 2..16),
// its request and launch, the whitelist gate, the cuBLASLt (vendor) implementation, the CPU
// reference's registration and the op's description. docs/fp8_linear.md.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "core/builtin_ops.h"
#include "core/implementation.h"
#include "core/matcher.h"
#include "core/op_builder.h"
#include "ditops/fp8_linear.h"
#include "ditops/fp8_static_quant.h"
#include "jit/cuda_driver.h"
#include "jit/jit.h"
#include "jit/kernel_family.h"
#include "kernels/fp8_linear.cuh"
#include "ops/common/fp8.h"
#include "vendor/cublaslt.h"

namespace ditops {

namespace {

constexpr const char* kOp = "fp8_linear";
constexpr int64_t kMaxKernelTokens = 16;

std::string shape_text(const Fp8LinearCall& c) {
  return "(K, N, M) = (" + std::to_string(c.k) + ", " + std::to_string(c.n) + ", " + std::to_string(c.m) + ")";
}

void complete(Fp8LinearCall& call, Matcher& m);  // the op's own rules, after the slots'

// SGLang's facade takes the transposed [K, N] view with strides (1, K); say what to pass instead
// (before w's slot says it is not contiguous).
void refuse_transposed_weight(const Fp8LinearCall& call) {
  const TensorView& w = call.w;
  if (w.rank == 2 && w.shape[0] > 1 && w.shape[1] > 1 && w.strides[0] == 1 && w.strides[1] == w.shape[0])
    throw InvalidArgument(std::string(kOp) + ": w must be the [N, K] row-major weight as checkpoints store it, "
                          "but is a transposed view (" + w.describe() + "): pass the tensor it transposes");
}

// The op described once: its slots state the checks every call gets (core/op_builder.h).
OpBuilder<Fp8LinearCall> describe() {
  using C = Fp8LinearCall;
  OpBuilder<C> b(kOp, "bf16(x_q @ w.T * (x_scale * w_scale) (+ bias)): FP8 linear for M <= 16 tokens",
                 "x [M, K] e4m3|bf16|f16 (16-bit: quantized with x_scale as fp8_static_quant); w [N, K] "
                 "e4m3 row-major; x_scale, w_scale one fp32 each (read on the device); bias [N] bf16 "
                 "or none; out [M, N] bf16; K % 16 == 0. Contract close (quality high): "
                 "include/ditops/fp8_linear.h, docs/fp8_linear.md");
  b.dims("M=2,N=8192,K=5120");
  b.gemm();  // benchmarks report the read roof: the weight is read once, nothing is written back
  b.tensor<&C::x>({.dtypes = "bf16|f16|f8e4m3fn", .shape = "M,K", .layout = "contiguous"});
  b.tensor<&C::x_scale>({.dtypes = "f32", .shape = "1"});
  b.tensor<&C::w>({.dtypes = "f8e4m3fn", .shape = "N,K", .layout = "contiguous"});
  b.tensor<&C::w_scale>({.dtypes = "f32", .shape = "1"});
  b.tensor<&C::bias>({.optional = true, .dtypes = "bf16", .shape = "N", .layout = "contiguous"});
  b.tensor<&C::out>({.role = TensorRole::out, .keyword = true, .dtypes = "bf16", .shape = "M,N",
                     .alloc = "dim(x,0),dim(w,0)", .alloc_dtype = "bf16", .layout = "contiguous"});
  describe_fp8_reciprocal<&Fp8LinearOptions::fp8_reciprocal>(b, "x_scale (a 16-bit x)");
  b.pdl_option<&Fp8LinearOptions::use_pdl>();
  b.before_slots(refuse_transposed_weight);
  b.complete(complete);
  return b;
}

void complete(Fp8LinearCall& call, Matcher& m) {
  const int64_t K = *m.value("K");
  if (K % 16 != 0) m.fail("K (x.shape[1], w.shape[1]) must be a multiple of 16 but is " + std::to_string(K));
  const bool has_bias = !slot_absent(call.bias);
  if (!has_bias) call.bias = TensorView{};
  call.m = *m.value("M");
  call.n = *m.value("N");
  call.k = K;
  call.has_bias = has_bias;
  call.aligned16 = is_aligned(call.x.data, 16) && is_aligned(call.w.data, 16);
}

enum class Fp8Kernel : uint8_t { none, gemv, mma };

// The template key: exactly the kernels' template parameters, plus which kernel.
struct Fp8LinearKey {
  Fp8Kernel kernel = Fp8Kernel::none;  // none: M outside 1..16
  DType x_dtype = DType::bf16;
  bool div_full = false;  // a 16-bit x's reciprocal (false for e4m3 x)
  int tile = 1;           // gemv: rows per warp; mma: 8-token atoms
  bool bias = false;
  bool pdl = true;

  // "gemv,bf16,ieee,r2,bias,pdl" / "mma,f8e4m3fn,a2,nobias,nopdl"
  std::string to_string() const {
    if (kernel == Fp8Kernel::none) return "none";
    const bool quantize = x_dtype != DType::f8e4m3fn;
    return std::string(kernel == Fp8Kernel::gemv ? "gemv," : "mma,") + dtype_name(x_dtype) +
           (quantize ? (div_full ? ",div_full" : ",ieee") : "") +
           (kernel == Fp8Kernel::gemv ? ",r" : ",a") + std::to_string(tile) + (bias ? ",bias" : ",nobias") +
           (pdl ? ",pdl" : ",nopdl");
  }
  uint64_t packed() const { return pack_key({{kernel, 3}, x_dtype, div_full, {tile, 4}, bias, pdl}); }
};

// R = 2 rows per warp from N = 8192 on (SGLang's GEMV rule; not measured here).
int gemv_rows_per_warp(int64_t n) { return n >= 8192 ? 2 : 1; }

Fp8LinearKey key_for(const Fp8LinearCall& c, const DeviceInfo& device) {
  Fp8LinearKey key;
  key.kernel = c.m == 1 ? Fp8Kernel::gemv : (c.m >= 2 && c.m <= kMaxKernelTokens) ? Fp8Kernel::mma : Fp8Kernel::none;
  key.x_dtype = c.x.dtype;
  key.div_full = c.x.dtype != DType::f8e4m3fn && c.options.fp8_reciprocal == Fp8Reciprocal::div_full;
  key.tile = key.kernel == Fp8Kernel::gemv ? gemv_rows_per_warp(c.n) : c.m <= 8 ? 1 : 2;
  key.bias = c.has_bias;
  key.pdl = c.options.use_pdl && (device.features & kFeaturePdl);
  return key;
}

KernelRequest request_for(const Fp8LinearKey& key) {
  const bool gemv = key.kernel == Fp8Kernel::gemv;
  return {.header = "fp8_linear.cuh",
          .function = gemv ? "ditops::fp8_linear_gemv_body" : "ditops::fp8_linear_mma_body",
          .template_args = jit::kernel_args(key.x_dtype, key.div_full, key.tile, key.bias, key.pdl),
          .params_type = "ditops::Fp8LinearParams",
          .max_threads = gemv ? kFp8GemvWarps * 32 : kFp8MmaWarps * 32,
          .template_key = std::string(kOp) + ":" + key.to_string()};
}

void fp8_linear_launch(const Fp8LinearCall& c, const Fp8LinearKey& key, const jit::LoadedKernel& kernel) {
  Fp8LinearParams p{};
  p.x = c.x.data;
  p.x_scale = static_cast<const float*>(c.x_scale.data);
  p.w = static_cast<const unsigned char*>(c.w.data);
  p.w_scale = static_cast<const float*>(c.w_scale.data);
  p.bias = c.has_bias ? static_cast<const unsigned short*>(c.bias.data) : nullptr;
  p.out = static_cast<unsigned short*>(c.out.data);
  p.m = static_cast<int>(c.m);
  p.n = static_cast<int>(c.n);
  p.k = static_cast<int>(c.k);
  const bool gemv = key.kernel == Fp8Kernel::gemv;
  const int64_t rows_per_block = gemv ? fp8_gemv_rows_per_block(key.tile) : kFp8MmaRows;
  const int64_t grid = (c.n + rows_per_block - 1) / rows_per_block;
  jit::launch(kernel, static_cast<unsigned>(grid), static_cast<unsigned>(kernel.max_threads), &p, sizeof p,
              static_cast<CUstream>(c.stream), key.pdl);
}

// Every code path of both kernels: each x dtype, reciprocal, tile, bias and PDL value appears at
// least once per kernel (4 keys each, not the full product: the compile test builds every key
// for three archs).
std::vector<Fp8LinearKey> fp8_linear_variant_keys() {
  struct Variant {
    DType dtype;
    bool div_full;
    int tile;
    bool bias, pdl;
  };
  std::vector<Fp8LinearKey> keys;
  for (Fp8Kernel kernel : {Fp8Kernel::gemv, Fp8Kernel::mma})
    for (const Variant& v : {Variant{DType::bf16, false, 1, true, true}, Variant{DType::f8e4m3fn, false, 2, false, false},
                             Variant{DType::f16, true, 2, true, true}, Variant{DType::bf16, true, 1, false, true}}) {
      Fp8LinearKey k;
      k.kernel = kernel;
      k.x_dtype = v.dtype;
      k.div_full = v.div_full;
      k.tile = v.tile;
      k.bias = v.bias;
      k.pdl = v.pdl;
      keys.push_back(k);
    }
  return keys;
}

// What no specialized kernel computes, whatever the whitelist says.
std::string kernel_refusal(const Fp8LinearCall& c) {
  if (c.m < 1 || c.m > kMaxKernelTokens)
    return "M = " + std::to_string(c.m) + " is outside the specialized kernels' 1..16 tokens (the vendor "
           "implementation takes it)";
  if (!c.aligned16) return "x or w is not 16-byte aligned (the kernels load 16-byte words)";
  if (c.n > INT32_MAX || c.k > INT32_MAX) return "N or K beyond 2^31 - 1 (the kernels index rows with int)";
  return "";
}

// Whitelist status: 0 not listed, 1 listed but not measured, 2 listed and measured.
int whitelist_status(const Fp8LinearCall& c) {
  const Fp8LinearShape* s = fp8_linear_whitelisted(c.k, c.n, c.m);
  return !s ? 0 : s->measured ? 2 : 1;
}

// Why automatic dispatch does not choose a specialized kernel for this shape ("" when it may).
// An explicit backend=jit skips this gate: it runs the kernel wherever the kernel computes the
// call (tests, benchmarks).
std::string whitelist_refusal(const Fp8LinearCall& c) {
  if (c.options.dispatch.backend) return "";
  const Fp8LinearShape* s = fp8_linear_whitelisted(c.k, c.n, c.m);
  if (!s)
    return shape_text(c) + " is not in the whitelist (docs/fp8_linear.md): dispatch leaves it to the vendor "
           "implementation; backend=jit runs this kernel";
  if (!s->measured)
    return shape_text(c) + " is whitelisted (" + s->source + ") but not measured against cuBLASLt: dispatch "
           "leaves it to the vendor implementation until bench/fp8_linear_torch.py records it faster; backend=jit "
           "runs this kernel";
  return "";
}

bool quantizes_x(const Fp8LinearCall& c) { return c.x.dtype != DType::f8e4m3fn; }
bool fits_scratch(const Fp8LinearCall& c) { return !quantizes_x(c) || c.m * c.k <= int64_t(vendor::kScratchBytes); }
// cuBLASLt's operands 16-byte aligned (a 16-bit x reaches it through the aligned scratch).
bool vendor_aligned(const Fp8LinearCall& c) {
  return (quantizes_x(c) || is_aligned(c.x.data, 16)) && is_aligned(c.w.data, 16) && is_aligned(c.out.data, 16) &&
         (!c.has_bias || is_aligned(c.bias.data, 16));
}

// Predicate inputs the key does not carry: the whitelist status, the alignment, the vendor's
// N % 16, scratch fit and alignment (the dispatch options, which lift the whitelist gate, are part
// of the decision cache's key already).
uint64_t extra_signature(const Fp8LinearCall& c) {
  uint64_t v = static_cast<uint64_t>(whitelist_status(c));
  v = v * 2 + c.aligned16;
  v = v * 2 + (c.n % 16 == 0);
  v = v * 2 + fits_scratch(c);
  v = v * 2 + (c.n > INT32_MAX || c.k > INT32_MAX);
  v = v * 2 + vendor_aligned(c);
  return v;
}

constexpr KernelFunctions<Fp8LinearCall, Fp8LinearKey> kKernels{
    .key = key_for, .request = request_for, .launch = fp8_linear_launch,
    .nothing_to_do = [](const Fp8LinearCall& c) { return c.m == 0 || c.n == 0; },
    .refusal = kernel_refusal,
    .variant_keys = fp8_linear_variant_keys,
    .extra_signature = extra_signature,
    .extra_radix = 3 * 2 * 2 * 2 * 2 * 2};
using Kernels = OpKernels<describe, kKernels>;

// ---------------------------------------------------------------- vendor (cuBLASLt)

std::string vendor_availability() {
  std::string why;
  if (!jit::cuda_driver(&why)) return why;
  if (!vendor::cublaslt(&why)) return why;
  return "";
}

std::string vendor_predicate(const Fp8LinearCall& c) {
  if (c.x.device.kind != DeviceKind::cuda) return "the tensors are on the cpu";
  // torch._scaled_mm refuses the same: cuBLASLt's FP8 layouts want 16-element leading dimensions.
  if (c.n % 16 != 0) return "N = " + std::to_string(c.n) + " is not a multiple of 16 (cuBLASLt FP8, as torch._scaled_mm)";
  if (!vendor_aligned(c)) return "cuBLASLt's FP8 operands must be 16-byte aligned (x when e4m3, w, out, bias)";
  if (quantizes_x(c)) {
    if (!fits_scratch(c))
      return "a " + std::string(dtype_name(c.x.dtype)) + " x of M * K = " + std::to_string(c.m * c.k) +
             " values exceeds the cached quantization scratch of " + std::to_string(vendor::kScratchBytes >> 20) +
             " MiB: pass x quantized (fp8_static_quant) instead";
    if (std::string why = jit::nvrtc_availability(); !why.empty())
      return "a 16-bit x is quantized by fp8_static_quant's jit kernel first: " + why;
  }
  return "";
}

void vendor_run(const Fp8LinearCall& c) {
  if (c.m == 0 || c.n == 0) return;  // the extents of an empty call may overflow a product
  const int device = c.x.device.index;
  const CUstream stream = static_cast<CUstream>(c.stream);
  const void* xq = c.x.data;
  if (quantizes_x(c)) {
    // The same kernel fp8_static_quant runs, into this stream's scratch (allocated once).
    void* scratch = vendor::stream_scratch(device, stream);
    Fp8StaticQuantOptions q;
    q.fp8_reciprocal = c.options.fp8_reciprocal;
    q.use_pdl = c.options.use_pdl;
    q.dispatch.backend = Provenance::jit;
    fp8_static_quant(c.x, c.x_scale, TensorView::contiguous(scratch, DType::f8e4m3fn, c.x.device, {c.m, c.k}), q,
                     c.stream);
    xq = scratch;
  }
  vendor::Fp8MatmulArgs a;
  a.device = device;
  a.stream = stream;
  a.x = xq;
  a.w = c.w.data;
  a.x_scale = static_cast<const float*>(c.x_scale.data);
  a.w_scale = static_cast<const float*>(c.w_scale.data);
  a.bias = c.has_bias ? c.bias.data : nullptr;
  a.out = c.out.data;
  a.tokens = c.m;
  a.n = c.n;
  a.k = c.k;
  vendor::fp8_matmul(a);
}

void register_fp8_linear(Registry& registry) {
  const std::string fp64 =
      "the fp64 product of the dequantized e4m3 operands, sum_k xq[m,k] w[n,k] * x_scale * w_scale (+ bias[n])";
  // What any fp32 accumulation of the exact e4m3 products stays within, whatever its order.
  const std::string k_bound = "every output within 1 bf16 ulp plus K * 2^-24 * sum_k |xq w| * x_scale * w_scale of it";

  struct Kernel {
    const char* variant;
    Fp8Kernel kernel;
    const char* description;
  };
  for (const Kernel& k :
       {Kernel{"gemv", Fp8Kernel::gemv,
               "M = 1 streaming GEMV on CUDA cores: 8 warps x 1-2 rows, 4 x 16-byte weight loads per row per lane in "
               "flight (L2 evict-first), x staged in shared memory; NVRTC at first use"},
        Kernel{"skinny_mma", Fp8Kernel::mma,
               "M = 2..16 swap-AB mma.sync m16n8k32 e4m3 (weights as the MMA's M side, tokens as n8 atoms), "
               "16 rows x 4 warps splitting K, register-direct 16-byte loads; NVRTC at first use"}}) {
    Implementation<Fp8LinearCall, Kernels::Key> impl = jit_implementation<Kernels>(
        {.variant = k.variant,
         .sm_min = 89,  // mma.sync e4m3 and cvt e4m3x2
         .contract = Contract::close(fp64, k_bound + ", >= 99.9 % within 1 ulp; bitwise identical from run to run "
                                                     "(fixed order, no atomics)")
                         .verified("H200 (sm_90), the device report of main at 563ceb6"
                                   ": Fp8LinearGpu and bench/fp8_linear_torch.py at every whitelisted shape, 100 % "
                                   "within 1 ulp; sm_120a compiled, not run"),
         .description = k.description});
    impl.predicate = [kernel = k.kernel, cuda = impl.predicate](const Fp8LinearCall& c, const Fp8LinearKey& key) -> std::string {
      if (std::string why = cuda(c, key); !why.empty()) return why;
      if (kernel == Fp8Kernel::gemv && c.m != 1) return "handles M = 1 only (fp8_linear.skinny_mma takes 2..16)";
      if (kernel == Fp8Kernel::mma && c.m == 1) return "handles M = 2..16 (fp8_linear.gemv takes M = 1)";
      return whitelist_refusal(c);
    };
    add_implementation(registry, kOp, std::move(impl));
  }

  Implementation<Fp8LinearCall, Fp8LinearKey> cublaslt;
  cublaslt.name = "fp8_linear.cublaslt";
  cublaslt.provenance = Provenance::vendor;
  cublaslt.capabilities = {{DeviceKind::cuda, 89, 1 << 20, 0}};  // FP8 cuBLASLt: sm_89+
  // cuBLASLt's summation order and accumulator are its own (k_bound does not hold for it: 98.4-99.4 %
  // of outputs within 1 ulp on the H200), but it is the very call torch._scaled_mm makes: byte-equal
  // to PyTorch's FP8 linear, the eager chain an FP8 model runs.
  cublaslt.contract =
      Contract::bit_exact(
          "torch._scaled_mm(xq, w.t(), scale_a=x_scale, scale_b=w_scale, bias=bias, out_dtype=torch.bfloat16) on "
          "the same device with the same cuBLASLt library (xq = x, or fp8_static_quant(x, x_scale) with the call's "
          "fp8_reciprocal for a 16-bit x); also within 1 bf16 ulp plus (K * 2^-24 + 2^-12) * sum_k |xq w| * "
          "x_scale * w_scale of the " + fp64 + " (sm_90's FP8 MMA adds an MMA's products with a narrower "
          "accumulator than fp32: on the H200 the K * 2^-24 bound alone fails 1-3 outputs in 1000)")
          .verified("H200 (sm_90) at bf0f87e: torch.equal to torch._scaled_mm in 1065 of 1065 calls, every "
                    "whitelisted (K, N) at M 1..16, 24, 33, 64, with and without bias, bf16 and e4m3 x "
                    "(bench/results/h200/checks/fp8_linear_checks.json); at ee9c29e every driver case through "
                    "tests/python/test_ops_eager.py; at bf0f87e the driver's device parts within the sm_90 "
                    "accumulator bound above");
  cublaslt.description =
      "cuBLASLt (dlopen) FP8 matmul as torch._scaled_mm calls it: TN layout, per-tensor device scale pointers, "
      "bias epilogue; a 16-bit x is quantized first by fp8_static_quant's kernel";
  cublaslt.availability = vendor_availability;
  cublaslt.predicate = [](const Fp8LinearCall& c, const Fp8LinearKey&) { return vendor_predicate(c); };
  cublaslt.run = [](const Fp8LinearCall& c, const Fp8LinearKey&) { vendor_run(c); };
  add_implementation(registry, kOp, std::move(cublaslt));

  add_reference<Kernels>(
      registry, fp8_linear_reference,
      Contract::close(fp64, k_bound + ", >= 99.9 % within 1 ulp; checked on the CPU by tests/test_fp8_linear.cpp")
          .verified("on every CI run (CPU) against an independent fp64 computation "
                    "(tests/test_fp8_linear.cpp); the op test driver compared every CUDA implementation "
                    "with it on the H200 (H200 (sm_90), the device report of main at 563ceb6)"),
      "CPU reference: fp32 accumulation in increasing k, then the fp32 epilogue");
}

}  // namespace

DITOPS_OP_ENTRIES(fp8_linear, Kernels, register_fp8_linear);

}  // namespace ditops
