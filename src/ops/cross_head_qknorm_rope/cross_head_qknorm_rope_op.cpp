// cross_head_qknorm_rope: argument matching, the kernel key, its request and launch, the registry
// entries (the jit kernel, the CPU reference) and the op's description.
#include <algorithm>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "core/enum_name.h"
#include "core/builtin_ops.h"
#include "core/implementation.h"
#include "core/matcher.h"
#include "core/op_builder.h"
#include "ditops/cross_head_qknorm_rope.h"
#include "jit/cuda_driver.h"
#include "jit/jit.h"
#include "jit/kernel_family.h"
#include "kernels/cross_head_qknorm_rope.cuh"

namespace ditops {

const char* cross_head_rope_name(CrossHeadRope rope) { return enumerator_name(rope); }

namespace {

constexpr const char* kOp = "cross_head_qknorm_rope";
constexpr int64_t kMaxWidth = int64_t{4} * kCrossHeadThreads * kCrossHeadMaxVectors;  // 8192

// Whether some row of q and some row of k share an element. Views of one packed projection
// (Wan's fused to_qkv: q, k, v chunks of each token's row) interleave in memory without sharing
// one, so a byte-range test is not enough: with one row stride R for both, q row i starts at i*R
// and k row j at delta + j*R, and they meet iff delta + (j - i)*R lies in (-Nk, Nq).
bool q_k_share_elements(const TensorView& q, const TensorView& k, int64_t B, int64_t S, int64_t Sk, int64_t Nq,
                        int64_t Nk) {
  if (!memory_overlaps(q, k)) return false;
  const int64_t R = q.strides[1];
  const bool uniform = R > 0 && k.strides[1] == R && (B == 1 || (q.strides[0] == S * R && k.strides[0] == Sk * R));
  const int64_t es = static_cast<int64_t>(dtype_size(q.dtype));
  const __int128 gap = static_cast<__int128>(reinterpret_cast<uintptr_t>(k.data)) -
                       static_cast<__int128>(reinterpret_cast<uintptr_t>(q.data));
  if (!uniform || gap % es != 0) return true;  // conservative
  const int64_t delta = static_cast<int64_t>(gap / es);  // within the views' spans: fits
  auto floor_div = [](int64_t a, int64_t b) { return a / b - ((a % b != 0) && ((a < 0) != (b < 0))); };
  const int64_t m_lo = std::max(floor_div(-Nk - delta, R) + 1, -(B * S - 1));
  const int64_t m_hi = std::min(-floor_div(-(Nq - delta), R) - 1, B * Sk - 1);  // ceil((Nq - delta) / R) - 1
  return m_lo <= m_hi;
}

// A cos or sin table [Bc, S, Hc, D/2] fp32 with Bc in {1, B} and Hc in {1, H}: its strides, a
// broadcast dim's as 0.
void match_table(Matcher& m, const TensorView& t, const char* name, int64_t B, int64_t S, int64_t H, int64_t half,
                 int64_t strides[4]) {
  m.tensor(name, t).rank(4);
  const int64_t want[4] = {B, S, H, half};
  const char* what[4] = {"the batch (1 or B)", "the tokens (S)", "the heads (1 or H)", "head_dim / 2"};
  for (int d = 0; d < 4; ++d) {
    const bool broadcast_ok = d == 0 || d == 2;
    if (t.shape[d] != want[d] && !(broadcast_ok && t.shape[d] == 1))
      m.fail(std::string(name) + ".shape[" + std::to_string(d) + "] must be " + std::to_string(want[d]) +
             (broadcast_ok ? " or 1" : "") + " (" + what[d] + ") but is " + std::to_string(t.shape[d]) + " (" +
             t.describe() + ")");
    strides[d] = t.shape[d] == 1 ? 0 : t.strides[d];
  }
}

void complete(CrossHeadQkNormRopeCall& call, Matcher& m);  // the op's own rules, after the slots'

// The op described once: its slots state the checks every call gets (core/op_builder.h).
OpBuilder<CrossHeadQkNormRopeCall> describe() {
  using C = CrossHeadQkNormRopeCall;
  OpBuilder<C> b(
      kOp, "in-place QK RMSNorm across all heads + per-head RoPE (Wan, LTX-2)",
      "q [B, S, Nq], k [B, Sk, Nk] written in place (last stride 1; N = heads * head_dim <= 8192); weights [N] or "
      "none; cos/sin [1|B, S, 1|H, head_dim/2] fp32 views (k's default to q's). "
      "include/ditops/cross_head_qknorm_rope.h, docs/cross_head_qknorm_rope.md");
  b.dims("B=1,S=32760,Nq=5120,Sk=S,Nk=Nq,Hq=Nq/128,Hk=Nk/128,R=64");
  b.tensor<&C::q>({.role = TensorRole::inout, .dtypes = "bf16|f16", .shape = "B,S,Nq", .layout = "*,*,1"});
  b.tensor<&C::k>({.role = TensorRole::inout, .dtypes = "=q", .shape = "B,Sk,Nk", .layout = "*,*,1"});
  b.tensor<&C::q_weight>({.optional = true, .dtypes = "=q", .shape = "Nq", .layout = "1"});
  b.tensor<&C::k_weight>({.optional = true, .dtypes = "=q", .shape = "Nk", .layout = "1"});
  // The tables broadcast over the batch and the heads and k may take q's: their extents are the
  // op's own rules (match_table).
  b.tensor<&C::q_cos>({.optional = true, .dtypes = "f32", .shape = "B,S,Hq,R", .own = "shape"});
  b.tensor<&C::q_sin>({.optional = true, .dtypes = "f32", .shape = "B,S,Hq,R", .own = "shape"});
  b.tensor<&C::k_cos>({.optional = true, .dtypes = "f32", .shape = "B,Sk,Hk,R", .own = "shape"});
  b.tensor<&C::k_sin>({.optional = true, .dtypes = "f32", .shape = "B,Sk,Hk,R", .own = "shape"});
  b.option<&CrossHeadQkNormRopeOptions::head_dim>("channels per head (RoPE rotates within a head)");
  b.option<&CrossHeadQkNormRopeOptions::eps>("RMSNorm epsilon");
  b.choice<&CrossHeadQkNormRopeOptions::rope>(
      {CrossHeadRope::interleaved, CrossHeadRope::split, CrossHeadRope::none},
      "interleaved pairs (Wan), split halves (LTX-2), or no rotation (cross-attention text keys)");
  b.choice<&CrossHeadQkNormRopeOptions::rounding>(
      {QkRounding::rounded, QkRounding::fp32},
      "rounded: the norm rounded before RoPE, bit_exact vs the eager chain; fp32: close");
  b.pdl_option<&CrossHeadQkNormRopeOptions::use_pdl>();
  b.complete(complete);
  return b;
}

void complete(CrossHeadQkNormRopeCall& call, Matcher& m) {
  const CrossHeadQkNormRopeOptions& options = call.options;
  const int64_t D = options.head_dim;
  if (D < 8 || D > 512 || D % 8 != 0)
    m.fail("head_dim must be a multiple of 8 in [8, 512] (a 4-element vector lies inside one half of a head) but is " +
           std::to_string(D));
  const int64_t B = *m.value("B"), S = *m.value("S"), Sk = *m.value("Sk");
  const int64_t Nq = *m.value("Nq"), Nk = *m.value("Nk");
  for (const auto& [name, N] : {std::pair<const char*, int64_t>{"q", Nq}, {"k", Nk}}) {
    if (N <= 0 || N % D != 0 || N > kMaxWidth)
      m.fail(std::string(name) + ".shape[2] (heads * head_dim) must be a positive multiple of head_dim=" +
             std::to_string(D) + " up to " + std::to_string(kMaxWidth) + " but is " + std::to_string(N));
  }
  const bool has_q_weight = !slot_absent(call.q_weight), has_k_weight = !slot_absent(call.k_weight);
  if (!(options.eps >= 0.0f)) m.fail("eps must be >= 0 but is " + std::to_string(options.eps));

  auto given = [](const TensorView& t) { return !slot_absent(t); };
  call.q_rows = {B, S, Nq, Nq / D, call.q.strides[0], call.q.strides[1]};
  call.k_rows = {B, Sk, Nk, Nk / D, call.k.strides[0], call.k.strides[1]};
  if (options.rope == CrossHeadRope::none) {
    for (const auto& [t, name] : {std::pair<const TensorView*, const char*>{&call.q_cos, "q_cos"},
                                  {&call.q_sin, "q_sin"}, {&call.k_cos, "k_cos"}, {&call.k_sin, "k_sin"}})
      if (given(*t)) m.fail(std::string("rope=none takes no cos/sin tables but ") + name + " is given");
  } else {
    if (!given(call.q_cos) || !given(call.q_sin))
      m.fail(std::string("rope=") + cross_head_rope_name(options.rope) + " needs q_cos and q_sin");
    if (given(call.k_cos) != given(call.k_sin)) m.fail("k_cos and k_sin are given together or not at all");
    match_table(m, call.q_cos, "q_cos", B, S, Nq / D, D / 2, call.q_rows.cos_strides);
    match_table(m, call.q_sin, "q_sin", B, S, Nq / D, D / 2, call.q_rows.sin_strides);
    const bool own_k = given(call.k_cos);
    if (!own_k && Sk != S)
      m.fail("k has " + std::to_string(Sk) + " tokens and q " + std::to_string(S) +
             ": without k_cos/k_sin k takes q's tables, which need equal token counts");
    match_table(m, own_k ? call.k_cos : call.q_cos, own_k ? "k_cos" : "q_cos (for k)", B, Sk, Nk / D, D / 2,
                call.k_rows.cos_strides);
    match_table(m, own_k ? call.k_sin : call.q_sin, own_k ? "k_sin" : "q_sin (for k)", B, Sk, Nk / D, D / 2,
                call.k_rows.sin_strides);
    call.q_rows.cos = static_cast<const float*>(call.q_cos.data);
    call.q_rows.sin = static_cast<const float*>(call.q_sin.data);
    call.k_rows.cos = static_cast<const float*>(own_k ? call.k_cos.data : call.q_cos.data);
    call.k_rows.sin = static_cast<const float*>(own_k ? call.k_sin.data : call.q_sin.data);
  }

  // In place: rows may not overlap, q and k may not share an element, and nothing read may
  // overlap what is written.
  for (const auto& [t, name, rows] : {std::tuple<const TensorView*, const char*, int64_t>{&call.q, "q", B * S},
                                      {&call.k, "k", B * Sk}}) {
    if (rows > 1) m.require_nonnegative_strides(*t, name);
    m.require_disjoint_rows(*t, name, t->shape[2]);
  }
  if (B * S > 0 && B * Sk > 0 && q_k_share_elements(call.q, call.k, B, S, Sk, Nq, Nk))
    m.fail("q and k overlap in memory (both are written): they must be disjoint views, e.g. the q and k parts of "
           "one packed QKV projection");
  if (!has_q_weight) call.q_weight = TensorView{};
  if (!has_k_weight) call.k_weight = TensorView{};
  // 4-element (8-byte) loads of rows and weights: row starts and row strides in whole vectors.
  auto rows_aligned = [](const TensorView& t) {
    return is_aligned(t.data, 8) && t.strides[0] % 4 == 0 && t.strides[1] % 4 == 0;
  };
  call.aligned8 = rows_aligned(call.q) && rows_aligned(call.k) &&
                  (!has_q_weight || is_aligned(call.q_weight.data, 8)) &&
                  (!has_k_weight || is_aligned(call.k_weight.data, 8));
}

// The template key: exactly the kernel's template parameters.
struct CrossHeadKey {
  DType dtype = DType::bf16;
  CrossHeadRope rope = CrossHeadRope::interleaved;
  bool rounded = true;
  int vectors = 1;  // 4-element vectors per thread: ceil(max(Nq, Nk) / 512)
  int head_dim = 128;
  int table = kTableScalar;  // how cos/sin are read (kernels/cross_head_qknorm_rope.cuh)
  bool pdl = true;

