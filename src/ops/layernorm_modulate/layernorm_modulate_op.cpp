// layernorm_modulate, layernorm_modulate_fp8, layernorm_modulate_fp8_rowwise and qk_head_layernorm:
// argument matching, the registry entries (provenance, capability, contract, predicate), the template
// key and the launch.
#include <algorithm>
#include <mutex>
#include <unordered_map>

#include "core/enum_name.h"
#include "core/builtin_ops.h"
#include "core/implementation.h"
#include "core/matcher.h"
#include "core/op_builder.h"
#include "ditops/layernorm_modulate.h"
#include "jit/cuda_driver.h"
#include "jit/jit.h"
#include "jit/kernel_family.h"
#include "kernels/layernorm_modulate.cuh"
#include "ops/common/fp8.h"
#include "ops/layernorm_modulate/layernorm_modulate_kernels.h"

namespace ditops {

namespace {

constexpr const char* kOpBf16 = "layernorm_modulate";
constexpr const char* kOpFp8 = "layernorm_modulate_fp8";
constexpr const char* kOpRowwise = "layernorm_modulate_fp8_rowwise";
constexpr const char* kOpQk = "qk_head_layernorm";
constexpr int kThreads = 128;        // both mappings: aten's 128 threads per row or 4 rows of a warp
constexpr int kMaxDim = 8192;
constexpr int kMaxHeadDim = 128;
constexpr int kQkRowsPerWarp = 4;    // qk heads per warp, loads issued together
// Dh = 128 with 16-byte rows: 8 lanes per head, 4 heads per warp at a time, this many rounds: two
// measured fastest against one and four (docs/tuning/layernorm_modulate.md).
constexpr int kQkD128Iterations = 2;

// The options every op of the family reads (fp8_reciprocal: the static fp8 op only); `dim` names
// the normalized dim.
template <typename Builder>
void describe_ln_options(Builder& b, bool fp8, const std::string& dim) {
  using O = LayerNormModulateOptions;
  b.template option<&O::eps>("LayerNorm epsilon");
  if (fp8) describe_fp8_reciprocal<&O::fp8_reciprocal>(b, "input_scale");
  b.template choice<&O::mapping>(
      {LnRowMapping::automatic, LnRowMapping::warp, LnRowMapping::cta},
      "rows per warp or per 128-thread CTA (automatic: by " + dim + ")");
  b.template pdl_option<&O::use_pdl>();
}

template <typename Args>
LayerNormModulateCall complete_modulate(const Args& a, Matcher& m);
LayerNormModulateCall complete_qk_head(const QkHeadLayerNormArgs& a, Matcher& m);

// The kind of call an op's arguments struct makes.
template <typename Args>
constexpr LnModulateKind kModulateKind = std::is_same_v<Args, LayerNormModulateFp8Args>  ? LnModulateKind::fp8_out
                                         : std::is_same_v<Args, LayerNormModulateFp8RowwiseArgs> ? LnModulateKind::fp8_rowwise
                                                                                         : LnModulateKind::bf16_out;

// layernorm_modulate, layernorm_modulate_fp8 and layernorm_modulate_fp8_rowwise described once
// each: the slots state the checks every call gets (core/op_builder.h). The output may be x (in
// place) and rows may be strided adaLN chunks: the overlaps and the row strides are the ops' own
// rules (complete_modulate).
template <typename Args>
OpBuilder<Args, LayerNormModulateCall> modulate_description() {
  constexpr bool fp8 = kModulateKind<Args> == LnModulateKind::fp8_out;
  constexpr bool rowwise = kModulateKind<Args> == LnModulateKind::fp8_rowwise;
  using O = LayerNormModulateOptions;
  OpBuilder<Args, LayerNormModulateCall> b(
      fp8 ? kOpFp8 : rowwise ? kOpRowwise : kOpBf16,
      fp8       ? "layernorm_modulate, then static e4m3: e4m3(clamp(y * (1 / input_scale), +-448))"
      : rowwise ? "layernorm_modulate, then per-token dynamic e4m3 with fp32 scales (torchao's rowwise recipe; "
                  "docs/fp8_rowwise_quant.md)"
                : "F.layer_norm(x) * (1 + scale[:, None]) (+ shift[:, None]), bit-exact with the eager chain",
      "x [B, S, D] bf16 (D <= 8192), scale/shift [B, D] (rows may be strided adaLN chunks); out may be x. "
      "include/ditops/layernorm_modulate.h, docs/layernorm_modulate.md");
  b.dims("B=1,S=4608,D=3072");
  b.template tensor<&Args::x>({.dtypes = "bf16", .shape = "B,S,D", .layout = "*,*,1"});
  b.dim_rule("D", [](int64_t D, const Args&) {
    return D > 0 && D <= kMaxDim && D % 4 == 0
               ? std::string()
               : "x.shape[2] (D) must be a multiple of 4 in [4, 8192] (aten's vectorized LayerNorm) but is " +
                     std::to_string(D);
  });
  b.template tensor<&Args::scale>({.dtypes = "=x", .shape = "B,D", .layout = "*,1"});
  b.template tensor<&Args::shift>({.optional = true, .dtypes = "=x", .shape = "B,D", .layout = "*,1"});
  if constexpr (fp8) b.template tensor<&Args::input_scale>({.dtypes = "f32", .shape = "1"});
  b.template tensor<&Args::out>({.role = TensorRole::out, .keyword = true, .dtypes = fp8 || rowwise ? "f8e4m3fn" : "=x",
                                 .shape = "B,S,D", .alloc = "like:x", .alloc_dtype = fp8 || rowwise ? "f8e4m3fn" : "",
                                 .layout = "*,*,1", .own = "overlap"});
  if constexpr (rowwise)
    b.template tensor<&Args::out_scale>({.role = TensorRole::out, .keyword = true, .dtypes = "f32", .shape = "B,S,1",
                                         .alloc = "dim(x,0),dim(x,1),1", .alloc_dtype = "f32",
                                         .doc = "the rows' fp32 scales", .layout = "contiguous"});
  b.template tensor<&Args::options, &O::stats_out>(
      {.role = TensorRole::out, .optional = true, .keyword = true, .dtypes = "f32", .shape = "B,S,2",
       .present = "caller", .doc = "(mean, rstd) per row, as native_layer_norm returns them", .layout = "contiguous",
       .own = "overlap"});
  describe_ln_options(b, fp8, "D");
  b.complete(complete_modulate<Args>);
  return b;
}

OpBuilder<QkHeadLayerNormArgs, LayerNormModulateCall> describe_qk_head() {
  using C = QkHeadLayerNormArgs;
  OpBuilder<C, LayerNormModulateCall> b(kOpQk, "F.layer_norm over the head dim of q and k (no affine)",
                                        "q [B, S, H, Dh], k [B, S, Hk, Dh] bf16; q_out/k_out may be q/k. "
                                        "include/ditops/layernorm_modulate.h");
  b.dims("B=1,S=4608,H=24,Hk=24,Dh=128");
  b.tensor<&C::q>({.dtypes = "bf16", .shape = "B,S,H,Dh", .layout = "*,q_token_stride,*,1"});
  b.dim_rule("Dh", [](int64_t Dh, const C&) {
    return Dh > 0 && Dh <= kMaxHeadDim && Dh % 4 == 0
               ? std::string()
               : "q.shape[3] (head_dim) must be a multiple of 4 in [4, 128] but is " + std::to_string(Dh);
  });
  b.tensor<&C::k>({.dtypes = "=q", .shape = "B,S,Hk,Dh", .layout = "*,k_token_stride,*,1"});
  b.tensor<&C::q_out>({.role = TensorRole::out, .keyword = true, .dtypes = "=q", .shape = "B,S,H,Dh",
                       .alloc = "like:q", .layout = "*,q_out_token_stride,*,1", .own = "overlap"});
  b.tensor<&C::k_out>({.role = TensorRole::out, .keyword = true, .dtypes = "=q", .shape = "B,S,Hk,Dh",
                       .alloc = "like:k", .layout = "*,k_out_token_stride,*,1", .own = "overlap"});
  describe_ln_options(b, false, "Dh");
  b.complete(complete_qk_head);
  return b;
}

// The output may be the input itself (in place) but must not overlap it any other way.
void check_output_aliasing(const Matcher& m, const TensorView& in, const char* in_name,
                           const TensorView& out, const char* out_name) {
  if (same_view(in, out)) return;
  if (memory_overlaps(in, out))
    m.fail(std::string(out_name) + " overlaps " + in_name + " without being the same view (in place "
           "needs identical data pointer and strides)");
}

// The shared part of the bf16 and fp8 ops: x, scale, shift, out.
template <typename Args>
LayerNormModulateCall complete_modulate(const Args& a, Matcher& m) {
  constexpr LnModulateKind kind = kModulateKind<Args>;
  LayerNormModulateCall call{.kind = kind, .x = a.x, .scale = a.scale, .shift = a.shift, .out = a.out,
                             .options = a.options};
  if constexpr (kind == LnModulateKind::fp8_out) call.input_scale = a.input_scale;
  if constexpr (kind == LnModulateKind::fp8_rowwise) call.out_scale = a.out_scale;
  const int64_t D = *m.value("D");
  const bool has_shift = call.shift.rank != 0;
  m.require_nonnegative_strides(call.x, "x");
  m.require_nonnegative_strides(call.scale, "scale");
  if (has_shift) m.require_nonnegative_strides(call.shift, "shift");
  m.require_disjoint_rows(call.out, "out", D, "D");
  if (kind == LnModulateKind::fp8_rowwise) m.require_disjoint(call.out, "out", call.out_scale, "out_scale");
  if (kind == LnModulateKind::fp8_out || kind == LnModulateKind::fp8_rowwise) {
    if (memory_overlaps(call.x, call.out)) m.fail("out (fp8) must not overlap x");
  } else {
    check_output_aliasing(m, call.x, "x", call.out, "out");
  }
  if (memory_overlaps(call.scale, call.out) || (has_shift && memory_overlaps(call.shift, call.out)))
    m.fail("out must not overlap scale or shift");
  if (!(call.options.eps >= 0.0f)) m.fail("eps must be >= 0 but is " + std::to_string(call.options.eps));

  const int64_t B = *m.value("B"), S = *m.value("S");
  if (!has_shift) call.shift = TensorView{};
  call.batch = B;
  call.seq = S;
  call.rows = B * S;
  call.dim = static_cast<int>(D);
  call.has_shift = has_shift;
  if (call.options.stats_out.data) {
    if (memory_overlaps(call.options.stats_out, call.x) || memory_overlaps(call.options.stats_out, call.out))
      m.fail("stats_out must not overlap x or out");
    call.write_stats = true;
  }
  const int64_t es = 2, os = kind == LnModulateKind::bf16_out ? 2 : 1, ov = 4 * os;
  call.aligned = is_aligned(call.x.data, 8) && (call.x.strides[0] * es) % 8 == 0 && (call.x.strides[1] * es) % 8 == 0 &&
                 is_aligned(call.scale.data, 8) && (call.scale.strides[0] * es) % 8 == 0 &&
                 (!has_shift || (is_aligned(call.shift.data, 8) && (call.shift.strides[0] * es) % 8 == 0)) &&
                 is_aligned(call.out.data, static_cast<int>(ov)) && (call.out.strides[0] * os) % ov == 0 &&
                 (call.out.strides[1] * os) % ov == 0;
  return call;
}

LayerNormModulateCall complete_qk_head(const QkHeadLayerNormArgs& a, Matcher& m) {
  LayerNormModulateCall call{.kind = LnModulateKind::qk_head, .x = a.q, .out = a.q_out, .x2 = a.k, .out2 = a.k_out,
                             .options = a.options};
  const int64_t Dh = *m.value("Dh");
  const int64_t B = *m.value("B"), S = *m.value("S"), Hq = *m.value("H"), Hk = *m.value("Hk");
  // (b, s) collapse into one token index: stride(0) == S * stride(1) (free when B == 1).
  for (const auto& [t, name] : {std::pair<const TensorView*, const char*>{&a.q, "q"}, {&a.k, "k"},
                                {&a.q_out, "q_out"}, {&a.k_out, "k_out"}}) {
    m.require_nonnegative_strides(*t, name);
    int64_t batch_stride = 0;  // an empty tensor's strides are arbitrary: the product may overflow
    const bool overflow = __builtin_mul_overflow(S, t->strides[1], &batch_stride);
    if (B > 1 && (overflow || t->strides[0] != batch_stride))
      m.fail(std::string(name) + ".stride(0) must be S * stride(1) = " +
             (overflow ? std::string("(beyond int64)") : std::to_string(batch_stride)) +
             " (batch and sequence collapse into one token index) but is " + std::to_string(t->strides[0]));
  }
  // Written rows (token, head) must be disjoint.
  for (const auto& [t, name, heads] : {std::tuple<const TensorView*, const char*, int64_t>{&a.q_out, "q_out", Hq},
                                       {&a.k_out, "k_out", Hk}}) {
    if (t->numel() == 0) continue;
    if (heads > 1 && t->strides[2] < Dh)
      m.fail(std::string(name) + ".stride(2) must be >= head_dim=" + std::to_string(Dh) +
             " (heads may not overlap) but is " + std::to_string(t->strides[2]));
    const int64_t span = (heads - 1) * t->strides[2] + Dh;
    if (B * S > 1 && t->strides[1] < span)
      m.fail(std::string(name) + ".stride(1) must be >= " + std::to_string(span) +
             " (tokens may not overlap) but is " + std::to_string(t->strides[1]));
  }
  check_output_aliasing(m, a.q, "q", a.q_out, "q_out");
  check_output_aliasing(m, a.k, "k", a.k_out, "k_out");
  if (memory_overlaps(a.q_out, a.k_out)) m.fail("q_out and k_out must not overlap");
  if (memory_overlaps(a.q, a.k_out)) m.fail("k_out must not overlap q");
  if (memory_overlaps(a.k, a.q_out)) m.fail("q_out must not overlap k");
  if (!(a.options.eps >= 0.0f)) m.fail("eps must be >= 0 but is " + std::to_string(a.options.eps));
  if (a.options.stats_out.data) m.fail("stats_out is not produced by qk_head_layernorm");

  call.batch = B;
  call.seq = S;
  call.rows = B * S * Hq;
  call.rows2 = B * S * Hk;
  call.heads = static_cast<int>(Hq);
  call.heads2 = static_cast<int>(Hk);
  call.dim = static_cast<int>(Dh);
  call.aligned = true;
  call.aligned16 = true;
  for (const TensorView* t : {&a.q, &a.k, &a.q_out, &a.k_out}) {
    call.aligned = call.aligned && is_aligned(t->data, 8) && (t->strides[1] * 2) % 8 == 0 &&
                   (t->strides[2] * 2) % 8 == 0;
    call.aligned16 = call.aligned16 && is_aligned(t->data, 16) && (t->strides[1] * 2) % 16 == 0 &&
                     (t->strides[2] * 2) % 16 == 0;
  }
  return call;
}

}  // namespace

const char* ln_row_mapping_name(LnRowMapping mapping) { return enumerator_name(mapping); }

namespace {

// Register slots of a row per thread, rounded up to a few sizes so the number of compiled
// variants stays small (FLUX/Qwen D=3072 -> 24 warp slots, GLM 4096 -> 32, Wan 5120 -> 10 CTA
// slots, FLUX.2 6144 -> 12, 8192 -> 16).
int slot_bucket(int needed) {
  static constexpr int kBuckets[] = {1, 2, 3, 4, 6, 8, 10, 12, 16, 20, 24, 28, 32, 40, 48, 64};
  for (int b : kBuckets)
    if (needed <= b) return b;
  return 64;  // not reached: D <= 8192 needs at most 64 warp slots
}

// Automatic mapping: the CTA per row everywhere, faster or equal at every shape measured
// (docs/tuning/layernorm_modulate.md). The warp mapping stays selectable for measurements.
bool use_cta(const LayerNormModulateCall& c, const DeviceInfo& device) {
  (void)device;
  return c.options.mapping != LnRowMapping::warp;
}

// The persistent CTA loop's knobs: the next row prefetched up to 10 slots (wider rows hold too
// much for a second row), six resident CTAs for rows of up to 6 slots, as measured fastest
// (docs/tuning/layernorm_modulate.md).
constexpr int kPrefetchMaxSlots = 10;
constexpr int kMinBlocksSmallRows = 6;  // rows of <= 6 slots
// fp8_rowwise rows of 7-10 slots with the prefetch: ptxas' own choice is 218 registers, 2 CTAs per
// SM; at 4 (128 registers, no spill) Wan's (1,32760,5120) took 203 us instead of 256 on an H100.
constexpr int kMinBlocksRowwisePrefetch = 4;
struct LnmKey {
  LnModulateKind kind = LnModulateKind::bf16_out;
  int slots = 1;
  bool cta = false;
  bool even = false;      // n_vec == slots * threads per row: counts fold to constants
  bool prefetch = false;  // the persistent loop loads the next row before the current statistics
  bool shift = false;
  bool div_full = false;
  bool pdl = true;
  bool aligned = true;
  bool head128 = false;  // qk: the 8-lanes-per-head kernel (Dh = 128, 16-byte rows)

