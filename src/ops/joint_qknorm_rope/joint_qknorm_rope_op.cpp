// joint_qknorm_rope: the description, the match (the slots' checks, qknorm_rope's option rules,
// the op's own), the kernel family (qknorm_rope's key and per-head code, its own entry point), the
// CPU reference (qknorm_rope's, per batch and stream) and the registration.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "core/builtin_ops.h"
#include "core/implementation.h"
#include "core/matcher.h"
#include "core/op_builder.h"
#include "ditops/joint_qknorm_rope.h"
#include "jit/cuda_driver.h"
#include "jit/index_check.h"
#include "jit/jit.h"
#include "jit/kernel_family.h"
#include "kernels/joint_qknorm_rope.cuh"
#include "ops/qknorm_rope/qknorm_rope_kernels.h"

namespace ditops {
namespace {

using Call = JointQkNormRopeCall;
constexpr const char* kOp = "joint_qknorm_rope";
constexpr int kThreads = 256;
constexpr int64_t kMaxRows = int64_t{1} << 30;  // B * (S1 + S2): the kernel's cursor is 32-bit

void complete(Call& call, Matcher& m);  // the op's own rules, after the slots'

// The op described once: its slots state the checks every call gets (core/op_builder.h).
OpBuilder<Call> describe() {
  using O = QkNormRopeOptions;
  OpBuilder<Call> b(kOp, "per-stream QK RMSNorm + RoPE of a dual-stream attention into joint [1; 2] Q/K/V",
                    "q1, k1, v1 [B, S1, H, D], q2, k2, v2 [B, S2, H, D] (batch and token strides free, one head "
                    "stride) -> q, k, v [B, S1 + S2, H, D] contiguous; positions [S1 + S2]; qknorm_rope's options. "
                    "include/ditops/joint_qknorm_rope.h, docs/joint_qknorm_rope.md");
  b.dims("B=1,S1=512,S2=4096,H=24,D=128,P=S1+S2,R=D");
  const TensorSlot first{.dtypes = "bf16|f16", .shape = "B,S1,H,D", .layout = "*,*,head_stride,1"};
  const TensorSlot stream1{.dtypes = "=q1", .shape = "B,S1,H,D", .layout = "*,*,head_stride,1"};
  const TensorSlot stream2{.dtypes = "=q1", .shape = "B,S2,H,D", .layout = "*,*,head_stride,1"};
  b.tensor<&Call::q1>(first);
  b.tensor<&Call::k1>(stream1);
  b.tensor<&Call::v1>(stream1);
  b.tensor<&Call::q2>(stream2);
  b.tensor<&Call::k2>(stream2);
  b.tensor<&Call::v2>(stream2);
  b.dim_rule("D", [](int64_t D, const Call&) {
    return D == 64 || D == 128 || D == 256 ? std::string()
                                           : "q1.shape[3] (head_dim) must be 64, 128 or 256 but is " + std::to_string(D);
  });
  const TensorSlot weight{.dtypes = "=q1", .shape = "D", .layout = "1"};
  b.tensor<&Call::q1_weight>(weight);
  b.tensor<&Call::k1_weight>(weight);
  b.tensor<&Call::q2_weight>(weight);
  b.tensor<&Call::k2_weight>(weight);
  // The cache's width is rope_dim or 2 * rope_dim (qknorm_rope's rule).
  b.tensor<&Call::cos_sin_cache>({.dtypes = "f32|=q1", .shape = "P,R", .layout = "*,1", .own = "shape"});
  b.tensor<&Call::positions>({.dtypes = "i32|i64", .shape = "S1+S2"});
  const TensorSlot joint{.role = TensorRole::out, .keyword = true, .dtypes = "=q1", .shape = "B,S1+S2,H,D",
                         .alloc = "dim(q1,0),dim(q1,1)+dim(q2,1),dim(q1,2),dim(q1,3)", .layout = "contiguous"};
  b.tensor<&Call::q>(joint);
  b.tensor<&Call::k>(joint);
  b.tensor<&Call::v>(joint);
  b.option<&O::is_neox>("NeoX halves (true) or interleaved pairs (false, FLUX)");
  b.option<&O::eps>("RMSNorm epsilon of all four norms");
  b.option<&O::rope_dim>("rotated channels; 0: from the cache width");
  b.option<&O::cache_full_width>("cache rows hold rope_dim cos then rope_dim sin");
  b.choice<&O::rounding>({QkRounding::rounded, QkRounding::fp32},
                         "rounded: bit_exact vs the model's chain; fp32: close (qknorm_rope's)");
  b.choice<&O::norm_order>(
      {QkNormOrder::aten, QkNormOrder::warp, QkNormOrder::aten_mean},
      "sum-of-squares order, as qknorm_rope's");
  b.choice<&O::norm_weight_rounding>({QkNormWeightRounding::once, QkNormWeightRounding::twice},
                                     "once: F.rms_norm; twice: diffusers' RMSNorm (rounding=rounded)");
  b.choice<&O::rope_product>({QkRopeProduct::real, QkRopeProduct::complex},
                             "real: FLUX's x*cos + rotate(x)*sin; complex: Qwen-Image's complex64 product");
  b.pdl_option<&O::use_pdl>();
  b.complete(complete);
  // The CPU reference checks positions on the host; CUDA positions only in checked mode.
  b.check_before_run([](const Call& call) {
    if (call.q1.device.kind == DeviceKind::cuda && call.batch * (call.tokens1 + call.tokens2) > 0 &&
        jit::checked_mode()) {
      jit::bind_and_check_stream(kOp, "q1", call.q1.device, call.stream);
      jit::check_indices_on_device(kOp, "positions", call.positions, call.cos_sin_cache.shape[0],
                                   "the rows of cos_sin_cache", call.stream);
    }
  });
  return b;
}

void complete(Call& call, Matcher& m) {
  const int64_t B = *m.value("B"), S1 = *m.value("S1"), S2 = *m.value("S2"), H = *m.value("H"), D = *m.value("D");
  const int rope_dim = qk_option_rules(m, call.options, D, call.cos_sin_cache);
  if (B * (S1 + S2) > kMaxRows)
    m.fail("B * (S1 + S2) must be <= 2^30 joint rows but is " + std::to_string(B * (S1 + S2)));
  if (H > (1 << 24)) m.fail("q1.shape[2] (heads) must be <= 2^24 but is " + std::to_string(H));
  if (B * (S1 + S2) > 0 && call.cos_sin_cache.shape[0] < 1)
    m.fail("cos_sin_cache.shape[0] must be >= 1 (positions index its rows) but is 0");
  const std::pair<const TensorView*, const char*> outs[] = {{&call.q, "q"}, {&call.k, "k"}, {&call.v, "v"}};
  for (int a = 0; a < 3; ++a)
    for (int o = a + 1; o < 3; ++o)
      if (memory_overlaps(*outs[a].first, *outs[o].first))
        m.fail(std::string(outs[a].second) + " and " + outs[o].second + " overlap in memory (both are written)");
  call.batch = B;
  call.tokens1 = S1;
  call.tokens2 = S2;
  call.heads = static_cast<int>(H);
  call.head_dim = static_cast<int>(D);
  call.rope_dim = rope_dim;
  call.options.rope_dim = rope_dim;
  call.head_stride = m.value("head_stride").value_or(D);
  // 16-byte vectors: every pointer, and every stride that addresses memory (an extent-1 dim's does not).
  const int64_t es = static_cast<int64_t>(dtype_size(call.q1.dtype));
  bool aligned = (call.head_stride * es) % 16 == 0;
  for (const TensorView* t : {&call.q1, &call.k1, &call.v1, &call.q2, &call.k2, &call.v2})
    aligned = aligned && is_aligned(t->data, 16) && (t->shape[0] == 1 || (t->strides[0] * es) % 16 == 0) &&
              (t->shape[1] == 1 || (t->strides[1] * es) % 16 == 0);
  for (const TensorView* t : {&call.q1_weight, &call.k1_weight, &call.q2_weight, &call.k2_weight, &call.q, &call.k,
                              &call.v})
    aligned = aligned && is_aligned(t->data, 16);
  const int64_t cs = static_cast<int64_t>(dtype_size(call.cos_sin_cache.dtype));
  call.aligned16 = aligned && is_aligned(call.cos_sin_cache.data, 16) &&
                   (call.cos_sin_cache.strides[0] * cs) % 16 == 0 &&
                   is_aligned(call.positions.data, static_cast<int64_t>(dtype_size(call.positions.dtype)));
}

JointQkStream stream_params(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& wq,
                            const TensorView& wk) {
  auto batch = [](const TensorView& t) { return t.shape[0] == 1 ? 0 : t.strides[0]; };
  auto token = [](const TensorView& t) { return t.shape[1] == 1 ? 0 : t.strides[1]; };
  return {q.data, k.data, v.data, wq.data, wk.data, batch(q), batch(k), batch(v), token(q), token(k), token(v)};
}

void launch_joint(const Call& c, const QkKernelKey& key, const jit::LoadedKernel& kernel) {
  const int64_t J = c.tokens1 + c.tokens2, rows = c.batch * J;
  const int heads_per_warp = 32 / (c.head_dim / 8);
  const int64_t resident = static_cast<int64_t>(kernel.blocks_per_sm) * kernel.multiprocessors;
  // qknorm_rope's rule: the longest unit that still gives every resident warp one.
  int unit_iterations = kQkChunkHeadIterations;
  auto chunks_for = [&](int iterations) {
    const int unit_heads = iterations * heads_per_warp;
    return (c.heads + unit_heads - 1) / unit_heads;
  };
  while (unit_iterations > 1 && rows * 3 * chunks_for(unit_iterations) < resident * (kThreads / 32))
    unit_iterations /= 2;
  const int chunks_per_kind = chunks_for(unit_iterations);
  const int64_t units = rows * 3 * chunks_per_kind;
  const int64_t grid = std::max<int64_t>(1, std::min(resident, (units + kThreads / 32 - 1) / (kThreads / 32)));
  const int64_t warps = grid * (kThreads / 32), row_step = warps / (3 * chunks_per_kind);

  JointQkNormRopeParams p{};
  p.first = stream_params(c.q1, c.k1, c.v1, c.q1_weight, c.k1_weight);
  p.second = stream_params(c.q2, c.k2, c.v2, c.q2_weight, c.k2_weight);
  p.q = c.q.data;
  p.k = c.k.data;
  p.v = c.v.data;
  p.cos_sin_cache = c.cos_sin_cache.data;
  p.positions = c.positions.data;
  p.batch = c.batch;
  p.joint_tokens = J;
  p.tokens1 = c.tokens1;
  p.head_stride = c.head_stride;
  p.cache_row_stride = c.cos_sin_cache.strides[0];
  p.positions_stride = c.positions.strides[0];
  p.heads = c.heads;
  p.unit_iterations = unit_iterations;
  p.chunks_per_kind = chunks_per_kind;
  p.chunks_per_row = 3 * chunks_per_kind;
  p.unit_chunk_step = static_cast<int>(warps % (3 * chunks_per_kind));
  p.unit_token_step = row_step % J;
  p.unit_batch_step = row_step / J;
  p.eps = c.options.eps;
  jit::launch(kernel, static_cast<unsigned>(grid), kThreads, &p, sizeof p, static_cast<CUstream>(c.stream), key.pdl);
}

// Every code path: FLUX's key and its scalar (misaligned) and fp32 forms, Qwen-Image's chain,
// NeoX with partial rotary at D 64 with int32 positions, fp16 at D 256 with an fp16 cache, no PDL.
std::vector<QkKernelKey> joint_variant_keys() {
  QkKernelKey flux;
  flux.full_width = true;
  QkKernelKey scalar = flux, fp32 = flux, qwen, neox, wide;
  scalar.aligned = false;
  fp32.rounding = QkRounding::fp32;
  qwen.order = QkNormOrder::aten_mean;
  qwen.weight_rounding = QkNormWeightRounding::twice;
  qwen.complex_product = true;
  neox.neox = true;
  neox.head_dim = 64;
  neox.rope_dim = 32;
  neox.pos = DType::i32;
  wide.act = wide.cache = DType::f16;
  wide.head_dim = wide.rope_dim = 256;
  wide.pdl = false;
  return {flux, scalar, fp32, qwen, neox, wide};
}

QkKernelKey joint_key(const Call& c, const DeviceInfo& d) {
  return qk_kernel_key(c.options, c.q1.dtype, c.cos_sin_cache.dtype, c.positions.dtype, c.head_dim, c.rope_dim,
                       c.aligned16, d);
}

KernelRequest joint_request(const QkKernelKey& k) {
  KernelRequest r = qk_kernel_request(k);  // its template arguments and launch bounds
  r.header = "joint_qknorm_rope.cuh";
  r.function = "ditops::joint_qknorm_rope_body";
  r.params_type = "ditops::JointQkNormRopeParams";
  r.template_key = std::string(kOp) + ":" + k.to_string();
  return r;
}

constexpr KernelFunctions<Call, QkKernelKey> kKernels{
    .key = joint_key, .request = joint_request, .launch = launch_joint,
    .nothing_to_do = [](const Call& c) { return c.batch * (c.tokens1 + c.tokens2) == 0 || c.heads == 0; },
    .variant_keys = joint_variant_keys};
using Kernels = OpKernels<describe, kKernels>;

// A [S, H, D] block of a joint output (rows `first` .. of batch b) as qknorm_rope's q or k.
TensorView joint_block(const Call& c, const TensorView& out, int64_t b, int64_t first, int64_t tokens) {
  TensorView t = out;
  t.rank = 3;
  t.data = static_cast<char*>(out.data) + ((b * (c.tokens1 + c.tokens2) + first) * c.heads * c.head_dim) *
                                              static_cast<int64_t>(dtype_size(out.dtype));
  t.shape[0] = tokens;
  t.shape[1] = c.heads;
  t.shape[2] = c.head_dim;
  t.strides[0] = c.heads * c.head_dim;
  t.strides[1] = c.head_dim;
  t.strides[2] = 1;
  return t;
}

}  // namespace

void joint_qknorm_rope_reference(const JointQkNormRopeCall& c) {
  const int64_t J = c.tokens1 + c.tokens2;
  if (c.batch * J == 0 || c.heads == 0) return;
  // Every position indexes a cache row before anything is written.
  const int64_t cache_rows = c.cos_sin_cache.shape[0];
  for (int64_t j = 0; j < J; ++j) {
    const int64_t at = j * c.positions.strides[0];
    const int64_t pos = c.positions.dtype == DType::i64 ? static_cast<const int64_t*>(c.positions.data)[at]
                                                        : static_cast<const int32_t*>(c.positions.data)[at];
    if (pos < 0 || pos >= cache_rows)
      throw InvalidArgument(std::string(kOp) + ": positions[" + std::to_string(j) + "] = " + std::to_string(pos) +
                            " is outside the cos_sin_cache rows [0, " + std::to_string(cache_rows) + ")");
  }
  // The concatenation: each input row into its joint row.
  const int64_t es = static_cast<int64_t>(dtype_size(c.q1.dtype)), row_bytes = c.head_dim * es;
  const std::pair<const TensorView*, const TensorView*> kinds[] = {{&c.q1, &c.q2}, {&c.k1, &c.k2}, {&c.v1, &c.v2}};
  const TensorView* outs[] = {&c.q, &c.k, &c.v};
  for (int kind = 0; kind < 3; ++kind)
    for (int64_t b = 0; b < c.batch; ++b)
      for (int64_t j = 0; j < J; ++j) {
        const bool second = j >= c.tokens1;
        const TensorView& in = second ? *kinds[kind].second : *kinds[kind].first;
        const int64_t t = second ? j - c.tokens1 : j;
        for (int64_t h = 0; h < c.heads; ++h) {
          const char* src = static_cast<const char*>(in.data) +
                            (b * in.strides[0] + t * in.strides[1] + h * c.head_stride) * es;
          char* dst = static_cast<char*>(outs[kind]->data) + ((b * J + j) * c.heads + h) * row_bytes;
          std::memcpy(dst, src, static_cast<size_t>(row_bytes));
        }
      }
  // Then qknorm_rope in place on each stream's rows, with its weights and positions.
  for (int64_t b = 0; b < c.batch; ++b)
    for (int stream = 0; stream < 2; ++stream) {
      const int64_t first = stream == 0 ? 0 : c.tokens1, tokens = stream == 0 ? c.tokens1 : c.tokens2;
      if (tokens == 0) continue;
      QkNormRopeCall qk;
      qk.q = joint_block(c, c.q, b, first, tokens);
      qk.k = joint_block(c, c.k, b, first, tokens);
      qk.q_weight = stream == 0 ? c.q1_weight : c.q2_weight;
      qk.k_weight = stream == 0 ? c.k1_weight : c.k2_weight;
      qk.cos_sin_cache = c.cos_sin_cache;
      qk.positions = c.positions;
      qk.positions.data = static_cast<char*>(c.positions.data) +
                          first * c.positions.strides[0] * static_cast<int64_t>(dtype_size(c.positions.dtype));
      qk.positions.shape[0] = tokens;
      qk.options = c.options;
      qk.num_tokens = tokens;
      qk.num_q_heads = qk.num_k_heads = c.heads;
      qk.head_dim = c.head_dim;
      qk.rope_dim = c.rope_dim;
      qk.head_stride = c.head_dim;
      qknorm_rope_reference(qk);
    }
}

namespace {

void register_joint_qknorm_rope(Registry& registry) {
  const std::string chain =
      "the model's chain on CUDA, PyTorch 2.11 eager: each stream's per-head norm (norm_order=aten: F.rms_norm; "
      "aten_mean + twice: diffusers' RMSNorm), torch.cat([stream 1, stream 2], dim=1) of q, k and v, then the "
      "model's RoPE of the joint rows (rope_product=real: diffusers' apply_rotary_emb; complex: Qwen-Image's)";
  // Each implementation takes one rounding mode and states its own contract, as qknorm_rope's do.
  for (bool rounded : {true, false}) {
    Implementation<Call, QkKernelKey> jit_impl = jit_implementation<Kernels>(
        {.variant = rounded ? "jit" : "jit_fp32",
         .contract =
             rounded ? Contract::bit_exact(chain).verified("H200 (sm_90), scripts/device_run.sh verify at bf0f87e: torch.equal to the processors' chain in 7 of 7 "
                                                             "cases and in graph replay; the driver's device parts")
                     : Contract::close(chain, "qknorm_rope's rounding=fp32 bound: the norm kept in fp32 before RoPE, "
                                              "within 1 ulp of the activation dtype on most elements")
                           .verified("H200 (sm_90), scripts/device_run.sh verify at bf0f87e: within the float64 bound in 7 of 7 cases, v byte-equal"),
         .description = std::string("qknorm_rope's per-head code reading each stream's rows and writing the "
                                    "joint rows, v copied; NVRTC at first use; rounding=") +
                        (rounded ? "rounded" : "fp32")});
    jit_impl.predicate = [rounded, cuda = jit_impl.predicate](const Call& c, const QkKernelKey& key) -> std::string {
      if (c.q1.device.kind == DeviceKind::cuda && (c.options.rounding == QkRounding::rounded) != rounded)
        return std::string("handles rounding=") + (rounded ? "rounded" : "fp32") + " only";
      return cuda(c, key);
    };
    add_implementation(registry, kOp, std::move(jit_impl));
  }
  add_reference<Kernels>(
      registry, joint_qknorm_rope_reference,
      Contract::bit_exact("docs/qknorm_rope.md operation order per stream after the concatenation (the portable "
                          "oracle; rsqrt correctly rounded)")
          .verified("on every CI run (CPU) by the op's driver cases (V bits, float64 bound of q and k)"),
      "CPU reference: the rows concatenated, then qknorm_rope's reference in place per batch and stream");
}

}  // namespace

DITOPS_OP_ENTRIES(joint_qknorm_rope, Kernels, register_joint_qknorm_rope);

}  // namespace ditops
