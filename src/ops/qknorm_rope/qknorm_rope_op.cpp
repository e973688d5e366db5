// qknorm_rope: argument matching, the registry entries (provenance, capability, contract,
// predicate) and the launch of the fused kernel.
#include <mutex>
#include <unordered_map>

#include "core/enum_name.h"
#include "core/builtin_ops.h"
#include "core/implementation.h"
#include "core/matcher.h"
#include "core/op_builder.h"
#include "ditops/qknorm_rope.h"
#include "jit/cuda_driver.h"
#include "jit/index_check.h"
#include "jit/jit.h"
#include "jit/kernel_family.h"
#include "kernels/qknorm_rope.cuh"
#include "ops/qknorm_rope/qknorm_rope_kernels.h"

namespace ditops {

// ---------------------------------------------------------------- the kernel key and its request

const char* qk_rounding_name(QkRounding rounding) { return enumerator_name(rounding); }
const char* qk_norm_order_name(QkNormOrder order) { return enumerator_name(order); }
const char* qk_norm_weight_rounding_name(QkNormWeightRounding rounding) { return enumerator_name(rounding); }

namespace {
// The kernel's sum-of-squares constant (kernels/qknorm_rope.cuh) of an order.
constexpr auto kSumOrderConstants = enum_texts<QkNormOrder>({{QkNormOrder::aten, "ditops::kQkSumAten"},
                                                             {QkNormOrder::warp, "ditops::kQkSumWarp"},
                                                             {QkNormOrder::aten_mean, "ditops::kQkSumAtenMean"}});
}  // namespace

std::string QkKernelKey::to_string() const {
  return std::string(dtype_name(act)) + ",cache=" + dtype_name(cache) + ",pos=" + dtype_name(pos) +
         ",D=" + std::to_string(head_dim) + ",R=" + std::to_string(rope_dim) +
         (neox ? ",neox" : ",interleaved") + (full_width ? ",fullwidth" : ",compact") + "," +
         qk_rounding_name(rounding) + "," + qk_norm_order_name(order) +
         (weight_rounding == QkNormWeightRounding::twice ? ",twice" : "") + (complex_product ? ",complex" : "") +
         (pdl ? ",pdl" : ",nopdl") +
         (aligned ? ",vec16" : ",scalar");
}

uint64_t QkKernelKey::packed() const {
  return pack_key({act, cache, pos, {head_dim, 512}, {rope_dim, 512}, neox, full_width, rounding == QkRounding::rounded,
                   {order, 4}, weight_rounding == QkNormWeightRounding::twice, complex_product, pdl, aligned});
}

KernelRequest qk_kernel_request(const QkKernelKey& key) {
  // Four resident blocks (64 registers), faster than ptxas' own choice (80 registers, 3 blocks)
  // despite 8 bytes of spill (docs/tuning/qknorm_rope.md).
  return {.header = "qknorm_rope.cuh",
          .function = "ditops::qknorm_rope_body",
          .template_args = jit::kernel_args(key.act, key.cache, key.pos, key.head_dim, key.rope_dim, key.neox,
                                            key.full_width, key.rounding == QkRounding::rounded,
                                            kSumOrderConstants(key.order),
                                            key.weight_rounding == QkNormWeightRounding::twice, key.pdl, key.aligned,
                                            key.complex_product),
          .params_type = "ditops::QkNormRopeParams",
          .max_threads = 256,
          .min_blocks = 4,
          .template_key = "qknorm_rope:" + key.to_string()};
}

QkKernelKey qk_kernel_key(const QkNormRopeOptions& options, DType act, DType cache, DType pos, int head_dim,
                          int rope_dim, bool aligned16, const DeviceInfo& device) {
  QkKernelKey key;
  key.act = act;
  key.cache = cache;
  key.pos = pos;
  key.head_dim = head_dim;
  key.rope_dim = rope_dim;
  key.neox = options.is_neox;
  key.full_width = options.cache_full_width;
  key.rounding = options.rounding;
  key.order = options.norm_order;
  key.weight_rounding = options.norm_weight_rounding;
  key.complex_product = options.rope_product == QkRopeProduct::complex;
  key.pdl = options.use_pdl && (device.features & kFeaturePdl);
  key.aligned = aligned16;
  return key;
}

std::vector<QkKernelKey> qk_prebuilt_keys() {
  std::vector<QkKernelKey> keys;
  // FLUX.1 / Z-Image (interleaved) and Qwen-Image / HunyuanVideo / Wan (NeoX), head_dim 128,
  // bf16 activations, fp32 [cos|sin] cache, int64 and int32 positions, both rounding modes.
  for (DType pos : {DType::i64, DType::i32})
    for (bool neox : {false, true})
      for (QkRounding rounding : {QkRounding::rounded, QkRounding::fp32}) {
        QkKernelKey k;
        k.pos = pos;
        k.neox = neox;
        k.rounding = rounding;
        keys.push_back(k);
      }
  QkKernelKey partial;  // partial rotary 128/64
  partial.neox = true;
  partial.rope_dim = 64;
  keys.push_back(partial);
  partial.neox = false;
  keys.push_back(partial);
  return keys;
}

namespace {

constexpr const char* kOp = "qknorm_rope";
constexpr int kThreads = 256;  // 8 warps per block; the grid is occupancy-sized and persistent

// Whether q[t, h, d] and k[t', h', d'] can be the same element. Both are written, so sharing one
// would make the result depend on which store lands last. Views of one packed QKV projection
// interleave in memory (same token stride, k's heads after q's) without sharing an element, so a
// byte-range test is not enough. Same token stride S: element offsets differ by
// delta + j*S + (h - h')*hs + (d - d') with j = t' - t; rows of each tensor are disjoint
// (checked before), so S >= either row's span and only the j with delta + j*S inside
// (-k_span, q_span) matter (at most three). Other layouts: the byte ranges must not meet.
bool q_k_share_elements(const TensorView& q, const TensorView& k, int64_t T, int64_t Hq, int64_t Hk, int64_t D,
                        int64_t hs) {
  const int64_t es = static_cast<int64_t>(dtype_size(q.dtype));
  // Addresses in 128 bits: a hostile data pointer may sit anywhere in the 64-bit space. The
  // spans are bounded by the matcher (kMaxViewBytes), so once the ranges meet the gap fits int64.
  const __int128 qb = reinterpret_cast<uintptr_t>(q.data), kb = reinterpret_cast<uintptr_t>(k.data);
  const int64_t q_span = (Hq - 1) * hs + D, k_span = (Hk - 1) * hs + D;  // elements of one row
  const __int128 q_end = qb + static_cast<__int128>((T - 1) * q.strides[0] + q_span) * es;
  const __int128 k_end = kb + static_cast<__int128>((T - 1) * k.strides[0] + k_span) * es;
  if (q_end <= kb || k_end <= qb) return false;  // the byte ranges do not meet
  const int64_t S = q.strides[0];
  const int64_t gap = static_cast<int64_t>(kb - qb);
  if (gap % es != 0 || (T > 1 && k.strides[0] != S)) return true;  // conservative
  const int64_t delta = gap / es;
  auto rows_share = [&](int64_t offset) {  // k row starts `offset` elements after the q row
    if (offset <= -k_span || offset >= q_span) return false;
    // Some m = h - h' in [-(Hk-1), Hq-1] with |offset - m*hs| < D.
    const int64_t heads_max = Hq - 1, heads_min = -(Hk - 1);
    int64_t m0 = hs > 0 ? offset / hs : 0;
    for (int64_t m = m0 - 1; m <= m0 + 1; ++m) {
      if (m < heads_min || m > heads_max) continue;
      const int64_t gap = offset - m * hs;
      if (gap > -D && gap < D) return true;
    }
    return false;
  };
  if (T == 1 || S == 0) return rows_share(delta);
  // j*S in (-k_span - delta, q_span - delta), |j| < T.
  int64_t j_lo = (-k_span - delta) / S - 1, j_hi = (q_span - delta) / S + 1;
  j_lo = std::max(j_lo, -(T - 1));
  j_hi = std::min(j_hi, T - 1);
  for (int64_t j = j_lo; j <= j_hi; ++j)
    if (rows_share(delta + j * S)) return true;
  return false;
}

void complete(QkNormRopeCall& call, Matcher& m);  // the op's own rules, after the slots'

// The op described once: its slots state the checks every call gets (core/op_builder.h).
OpBuilder<QkNormRopeCall> describe() {
  using C = QkNormRopeCall;
  OpBuilder<C> b(kOp, "in-place per-head QK RMSNorm + RoPE",
                 "q [T, Hq, D], k [T, Hk, D] written in place (token strides free, one head stride); "
                 "D in {64, 128, 256}; cache [P, rope_dim] (compact) or [P, 2*rope_dim] (full width). "
                 "include/ditops/qknorm_rope.h, docs/qknorm_rope.md");
  b.dims("T=4608,Hq=24,Hk=24,D=128,P=T,R=D");
  b.tensor<&C::q>({.role = TensorRole::inout, .dtypes = "bf16|f16", .shape = "T,Hq,D",
                   .layout = "q_token_stride,head_stride,1"});
  b.dim_rule("D", [](int64_t D, const C&) {
    return D == 64 || D == 128 || D == 256 ? std::string()
                                           : "q.shape[2] (head_dim) must be 64, 128 or 256 but is " + std::to_string(D);
  });
  b.tensor<&C::k>({.role = TensorRole::inout, .dtypes = "=q", .shape = "T,Hk,D",
                   .layout = "k_token_stride,head_stride,1"});
  b.tensor<&C::q_weight>({.dtypes = "=q", .shape = "D", .layout = "1"});
  b.tensor<&C::k_weight>({.dtypes = "=q", .shape = "D", .layout = "1"});
  // The cache's width is rope_dim or 2 * rope_dim (the op's own rule); its rank comes from the layout.
  b.tensor<&C::cos_sin_cache>({.dtypes = "f32|=q", .shape = "P,R", .layout = "*,1", .own = "shape"});
  b.tensor<&C::positions>({.dtypes = "i32|i64", .shape = "T"});
  b.option<&QkNormRopeOptions::is_neox>("NeoX halves (true) or interleaved pairs (false, FLUX)");
  b.option<&QkNormRopeOptions::eps>("RMSNorm epsilon");
  b.option<&QkNormRopeOptions::rope_dim>("rotated channels; 0: from the cache width");
  b.option<&QkNormRopeOptions::cache_full_width>("cache rows hold rope_dim cos then rope_dim sin");
  b.choice<&QkNormRopeOptions::rounding>({QkRounding::rounded, QkRounding::fp32},
                                         "rounded: bit_exact vs the eager chain; fp32: close");
  b.choice<&QkNormRopeOptions::norm_order>(
      {QkNormOrder::aten, QkNormOrder::warp, QkNormOrder::aten_mean},
      "sum-of-squares order: aten (F.rms_norm), warp (SGLang) or aten_mean (x.float().pow(2).mean(-1), "
      "diffusers' RMSNorm; head_dim 64, 128)");
  b.choice<&QkNormRopeOptions::norm_weight_rounding>(
      {QkNormWeightRounding::once, QkNormWeightRounding::twice},
      "once: rne16(w * (factor * x)) (F.rms_norm); twice: rne16(rne16(x * factor) * w) (diffusers' RMSNorm "
      "with a 16-bit weight; needs rounding=rounded)");
  b.choice<&QkNormRopeOptions::rope_product>(
      {QkRopeProduct::real, QkRopeProduct::complex},
      "real: x*cos + rotate(x)*sin as separate rounded ops (FLUX); complex: Qwen-Image's complex64 "
      "product, one FMA per component (interleaved, fp32 cache, rounding=rounded)");
  b.pdl_option<&QkNormRopeOptions::use_pdl>();
  b.complete(complete);
  // The CPU path checks positions on the host (the reference); CUDA positions only in checked mode.
  b.check_before_run([](const C& call) {
    if (call.q.device.kind == DeviceKind::cuda && call.num_tokens > 0 && jit::checked_mode()) {
      jit::bind_and_check_stream(kOp, "q", call.q.device, call.stream);
      jit::check_indices_on_device(kOp, "positions", call.positions, call.cos_sin_cache.shape[0],
                                   "the rows of cos_sin_cache", call.stream);
    }
  });
  return b;
}

}  // namespace

int qk_option_rules(const Matcher& m, const QkNormRopeOptions& options, int64_t D, const TensorView& cos_sin_cache) {
  const int64_t width = cos_sin_cache.shape[1];
  const int64_t rope_dim = options.rope_dim ? options.rope_dim
                                            : (options.cache_full_width ? width / 2 : width);
  if (rope_dim <= 0 || rope_dim > D)
    m.fail("rope_dim must be in (0, head_dim=" + std::to_string(D) + "] but is " + std::to_string(rope_dim));
  if (rope_dim % 8 != 0)
    m.fail("rope_dim must be a multiple of 8 (each lane rotates 8 whole channels) but is " +
           std::to_string(rope_dim));
  if (options.is_neox && rope_dim % 16 != 0)
    m.fail("NeoX needs rope_dim % 16 == 0 (each rotary half starts on an 8-channel lane) but rope_dim is " +
           std::to_string(rope_dim));
  const int64_t expected_width = options.cache_full_width ? 2 * rope_dim : rope_dim;
  if (width != expected_width)
    m.fail("cos_sin_cache.shape[1] must be " + std::to_string(expected_width) + " (" +
           (options.cache_full_width ? "full width: rope_dim cos then rope_dim sin" : "compact: rope_dim/2 cos then rope_dim/2 sin") +
           ", rope_dim=" + std::to_string(rope_dim) + ") but is " + std::to_string(width));
  if (!(options.eps >= 0.0f)) m.fail("eps must be >= 0 but is " + std::to_string(options.eps));
  if (options.norm_order == QkNormOrder::aten_mean && D != 64 && D != 128)
    m.fail("norm_order=aten_mean needs head_dim 64 or 128 (the order of x.float().pow(2).mean(-1) is "
           "derived for those) but head_dim is " + std::to_string(D));
  if (options.rope_product == QkRopeProduct::complex) {
    if (options.is_neox) m.fail("rope_product=complex rotates interleaved pairs (is_neox=false) but is_neox is true");
    if (options.rounding != QkRounding::rounded)
      m.fail("rope_product=complex needs rounding=rounded (rounding=fp32 has its own RoPE arithmetic)");
    if (options.cache_full_width)
      m.fail("rope_product=complex multiplies each pair by one complex frequency: a compact cos_sin_cache "
             "(cache_full_width=false) but cache_full_width is true");
    if (cos_sin_cache.dtype != DType::f32)
      m.fail(std::string("rope_product=complex needs a f32 cos_sin_cache (complex64 frequencies) but it is ") +
             dtype_name(cos_sin_cache.dtype));
  }
  if (options.norm_weight_rounding == QkNormWeightRounding::twice && options.rounding != QkRounding::rounded)
    m.fail("norm_weight_rounding=twice needs rounding=rounded (rounding=fp32 rounds nothing before the store)");
  return static_cast<int>(rope_dim);
}

namespace {

void complete(QkNormRopeCall& call, Matcher& m) {
  const int64_t D = *m.value("D");
  const int64_t rope_dim = qk_option_rules(m, call.options, D, call.cos_sin_cache);

  const int64_t T = *m.value("T"), Hq = *m.value("Hq"), Hk = *m.value("Hk");
  // In place: rows of one tensor must not overlap each other, or the result would depend on
  // the order the GPU happens to run them in.
  // Bound by whichever tensor has more than one head (a stride of an extent-1 dim is free).
  const int64_t head_stride = m.value("head_stride").value_or(call.q.strides[1]);
  auto check_disjoint_rows = [&](const TensorView& t, const char* name, int64_t heads) {
    if (T == 0 || heads == 0) return;
    if (heads > 1 && head_stride < D)
      m.fail(std::string(name) + ".stride(1) must be >= head_dim=" + std::to_string(D) +
             " (heads may not overlap) but is " + std::to_string(head_stride));
    if (T > 1 && t.strides[0] < (heads - 1) * head_stride + D)
      m.fail(std::string(name) + ".stride(0) must be >= " + std::to_string((heads - 1) * head_stride + D) +
             " (tokens may not overlap) but is " + std::to_string(t.strides[0]));
  };
  check_disjoint_rows(call.q, "q", Hq);
  check_disjoint_rows(call.k, "k", Hk);
  if (call.q.data == call.k.data && T > 0 && Hq > 0 && Hk > 0) m.fail("q and k must not alias (both are written)");
  else if (T > 0 && Hq > 0 && Hk > 0 && q_k_share_elements(call.q, call.k, T, Hq, Hk, D, head_stride))
    m.fail("q and k overlap in memory (both are written): they must be disjoint views, e.g. the q "
           "and k heads of one packed QKV projection");
  if (T > INT64_MAX / 4 || Hq + Hk > (1 << 30)) m.fail("too many tokens or heads");
  if (T > 0 && call.cos_sin_cache.shape[0] < 1)
    m.fail("cos_sin_cache.shape[0] must be >= 1 (positions index its rows) but is 0 with T=" + std::to_string(T));
  call.options.rope_dim = static_cast<int>(rope_dim);
  call.num_tokens = T;
  call.num_q_heads = static_cast<int>(Hq);
  call.num_k_heads = static_cast<int>(Hk);
  call.head_dim = static_cast<int>(D);
  call.rope_dim = static_cast<int>(rope_dim);
  call.head_stride = head_stride;
  const int64_t esize = static_cast<int64_t>(dtype_size(call.q.dtype));
  const int64_t csize = static_cast<int64_t>(dtype_size(call.cos_sin_cache.dtype));
  call.aligned16 = is_aligned(call.q.data, 16) && is_aligned(call.k.data, 16) &&
                   (call.q.strides[0] * esize) % 16 == 0 && (call.k.strides[0] * esize) % 16 == 0 &&
                   (head_stride * esize) % 16 == 0 && is_aligned(call.q_weight.data, 16) &&
                   is_aligned(call.k_weight.data, 16) && is_aligned(call.cos_sin_cache.data, 16) &&
                   (call.cos_sin_cache.strides[0] * csize) % 16 == 0 &&
                   is_aligned(call.positions.data, dtype_size(call.positions.dtype));  // asynchronous copies
}

QkKernelKey key_for(const QkNormRopeCall& c, const DeviceInfo& device) {
  return qk_kernel_key(c.options, c.q.dtype, c.cos_sin_cache.dtype, c.positions.dtype, c.head_dim, c.rope_dim,
                       c.aligned16, device);
}

std::string rounding_refusal(const QkNormRopeCall& c, bool rounded) {
  if ((c.options.rounding == QkRounding::rounded) != rounded)
    return std::string("handles rounding=") + (rounded ? "rounded" : "fp32") + " only";
  return "";
}

std::string weight_rounding_refusal(const QkNormRopeCall& c, bool twice) {
  if ((c.options.norm_weight_rounding == QkNormWeightRounding::twice) != twice)
    return std::string("handles norm_weight_rounding=") + (twice ? "twice" : "once") + " only";
  return "";
}

// Fills the params and launches; `kernel` is resolved by the caller.
void launch_qknorm_rope(const QkNormRopeCall& c, const QkKernelKey& key, const jit::LoadedKernel& kernel) {
  if (c.num_tokens == 0 || c.num_q_heads + c.num_k_heads == 0) return;
  const int heads = c.num_q_heads + c.num_k_heads;
  const int heads_per_warp = 32 / (c.head_dim / 8);
  const int64_t resident = static_cast<int64_t>(kernel.blocks_per_sm) * kernel.multiprocessors;
  // The longest unit (most reuse of a token's cos/sin) that still gives every resident warp a
  // unit: short units win on small problems (docs/tuning/qknorm_rope.md).
  int unit_iterations = kQkChunkHeadIterations;
  auto chunks_for = [&](int iterations) {
    const int unit_heads = iterations * heads_per_warp;
    return (heads + unit_heads - 1) / unit_heads;
  };
  while (unit_iterations > 1 &&
         c.num_tokens * chunks_for(unit_iterations) < resident * (kThreads / 32))
    unit_iterations /= 2;
  const int chunks_per_token = chunks_for(unit_iterations);
  const int64_t units = c.num_tokens * chunks_per_token;
  const int64_t blocks_needed = (units + kThreads / 32 - 1) / (kThreads / 32);
  const int64_t grid = std::max<int64_t>(1, std::min(resident, blocks_needed));
  const int64_t warps = grid * (kThreads / 32);

  QkNormRopeParams params{};
  const int64_t esize = static_cast<int64_t>(dtype_size(c.q.dtype));
  params.q = c.q.data;
  params.k_shifted = static_cast<char*>(c.k.data) - c.num_q_heads * c.head_stride * esize;
  params.q_weight = c.q_weight.data;
  params.k_weight = c.k_weight.data;
  params.cos_sin_cache = c.cos_sin_cache.data;
  params.positions = c.positions.data;
  params.num_tokens = c.num_tokens;
  params.q_token_stride = c.q.strides[0];
  params.k_token_stride = c.k.strides[0];
  params.head_stride = c.head_stride;
  params.cache_row_stride = c.cos_sin_cache.strides[0];
  params.positions_stride = c.positions.strides[0];
  params.num_q_heads = c.num_q_heads;
  params.num_heads = heads;
  params.unit_iterations = unit_iterations;
  params.chunks_per_token = chunks_per_token;
  params.unit_token_step = warps / chunks_per_token;
  params.unit_chunk_step = static_cast<int>(warps % chunks_per_token);
  params.eps = c.options.eps;
  jit::launch(kernel, static_cast<unsigned>(grid), kThreads, &params, sizeof params,
              static_cast<CUstream>(c.stream), key.pdl);
}

constexpr KernelFunctions<QkNormRopeCall, QkKernelKey> kKernels{
    .key = key_for, .request = qk_kernel_request, .launch = launch_qknorm_rope, .prebuilt_keys = qk_prebuilt_keys};
using Kernels = OpKernels<describe, kKernels>;

void register_qknorm_rope(Registry& registry) {
  const std::string eager_oracle =
      "PyTorch 2.11 eager chain on CUDA (F.rms_norm + eager RoPE) with norm_order=aten; SGLang "
      "split chain with norm_order=warp; with norm_order=aten_mean the eager chain of "
      "x.float().pow(2).mean(-1), rsqrt and one rounding (diffusers' MochiRMSNorm)";
  const std::string diffusers_oracle =
      "PyTorch 2.11 eager chain on CUDA of diffusers' RMSNorm with a 16-bit weight "
      "(x.float().pow(2).mean(-1), rsqrt, cast to the weight dtype, weight multiply) + eager RoPE "
      "(rope_product=complex: Qwen-Image's complex64 product), with norm_order=aten_mean";
  const std::string close_bounds =
      "norm kept in fp32 before RoPE: outputs within 1 ulp of the activation dtype of the eager chain "
      "on most elements (docs/qknorm_rope.md)";
  // The fatbin holds sm_90a, sm_100a and sm_120a images; an "a" image runs on that SM only.
  const std::vector<Capability> prebuilt = {{DeviceKind::cuda, 90, 90, 0},
                                            {DeviceKind::cuda, 100, 100, 0},
                                            {DeviceKind::cuda, 120, 120, 0}};
  // Each implementation takes one (rounding, norm_weight_rounding) mode, so each states the
  // contract of its own oracle (twice implies rounded: the matcher refuses it with fp32).
  auto only_mode = [](Implementation<QkNormRopeCall, QkKernelKey>& impl, bool rounded, bool twice) {
    impl.predicate = [rounded, twice, cuda = impl.predicate](const QkNormRopeCall& c, const QkKernelKey& key) {
      if (c.q.device.kind == DeviceKind::cuda) {
        if (std::string why = rounding_refusal(c, rounded); !why.empty()) return why;
        if (std::string why = weight_rounding_refusal(c, twice); !why.empty()) return why;
      }
      return cuda(c, key);
    };
  };
  for (bool rounded : {true, false}) {
    const std::string suffix = rounded ? "" : "_fp32";
    const Contract contract =
        rounded ? Contract::bit_exact(eager_oracle)
                      .verified("H200 (sm_90), scripts/device_run.sh verify at cbc736f"
                                ": norm_order=aten torch.equal on every case (aot 26 of 26, jit 128 of 128); "
                                "norm_order=aten_mean (once) torch.equal on its cases of tests/python/test_ops_eager.py; "
                                "norm_order=warp is unverified (it never ran beside SGLang's split chain and equals "
                                "aten order by construction at D = 128 only)")
                : Contract::close("PyTorch 2.11 eager chain on CUDA", close_bounds)
                      .verified("H200 (sm_90), scripts/device_run.sh verify at bf0f87e: bench/qknorm_rope_torch.py's float64 bound "
                                "held on every case (jit_fp32 128 of 128, aot_fp32 18 of 18; "
                                "bench/results/h200/checks/qknorm_rope_checks.json)");
    Implementation<QkNormRopeCall, QkKernelKey> aot = aot_implementation<Kernels>();
    aot.name = "qknorm_rope.aot" + suffix;
    aot.capabilities = prebuilt;
    aot.contract = contract;
    aot.description = std::string("prebuilt cubins (nvcc, embedded) of the fused kernel, rounding=") +
                      (rounded ? "rounded" : "fp32") + "; keys: see `ditops list --keys`";
    only_mode(aot, rounded, false);
    if (!rounded) aot.prebuilt = nullptr;  // one listing per key set: the keys carry their rounding
    add_implementation(registry, kOp, std::move(aot));

    Implementation<QkNormRopeCall, QkKernelKey> jit_impl = jit_implementation<Kernels>(
        {.variant = "jit" + suffix,
         .contract = contract,
         .description = std::string("fused kernel compiled at first use by NVRTC for the device's "
                                    "exact arch (cubin cache in memory and on disk), rounding=") +
                        (rounded ? "rounded" : "fp32")});
    only_mode(jit_impl, rounded, false);
    add_implementation(registry, kOp, std::move(jit_impl));
  }
  // diffusers' RMSNorm chain (no prebuilt keys: compiled at first use).
  Implementation<QkNormRopeCall, QkKernelKey> jit_twice = jit_implementation<Kernels>(
      {.variant = "jit_twice",
       .contract = Contract::bit_exact(diffusers_oracle)
                       .verified("H200 (sm_90): torch.equal on every aten_mean twice case of "
                                 "tests/python/test_ops_eager.py and 12 of 12 cases of bench/qknorm_rope_torch.py's "
                                 "VERIFY_DIFFUSERS (real and complex RoPE, Qwen-Image's 2 x 6912 tokens; "
                                 "bench/results/h200/checks/qknorm_rope_checks.json)"),
       .description = "the fused kernel compiled at first use by NVRTC, rounding=rounded with "
                      "norm_weight_rounding=twice (diffusers' RMSNorm)"});
  only_mode(jit_twice, true, true);
  add_implementation(registry, kOp, std::move(jit_twice));

  add_reference<Kernels>(
      registry, qknorm_rope_reference,
      Contract::bit_exact("docs/qknorm_rope.md operation order (the portable oracle; rsqrt correctly rounded)")
          .verified("on every CI run (CPU) by the op's tests; on the GPU every CUDA implementation "
                    "matched it within each case's bound (H200 (sm_90), scripts/device_run.sh ops, "
                    "at 8dea671; norm_weight_rounding=twice, norm_order=aten_mean and "
                    "rope_product=complex against the eager chains only)"),
      "CPU reference, multithreaded over rows; every rounding mode and norm order");
}

}  // namespace

DITOPS_OP_ENTRIES(qknorm_rope, Kernels, register_qknorm_rope);

}  // namespace ditops