  std::string to_string() const {
    if (kind == LnModulateKind::qk_head && head128)
      return std::string("qk_head,d128,iterations=") + std::to_string(kQkD128Iterations) + (pdl ? ",pdl" : ",nopdl");
    if (kind == LnModulateKind::qk_head)
      return std::string("qk_head,rows_per_warp=") + std::to_string(kQkRowsPerWarp) + (pdl ? ",pdl" : ",nopdl") +
             (aligned ? ",vec8" : ",scalar");
    return std::string(kind == LnModulateKind::fp8_out ? "fp8" : kind == LnModulateKind::fp8_rowwise ? "fp8_rowwise" : "bf16") + ",slots=" + std::to_string(slots) +
           (cta ? ",cta" : ",warp") + (even ? ",even" : "") + (prefetch ? ",prefetch" : "") +
           (shift ? ",shift" : ",noshift") +
           (kind == LnModulateKind::fp8_out ? (div_full ? ",div_full" : ",ieee") : "") +
           (pdl ? ",pdl" : ",nopdl") + (aligned ? ",vec8" : ",scalar");
  }
  uint64_t packed() const {
    return pack_key({{kind, 4}, {slots, 128}, cta, even, prefetch, shift, div_full, pdl, aligned, head128});
  }
};

LnmKey key_for(const LayerNormModulateCall& c, const DeviceInfo& device) {
  LnmKey key;
  key.kind = c.kind;
  key.pdl = c.options.use_pdl && (device.features & kFeaturePdl);
  key.aligned = c.aligned;
  if (c.kind == LnModulateKind::qk_head) {
    key.head128 = c.dim == 128 && c.aligned16;
    return key;
  }
  key.cta = use_cta(c, device);
  const int n_vec = c.dim / 4;
  const int per_row_threads = key.cta ? kThreads : 32;
  key.slots = slot_bucket((n_vec + per_row_threads - 1) / per_row_threads);
  key.even = n_vec == key.slots * per_row_threads;
  key.prefetch = key.cta && key.slots <= kPrefetchMaxSlots;
  key.shift = c.has_shift;
  key.div_full = c.kind == LnModulateKind::fp8_out && c.options.fp8_reciprocal == Fp8Reciprocal::div_full;
  return key;
}

KernelRequest request_for(const LnmKey& key) {
  KernelRequest r{.header = "layernorm_modulate.cuh",
                  .function = "ditops::layernorm_modulate_body",
                  .params_type = "ditops::LayerNormModulateParams",
                  .max_threads = kThreads,
                  .template_key = "layernorm_modulate:" + key.to_string()};
  if (key.kind == LnModulateKind::qk_head) {
    r.function = key.head128 ? "ditops::qk_head_layernorm_d128_body" : "ditops::qk_head_layernorm_body";
    r.template_args = key.head128 ? jit::kernel_args(kQkD128Iterations, key.pdl)
                                  : jit::kernel_args(kQkRowsPerWarp, key.pdl, key.aligned);
    r.params_type = "ditops::QkHeadLayerNormParams";
    return r;
  }
  r.template_args = jit::kernel_args(key.slots, key.cta, key.shift, key.kind != LnModulateKind::bf16_out, key.div_full,
                                     key.pdl, key.aligned, key.even, key.prefetch);
  if (key.kind == LnModulateKind::fp8_rowwise) r.template_args += ", " + jit::kernel_args(true);  // kRowwise
  if (key.cta && key.slots <= 6) r.min_blocks = kMinBlocksSmallRows;
  else if (key.kind == LnModulateKind::fp8_rowwise && key.prefetch) r.min_blocks = kMinBlocksRowwisePrefetch;
  return r;
}

void launch(const LayerNormModulateCall& c, const LnmKey& key, const jit::LoadedKernel& kernel) {
  const CUstream stream = static_cast<CUstream>(c.stream);
  if (c.kind == LnModulateKind::qk_head) {
    if (c.rows + c.rows2 == 0) return;
    QkHeadLayerNormParams p{};
    p.q = c.x.data;
    p.q_out = c.out.data;
    p.k = c.x2.data;
    p.k_out = c.out2.data;
    p.q_rows = c.rows;
    p.total_rows = c.rows + c.rows2;
    p.q_token_stride = c.x.strides[1];
    p.q_head_stride = c.x.strides[2];
    p.q_out_token_stride = c.out.strides[1];
    p.q_out_head_stride = c.out.strides[2];
    p.k_token_stride = c.x2.strides[1];
    p.k_head_stride = c.x2.strides[2];
    p.k_out_token_stride = c.out2.strides[1];
    p.k_out_head_stride = c.out2.strides[2];
    p.q_heads = std::max(c.heads, 1);
    p.k_heads = std::max(c.heads2, 1);
    p.n_vec = c.dim / 4;
    p.eps = c.options.eps;
    const int64_t per_warp = key.head128 ? 4 * kQkD128Iterations : kQkRowsPerWarp;
    const int64_t warps = (c.rows + per_warp - 1) / per_warp + (c.rows2 + per_warp - 1) / per_warp;
    const int64_t grid = (warps + kThreads / 32 - 1) / (kThreads / 32);
    jit::launch(kernel, static_cast<unsigned>(grid), kThreads, &p, sizeof p, stream, key.pdl);
    return;
  }
  if (c.rows == 0) return;
  LayerNormModulateParams p{};
  p.x = c.x.data;
  p.out = c.out.data;
  p.scale = c.scale.data;
  p.shift = c.has_shift ? c.shift.data : nullptr;
  p.input_scale = static_cast<const float*>(c.input_scale.data);
  p.out_scale = static_cast<float*>(c.out_scale.data);
  p.stats = c.write_stats ? static_cast<float*>(c.options.stats_out.data) : nullptr;
  p.rows = c.rows;
  p.seq = std::max<int64_t>(c.seq, 1);
  p.x_batch_stride = c.x.strides[0];
  p.x_token_stride = c.x.strides[1];
  p.out_batch_stride = c.out.strides[0];
  p.out_token_stride = c.out.strides[1];
  p.scale_row_stride = c.scale.strides[0];
  p.shift_row_stride = c.has_shift ? c.shift.strides[0] : 0;
  p.n_vec = c.dim / 4;
  p.eps = c.options.eps;
  int64_t grid = (c.rows + kThreads / 32 - 1) / (kThreads / 32);
  if (key.cta) {
    // As many CTAs as are resident, every one looping over the same number of rows (a last
    // partial round would leave most SMs idle while a few finish).
    const int64_t resident = std::max<int64_t>(1, int64_t{kernel.blocks_per_sm} * kernel.multiprocessors);
    const int64_t rows_per_cta = (c.rows + resident - 1) / resident;
    grid = (c.rows + rows_per_cta - 1) / rows_per_cta;
  }
  jit::launch(kernel, static_cast<unsigned>(grid), kThreads, &p, sizeof p, stream, key.pdl);
}

// The rowwise kernel's keys for the compile test (tests/test_layernorm_modulate.cpp compiles the others).
std::vector<LnmKey> rowwise_variant_keys() {
  std::vector<LnmKey> keys;
  for (int slots : {1, 3, 6, 8, 10, 12, 16}) {
    LnmKey k;
    k.kind = LnModulateKind::fp8_rowwise;
    k.slots = slots;
    k.cta = true;
    k.even = slots == 6;
    k.prefetch = slots <= kPrefetchMaxSlots;
    k.shift = slots != 3;
    keys.push_back(k);
  }
  LnmKey warp;
  warp.kind = LnModulateKind::fp8_rowwise;
  warp.slots = 24;
  warp.shift = true;
  keys.push_back(warp);
  warp.aligned = false;
  warp.pdl = false;
  keys.push_back(warp);
  return keys;
}

// The four ops share the kernel, its key and the launch: one family each.
constexpr KernelFunctions<LayerNormModulateCall, LnmKey> kKernels{
    .key = key_for, .request = request_for, .launch = launch,
    .device = [](const LayerNormModulateCall& c) { return c.x.device; }};
constexpr KernelFunctions<LayerNormModulateCall, LnmKey> kRowwiseKernels{
    .key = key_for, .request = request_for, .launch = launch, .variant_keys = rowwise_variant_keys,
    .device = [](const LayerNormModulateCall& c) { return c.x.device; }};
using Bf16Kernels = OpKernels<modulate_description<LayerNormModulateArgs>, kKernels>;
using Fp8Kernels = OpKernels<modulate_description<LayerNormModulateFp8Args>, kKernels>;
using RowwiseKernels = OpKernels<modulate_description<LayerNormModulateFp8RowwiseArgs>, kRowwiseKernels>;
using QkKernels = OpKernels<describe_qk_head, kKernels>;

}  // namespace

const OpFunction<std::string, LayerNormModulateArgs> layernorm_modulate{op_run<Bf16Kernels>};
const OpFunction<std::string, LayerNormModulateFp8Args> layernorm_modulate_fp8{op_run<Fp8Kernels>};
const OpFunction<std::string, LayerNormModulateFp8RowwiseArgs> layernorm_modulate_fp8_rowwise{op_run<RowwiseKernels>};
const OpFunction<std::string, QkHeadLayerNormArgs> qk_head_layernorm{op_run<QkKernels>};
const OpFunction<LayerNormModulateCall, LayerNormModulateArgs> match_layernorm_modulate{op_match<Bf16Kernels>};
const OpFunction<LayerNormModulateCall, LayerNormModulateFp8Args> match_layernorm_modulate_fp8{op_match<Fp8Kernels>};
const OpFunction<LayerNormModulateCall, LayerNormModulateFp8RowwiseArgs> match_layernorm_modulate_fp8_rowwise{
    op_match<RowwiseKernels>};
const OpFunction<LayerNormModulateCall, QkHeadLayerNormArgs> match_qk_head_layernorm{op_match<QkKernels>};

DispatchReport explain_layernorm_modulate(const LayerNormModulateCall& call) {
  switch (call.kind) {
    case LnModulateKind::bf16_out: return explain<Bf16Kernels>(call, call.options.dispatch);
    case LnModulateKind::fp8_out: return explain<Fp8Kernels>(call, call.options.dispatch);
    case LnModulateKind::fp8_rowwise: return explain<RowwiseKernels>(call, call.options.dispatch);
    case LnModulateKind::qk_head: break;
  }
  return explain<QkKernels>(call, call.options.dispatch);
}

void register_layernorm_modulate(Registry& registry) {
  describe_op<Bf16Kernels>(registry);
  describe_op<Fp8Kernels>(registry);
  describe_op<RowwiseKernels>(registry);
  describe_op<QkKernels>(registry);
  const std::string eager_chain =
      "PyTorch 2.11 eager chain on CUDA: F.layer_norm(x, (D,), eps=eps) * (1 + scale[:, None]) "
      "(+ shift[:, None]) in bf16 (aten vectorized_layer_norm_kernel)";
  const std::string mappings =
      "; one warp (row in registers) or one 128-thread CTA per row, chosen from D and the row count";
  const std::string ref_bounds =
      "rstd correctly rounded where the GPU uses MUFU.RSQ (<= 2 fp32 ulp apart, mean identical): "
      "elements may differ by 1 bf16 ulp of the normalized value, propagated through the modulate "
      "(|d| <= 2^-6 * (|y*(1+scale)| + |out|)); docs/layernorm_modulate.md";
  const std::string ref_verified =
      "on every CI run (CPU) by the op's tests; on the GPU every CUDA implementation matched it within each case's "
      "bound (H200 (sm_90), scripts/device_run.sh ops at 8dea671)";

  add_jit<Bf16Kernels>(
      registry,
      {.contract = Contract::bit_exact(eager_chain)
                       .verified("H200 (sm_90), scripts/device_run.sh verify at cbc736f"
                                 ": torch.equal on 180 runs (10 shapes x 3 amplitude/eps x shift on/off x 3 mappings)"),
       .description = "LayerNorm + modulate compiled at first use by NVRTC for the device's exact arch" + mappings});
  add_reference<Bf16Kernels>(registry, layernorm_modulate_reference,
                             Contract::close(eager_chain, ref_bounds).verified(ref_verified),
                             "CPU reference (aten statistics order, eager rounding steps), multithreaded over rows");

  // fp8: sm_89+ for cvt e4m3x2.
  add_per_reciprocal(registry, kOpFp8, jit_implementation<Fp8Kernels>({.sm_min = 89}), [&](auto& impl, bool div_full) {
    impl.contract =
        div_full ? Contract::bit_exact("SGLang split chain: the eager bf16 result, then Triton static_quant_fp8 "
                                       "(inv = div.full.f32 1/input_scale)")
                       .unverified("no device run compared it with SGLang's Triton quantizer; on the H200 fp8 grid "
                                   "its bytes equalled the ieee mode's and the eager chain's (docs/layernorm_modulate.md)")
                 : Contract::bit_exact(eager_chain + ", then (y.float() * (1.0 / input_scale)).clamp(-448, 448)"
                                                     ".to(torch.float8_e4m3fn)")
                       .verified("H200 (sm_90), scripts/device_run.sh verify at cbc736f"
                                 ": torch.equal on the fp8 grid (rows {1,127,512} x 5 scales)");
    impl.description = div_full ? "as layernorm_modulate_fp8.jit with fp8_reciprocal=div_full (SGLang's quantizer)" +
                                      mappings
                                : "LayerNorm + modulate + static e4m3 quantization in one pass (no bf16 "
                                  "intermediate), inv = IEEE 1/input_scale as eager computes it" + mappings;
  });
  add_reference<Fp8Kernels>(registry, layernorm_modulate_reference,
                            Contract::close(eager_chain + ", then static e4m3 quantization",
                                            ref_bounds + "; the e4m3 byte may then differ by one code; div_full "
                                            "is evaluated as an IEEE division")
                                .verified(ref_verified),
                            "CPU reference: the bf16 chain, then exact e4m3 RNE of clamp(y * (1/input_scale))");

  const std::string rowwise_chain =
      eager_chain + ", then ditops.eager.fp8_rowwise_eager (torchao 0.18's float8 rowwise recipe: amax / 448.0 in "
                    "bf16, 1 for a zero scale, (y.float() / s).clamp(-448, 448).to(torch.float8_e4m3fn))";
  add_jit<RowwiseKernels>(
      registry,
      {.sm_min = 89,
       .contract = Contract::bit_exact(rowwise_chain)
                       .verified("H200 (sm_90), scripts/device_run.sh verify at bf0f87e: torch.equal (e4m3 bytes and scales) in 96 of 96 "
                                 "cases of bench/layernorm_modulate_fp8_rowwise_torch.py and in graph replay"),
       .description = "LayerNorm + modulate + per-token dynamic e4m3 in one pass: the bf16 row held in registers, "
                      "its amax reduced over the row's threads, then quantized (no bf16 intermediate)" + mappings});
  add_reference<RowwiseKernels>(
      registry, layernorm_modulate_reference,
      Contract::close(rowwise_chain, ref_bounds + "; an e4m3 byte may then differ by one code, and the "
                                                  "row's scale by one bf16 ulp where its amax moved")
          .verified("on every CI run (CPU) by the op's tests"),
      "CPU reference: the bf16 chain, then the rowwise recipe (reference/fp8_rowwise.h)");

  add_jit<QkKernels>(
      registry,
      {.contract = Contract::bit_exact("PyTorch 2.11 eager nn.LayerNorm(head_dim, elementwise_affine=False) on "
                                       "CUDA, applied to q and k")
                       .verified("H200 (sm_90), scripts/device_run.sh verify at cbc736f: torch.equal on "
                                 "the qk-head shapes"),
       .description = "per-head LayerNorm of q and k in one launch, one warp per head, 4 heads per warp"});
  add_reference<QkKernels>(registry, layernorm_modulate_reference,
                           Contract::close("PyTorch 2.11 eager nn.LayerNorm(head_dim) on CUDA",
                                           "rstd correctly rounded (<= 2 fp32 ulp from MUFU.RSQ): elements may "
                                           "differ by 1 bf16 ulp")
                               .verified(ref_verified),
                           "CPU reference of the per-head LayerNorm (aten statistics order)");
}

DITOPS_REGISTER_OP(register_layernorm_modulate);

// The primitives' self-check kernel (tests): the request is public so the GPU test can build it.
KernelRequest aten_ln_selfcheck_request() {
  KernelRequest r;
  r.header = "layernorm_modulate.cuh";
  r.function = "ditops::aten_ln_selfcheck_body";
  r.template_args = std::string(1, '0');  // (assigning the literal "0" trips GCC 12's bogus -Wrestrict)
  r.params_type = "ditops::AtenLnSelfcheckParams";
  r.max_threads = 256;
  r.template_key = "layernorm_modulate:selfcheck";
  return r;
}

// Every template key the op can request (for the compile test): both mappings over every
// bucket, even/uneven rows, shift on/off, bf16/fp8 x reciprocal, PDL, alignment.
std::vector<KernelRequest> layernorm_modulate_all_requests() {
  std::vector<KernelRequest> out;
  for (int slots : {1, 2, 3, 4, 6, 8, 10, 12, 16, 20, 24, 28, 32, 40, 48, 64})
    for (bool cta : {false, true})
      for (int variant = 0; variant < 3; ++variant)
        for (bool shift : {false, true})
          for (bool even : {false, true}) {
            LnmKey key;
            key.slots = slots;
            key.cta = cta;
            key.even = even;
            key.prefetch = cta && slots <= kPrefetchMaxSlots;
            key.kind = variant == 0 ? LnModulateKind::bf16_out : LnModulateKind::fp8_out;
            key.div_full = variant == 2;
            key.shift = shift;
            out.push_back(request_for(key));
          }
  for (bool pdl : {false, true})
    for (bool aligned : {false, true}) {
      LnmKey key;
      key.slots = 24;
      key.pdl = pdl;
      key.aligned = aligned;
      out.push_back(request_for(key));
      key.kind = LnModulateKind::qk_head;
      out.push_back(request_for(key));
      key.head128 = true;
      out.push_back(request_for(key));
    }
  return out;
}

}  // namespace ditops