  // "bf16,interleaved,rounded,v10,d128,hoisted,pdl"
  std::string to_string() const {
    static const char* tables[] = {"scalar", "vector", "hoisted"};
    return std::string(dtype_name(dtype)) + "," + cross_head_rope_name(rope) + (rounded ? ",rounded" : ",fp32") +
           ",v" + std::to_string(vectors) + ",d" + std::to_string(head_dim) + "," + tables[table] +
           (pdl ? ",pdl" : ",nopdl");
  }
  uint64_t packed() const {
    return pack_key({dtype, {rope, 4}, rounded, {vectors, 32}, {head_dim, 1024}, {table, 3}, pdl});
  }
};

// The fastest way the kernel may read both tensors' tables (every table read the same way).
int table_access(const CrossHeadQkNormRopeCall& c) {
  if (c.options.rope == CrossHeadRope::none) return kTableScalar;
  const CrossHeadRows* rows[] = {&c.q_rows, &c.k_rows};
  const int64_t D = c.options.head_dim;
  bool hoisted = (4 * kCrossHeadThreads) % D == 0, vector = true;
  const int64_t values = c.options.rope == CrossHeadRope::split ? 4 : 2;  // per vector, 4 bytes each
  for (const CrossHeadRows* r : rows)
    for (const auto& [table, strides] : {std::pair<const float*, const int64_t*>{r->cos, r->cos_strides},
                                         {r->sin, r->sin_strides}}) {
      hoisted = hoisted && strides[2] == 0;
      vector = vector && strides[3] == 1 && reinterpret_cast<uintptr_t>(table) % (4 * values) == 0 &&
               strides[0] % values == 0 && strides[1] % values == 0 && strides[2] % values == 0;
    }
  return hoisted ? kTableHoisted : vector ? kTableVector : kTableScalar;
}

int vectors_per_thread(int64_t width) {
  const int64_t per_pass = 4 * kCrossHeadThreads;
  return static_cast<int>(std::max<int64_t>(1, (width + per_pass - 1) / per_pass));
}

CrossHeadKey key_for(const CrossHeadQkNormRopeCall& c, const DeviceInfo& device) {
  CrossHeadKey key;
  key.dtype = c.q.dtype;
  key.rope = c.options.rope;
  key.rounded = c.options.rounding == QkRounding::rounded;
  key.vectors = vectors_per_thread(std::max(c.q_rows.width, c.k_rows.width));
  key.head_dim = c.options.head_dim;
  key.table = table_access(c);
  key.pdl = c.options.use_pdl && (device.features & kFeaturePdl);
  return key;
}

KernelRequest request_for(const CrossHeadKey& key) {
  return {.header = "cross_head_qknorm_rope.cuh",
          .function = "ditops::cross_head_qknorm_rope_body",
          .template_args = jit::kernel_args(key.dtype, static_cast<int>(key.rope), key.rounded, key.vectors,
                                            key.head_dim, key.table, key.pdl),
          .params_type = "ditops::CrossHeadQkNormRopeParams",
          .max_threads = kCrossHeadThreads,
          .template_key = std::string(kOp) + ":" + key.to_string()};
}

CrossHeadRowParams row_params(const TensorView& x, const TensorView& weight, const CrossHeadRows& r) {
  CrossHeadRowParams p{};
  p.x = x.data;
  p.weight = weight.data;
  p.cos = r.cos;
  p.sin = r.sin;
  p.batch_stride = r.batch_stride;
  p.token_stride = r.token_stride;
  for (int d = 0; d < 4; ++d) {
    p.cos_strides[d] = r.cos_strides[d];
    p.sin_strides[d] = r.sin_strides[d];
  }
  p.tokens = std::max<int64_t>(r.tokens, 1);
  p.rows = r.rows();
  p.width = static_cast<int>(r.width);
  return p;
}

void cross_head_launch(const CrossHeadQkNormRopeCall& c, const CrossHeadKey& key, const jit::LoadedKernel& kernel) {
  CrossHeadQkNormRopeParams p{};
  p.q = row_params(c.q, c.q_weight, c.q_rows);
  p.k = row_params(c.k, c.k_weight, c.k_rows);
  p.eps = c.options.eps;
  p.interleave = p.q.rows == p.k.rows ? 1 : 0;
  const int64_t blocks = p.q.rows + p.k.rows;
  jit::launch(kernel, static_cast<unsigned>(blocks), kCrossHeadThreads, &p, sizeof p, static_cast<CUstream>(c.stream),
              key.pdl);
}

// What no kernel computes (the CPU reference takes CPU calls).
std::string kernel_refusal(const CrossHeadQkNormRopeCall& c) {
  if (!c.aligned8)
    return "a row start, row stride or weight is not 8-byte aligned (the kernel loads 4-element vectors, as "
           "PyTorch's fused RMSNorm row kernel does)";
  if (c.q_rows.rows() + c.k_rows.rows() > int64_t{0x7fffffff}) return "more than 2^31 - 1 rows (one block per row)";
  return "";
}

// Every code path: each rope form in both roundings with every table access, fp16, one and
// sixteen vectors per thread, head_dim 64 / 128 / 256, without PDL.
std::vector<CrossHeadKey> cross_head_variant_keys() {
  std::vector<CrossHeadKey> keys;
  for (CrossHeadRope rope : {CrossHeadRope::none, CrossHeadRope::interleaved, CrossHeadRope::split})
    for (bool rounded : {true, false})
      for (int table : {kTableScalar, kTableVector, kTableHoisted}) {
        if (rope == CrossHeadRope::none && table != kTableScalar) continue;
        CrossHeadKey k;
        k.rope = rope;
        k.rounded = rounded;
        k.vectors = 10;
        k.table = table;
        keys.push_back(k);
      }
  CrossHeadKey f16;
  f16.dtype = DType::f16;
  f16.rope = CrossHeadRope::split;
  f16.vectors = 16;
  f16.head_dim = 64;
  keys.push_back(f16);
  CrossHeadKey one;
  one.vectors = 1;
  one.head_dim = 256;
  one.pdl = false;
  keys.push_back(one);
  return keys;
}

constexpr KernelFunctions<CrossHeadQkNormRopeCall, CrossHeadKey> kKernels{
    .key = key_for, .request = request_for, .launch = cross_head_launch,
    .nothing_to_do = [](const CrossHeadQkNormRopeCall& c) { return c.q_rows.rows() + c.k_rows.rows() == 0; },
    .refusal = kernel_refusal,
    .variant_keys = cross_head_variant_keys,
    .extra_signature = [](const CrossHeadQkNormRopeCall& c) -> uint64_t { return c.aligned8; },  // the table access: in the key
    .extra_radix = 2};
using Kernels = OpKernels<describe, kKernels>;

void register_cross_head_qknorm_rope(Registry& registry) {
  const std::string eager =
      "eager PyTorch 2.11 on CUDA: torch.nn.RMSNorm(N) (F.rms_norm's fused row kernel: rows 8-byte aligned, "
      "N % 4 == 0, weight in x's dtype or none), then the model's RoPE in fp32 from fp32 cos/sin (Wan's "
      "x1*cos - x2*sin / x1*sin + x2*cos, LTX-2's split addcmul) with one rounding to x's dtype";
  add_jit<Kernels>(
      registry,
      {.contract = Contract::bit_exact(eager + " (rounding=rounded); rounding=fp32: close, the norm unrounded "
                                               "before RoPE, within 1 ulp of the activation dtype of that chain")
                       .verified("H200 (sm_90) at 64c434f: torch.equal at 15 Wan / LTX-2 model shapes of "
                                 "bench/cross_head_qknorm_rope_torch.py (bench/results/h200/checks/"
                                 "cross_head_qknorm_rope_checks.json), every case of tests/python/test_ops_eager.py, and "
                                 "the Wan and LTX-2 sites of ditops.diffusers; sm_100a / sm_120a compiled, not run"),
       .description =
           "one 128-thread block per row in PyTorch's RMSNorm row order (8-byte loads, the thread's vectors t + 128 i), "
           "RoPE per head from strided cos/sin views; q and k rows interleaved when their counts match; NVRTC at first "
           "use"});
  add_reference<Kernels>(
      registry, cross_head_qknorm_rope_reference,
      Contract::close(eager, "the chain's order exactly, with rstd correctly rounded (the GPU's rsqrtf may differ "
                             "by 1 fp32 ulp): outputs within 1 ulp of the activation dtype, on a small fraction")
          .verified("on every CI run (CPU) against float64 math (tests/python/test_cross_head_qknorm_rope.py); on "
                    "the H200 every CUDA implementation matched it within each case's bound (the op test driver, "
                    "at ee9c29e)"),
      "CPU reference: PyTorch's RMSNorm row order emulated (128 virtual threads, warp trees), compiled without "
      "FP contraction");
}

}  // namespace

DITOPS_OP_ENTRIES(cross_head_qknorm_rope, Kernels, register_cross_head_qknorm_rope);

}  // namespace ditops
