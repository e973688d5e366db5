// joint_qknorm_rope's cases: FLUX.1 (24 x 128) and FLUX.2-dev (48 x 128) dual-stream blocks at
// 512 + 4096 tokens (device only) and scaled down, separate and fused (packed) QKV projections,
// batch 2 with a gap between batches, heads that leave a unit part empty (3, 5), head dims 64 and
// 256, one stream empty, fp16 with an fp16 cache, every option qknorm_rope has (NeoX, partial
// rotary, compact and full-width caches, fp32 rounding, diffusers' RMSNorm, Qwen-Image's complex
// product), misaligned views, the layouts of one logical input told equal, empty, aliased and
// invalid calls.
//
// Two oracles, written without the reference's code: v copied bit for bit into its joint row; q
// and k in float64 (each stream's norm with its own weights, the rotation by the joint row's
// cache row) within the rounding bound qknorm_rope's float64 oracle derives.
#include <cmath>
#include <string>
#include <vector>

#include "op_test_driver.h"

namespace ditops::optest {
namespace {

struct Joint {
  int64_t B = 1, S1 = 16, S2 = 48, H = 24, D = 128, R = 128;
  bool neox = false, full_width = true;  // FLUX: interleaved pairs, per-channel cos/sin
  DType act = DType::bf16, cache = DType::f32, pos = DType::i64;
  bool packed = false;        // q, k, v of each stream: thirds of one [B, S, 3 H D] projection's rows
  int64_t row_padding = 0;    // elements after each token row (separate tensors or packed)
  int64_t batch_gap = 0;      // elements between batches
  int64_t misalign = 0;       // elements q1's and k2's buffers are moved off 16-byte alignment
  bool spread_weights = false;  // weights 1 + 0.5 N(0,1) instead of 0.5 + |N(0,1)|
  const char* rounding = "rounded";
  const char* order = "aten";
  const char* weight_rounding = "once";
  const char* rope_product = "real";
};

std::vector<TensorCase> stream(const Joint& s, int which) {
  const int64_t S = which == 1 ? s.S1 : s.S2, HD = s.H * s.D;
  const std::string n = std::to_string(which);
  const int64_t row = (s.packed ? 3 * HD : HD) + s.row_padding, batch = S * row + s.batch_gap;
  std::vector<TensorCase> t;
  for (int kind = 0; kind < 3; ++kind) {
    TensorCase x{std::string("qkv").substr(kind, 1) + n, s.act, {s.B, S, s.H, s.D}, {batch, row, s.D, 1}};
    if (s.packed && kind > 0) {
      x.storage = "q" + n;
      x.offset = kind * HD;
    }
    x.fill = Fill::normal();
    t.push_back(x);
  }
  if (s.misalign) (which == 1 ? t[0] : t[1]).offset += s.misalign;
  if (s.misalign && s.packed && which == 1) t[1].offset += s.misalign, t[2].offset += s.misalign;
  return t;
}

OpCase joint_case(const Joint& s, CaseKind kind, const std::string& label) {
  const int64_t J = s.S1 + s.S2, P = 2 * J + 8, width = s.full_width ? 2 * s.R : s.R;
  OpCase c{.op = "joint_qknorm_rope", .kind = kind};
  c.name = label + "_B" + std::to_string(s.B) + "_S" + std::to_string(s.S1) + "+" + std::to_string(s.S2) + "_H" +
           std::to_string(s.H) + "_D" + std::to_string(s.D) + "_R" + std::to_string(s.R) + (s.neox ? "_neox" : "") +
           (s.full_width ? "_full" : "_compact") + "_" + dtype_name(s.act) + "_cache_" + dtype_name(s.cache) +
           "_pos_" + dtype_name(s.pos) + (s.packed ? "_packed" : "") +
           (s.row_padding ? "_pad" + std::to_string(s.row_padding) : "") +
           (s.batch_gap ? "_gap" + std::to_string(s.batch_gap) : "") + (s.misalign ? "_misaligned" : "") +
           (s.spread_weights ? "_spread" : "") + "_" + s.rounding + "_" + s.order + "_" + s.weight_rounding + "_" +
           s.rope_product;
  c.seed = static_cast<uint32_t>(J * 131 + s.H * 7 + s.D + s.B);
  for (int which : {1, 2})
    for (const TensorCase& t : stream(s, which)) c.tensors.push_back(t);
  for (const char* name : {"q1_weight", "k1_weight", "q2_weight", "k2_weight"}) {
    TensorCase w{name, s.act, {s.D}};
    w.fill = s.spread_weights ? Fill::normal(0.5, 2.0) : Fill::positive(0.5);
    c.tensors.push_back(w);
  }
  TensorCase cache{"cos_sin_cache", s.cache, {P, width}};
  cache.fill = Fill::wave();
  TensorCase positions{"positions", s.pos, {J}};
  positions.fill = Fill::index(P);
  c.tensors.push_back(cache);
  c.tensors.push_back(positions);
  c.options = {{"is_neox", s.neox ? "true" : "false"}, {"rope_dim", std::to_string(s.R)},
               {"cache_full_width", s.full_width ? "true" : "false"}, {"rounding", s.rounding},
               {"norm_order", s.order}, {"norm_weight_rounding", s.weight_rounding}, {"rope_product", s.rope_product}};
  // qknorm_rope's tolerance against its reference (the reference's rsqrt is correctly rounded, the
  // GPU's is rsqrtf: a factor's last bit moves an output by an ulp or two); v is a copy.
  c.tolerance = {2, 4.0, 0.1, 64};
  c.tolerance_for = {{"v", Tolerance{}}};
  c.large = s.B * J * s.H * s.D * 3 > (1 << 20);
  return c;
}

std::vector<OpCase> make() {
  std::vector<OpCase> out;
  // FLUX.1 and FLUX.2-dev double blocks at 512 text + 4096 image tokens (device only), separate
  // and fused projections, and scaled down.
  for (int64_t H : {24, 48}) {
    const std::string model = H == 24 ? "flux1" : "flux2";
    Joint full;
    full.S1 = 512, full.S2 = 4096, full.H = H;
    out.push_back(joint_case(full, CaseKind::model, model));
    full.packed = true;
    out.push_back(joint_case(full, CaseKind::view, model + "_fused_qkv"));
    Joint small;
    small.H = H;
    small.S1 = 8, small.S2 = H == 24 ? 40 : 24;
    out.push_back(joint_case(small, CaseKind::model, model + "_small"));
    small.packed = true;
    out.push_back(joint_case(small, CaseKind::view, model + "_small_fused_qkv"));
    small.B = 2;
    small.batch_gap = 64;
    out.push_back(joint_case(small, CaseKind::strided, model + "_small_batch2"));
  }
  // Odd shapes: heads that leave part of a unit empty, head dims 64 and 256, one token, one
  // stream empty, padded rows.
  {
    Joint odd;
    odd.S1 = 3, odd.S2 = 7, odd.H = 3;
    out.push_back(joint_case(odd, CaseKind::odd, "odd_heads"));
    odd.D = odd.R = 64, odd.H = 5, odd.B = 2;
    out.push_back(joint_case(odd, CaseKind::odd, "odd_d64"));
    odd.D = odd.R = 256, odd.H = 3, odd.B = 1;
    out.push_back(joint_case(odd, CaseKind::odd, "odd_d256"));
    Joint one;
    one.S1 = 1, one.S2 = 1, one.H = 2;
    out.push_back(joint_case(one, CaseKind::odd, "one_token_each"));
    one.S1 = 0, one.S2 = 9;
    out.push_back(joint_case(one, CaseKind::odd, "no_first_stream"));
    one.S1 = 9, one.S2 = 0;
    out.push_back(joint_case(one, CaseKind::odd, "no_second_stream"));
    Joint padded;
    padded.S1 = 5, padded.S2 = 11, padded.H = 6, padded.row_padding = 24;
    out.push_back(joint_case(padded, CaseKind::strided, "padded"));
    padded.packed = true, padded.row_padding = 8;
    out.push_back(joint_case(padded, CaseKind::view, "padded"));
  }
  // qknorm_rope's options: dtypes, NeoX, partial rotary, compact caches, fp32 rounding, diffusers'
  // RMSNorm (aten_mean, twice) with FLUX's and Qwen-Image's RoPE, int32 positions.
  {
    Joint f16;
    f16.S1 = 6, f16.S2 = 10, f16.H = 4, f16.act = f16.cache = DType::f16, f16.pos = DType::i32;
    out.push_back(joint_case(f16, CaseKind::odd, "f16"));
    Joint neox;
    neox.S1 = 6, neox.S2 = 10, neox.H = 4, neox.neox = true, neox.full_width = false, neox.R = 64;
    out.push_back(joint_case(neox, CaseKind::odd, "neox_partial"));
    neox.D = 64, neox.R = 32, neox.packed = true;
    out.push_back(joint_case(neox, CaseKind::view, "neox_partial"));
    Joint interleaved_compact;
    interleaved_compact.S1 = 6, interleaved_compact.S2 = 10, interleaved_compact.H = 4;
    interleaved_compact.full_width = false, interleaved_compact.R = 96;
    out.push_back(joint_case(interleaved_compact, CaseKind::odd, "interleaved_compact"));
    for (const char* rounding : {"rounded", "fp32"}) {
      Joint flux;
      flux.S1 = 7, flux.S2 = 21, flux.H = 6, flux.rounding = rounding;
      out.push_back(joint_case(flux, CaseKind::odd, "rounding"));
    }
    Joint twice;
    twice.S1 = 7, twice.S2 = 21, twice.H = 6, twice.spread_weights = true;
    twice.order = "aten_mean", twice.weight_rounding = "twice";
    out.push_back(joint_case(twice, CaseKind::odd, "diffusers_rmsnorm"));
    twice.full_width = false, twice.rope_product = "complex";
    out.push_back(joint_case(twice, CaseKind::odd, "qwen_image"));
    twice.packed = true, twice.B = 2;
    out.push_back(joint_case(twice, CaseKind::view, "qwen_image"));
  }
  // Pointers off 16 bytes: the scalar path.
  {
    Joint m;
    m.S1 = 5, m.S2 = 9, m.H = 4, m.misalign = 1;
    out.push_back(joint_case(m, CaseKind::misaligned, "misaligned"));
    m.packed = true;
    out.push_back(joint_case(m, CaseKind::misaligned, "misaligned"));
  }
  // One logical input in three layouts writes the same bytes; diffusers' norm is not F.rms_norm's
  // on weights spread around 1.
  {
    Joint s;
    s.B = 2, s.S1 = 4, s.S2 = 12, s.H = 6, s.spread_weights = true;
    const OpCase separate = joint_case(s, CaseKind::odd, "layout");
    s.packed = true;
    OpCase packed = joint_case(s, CaseKind::view, "layout");
    packed.same_as = {separate.name};
    s.packed = false, s.row_padding = 40, s.batch_gap = 16;
    OpCase padded = joint_case(s, CaseKind::strided, "layout");
    padded.same_as = {separate.name};
    s.row_padding = s.batch_gap = 0, s.order = "aten_mean", s.weight_rounding = "twice";
    OpCase twice = joint_case(s, CaseKind::odd, "layout");
    twice.differs_from = {separate.name};
    for (const OpCase& c : {separate, packed, padded, twice}) out.push_back(c);
  }
  // Empty: no batch, no tokens: nothing written.
  {
    Joint e;
    e.B = 0;
    out.push_back(joint_case(e, CaseKind::empty, "empty_batch"));
    e.B = 1, e.S1 = e.S2 = 0;
    out.push_back(joint_case(e, CaseKind::empty, "empty_tokens"));
  }
  // Aliased: an output over an input, outputs over each other.
  {
    Joint a;
    a.S1 = 2, a.S2 = 2, a.H = 2;
    OpCase c = joint_case(a, CaseKind::aliased, "q_over_q1");
    TensorCase q{"q", DType::bf16, {1, 4, 2, 128}};
    q.storage = "q1";
    c.tensors.push_back(q);
    c.invalid = {"q1 overlaps q in memory"};
    out.push_back(c);
    c = joint_case(a, CaseKind::aliased, "k_over_q");
    TensorCase q_own{"q", DType::bf16, {1, 4, 2, 128}}, k_on_q{"k", DType::bf16, {1, 4, 2, 128}};
    k_on_q.storage = "q";
    k_on_q.offset = 256;
    c.tensors.push_back(q_own);
    c.tensors.push_back(k_on_q);
    c.invalid = {"q and k overlap in memory"};
    out.push_back(c);
  }
  // Invalid inputs: the message names the tensor, the dimension, the expected and actual value.
  {
    Joint s;
    s.S1 = 2, s.S2 = 3, s.H = 2;
    auto invalid = [&](const std::string& name, auto change, std::vector<std::string> fragments) {
      OpCase c = joint_case(s, CaseKind::invalid, name);
      change(c);
      c.invalid = std::move(fragments);
      out.push_back(c);
    };
    invalid("heads_differ", [&](OpCase& c) { c.tensor("k2").shape[2] = 3; }, {"k2.shape[2]", "H=2", "3"});
    invalid("batch_differs", [&](OpCase& c) { c.tensor("v2").shape[0] = 2; }, {"v2.shape[0]", "B=1", "2"});
    invalid("dtype_differs", [&](OpCase& c) { c.tensor("v1").dtype = DType::f16; }, {"v1", "f16", "bf16"});
    invalid("positions_not_joint", [&](OpCase& c) { c.tensor("positions").shape[0] = 3; },
            {"positions.shape[0]", "S1+S2=5", "3"});
    invalid("head_stride_differs", [&](OpCase& c) { c.tensor("k1").strides[2] = 136; }, {"k1.stride(2)", "136"});
    invalid("last_stride", [&](OpCase& c) {
      TensorCase& q = c.tensor("q2");
      q.strides = {3 * 1024, 1024, 128, 2};
    }, {"q2.stride(3) must be 1"});
    invalid("cache_width", [&](OpCase& c) { c.tensor("cos_sin_cache").shape[1] = 128; },
            {"cos_sin_cache.shape[1] must be 256", "but is 128"});
    invalid("weight_length", [&](OpCase& c) { c.tensor("k2_weight").shape[0] = 64; },
            {"k2_weight.shape[0]", "D=128", "64"});
    Joint d96 = s;
    d96.D = d96.R = 96;
    OpCase c = joint_case(d96, CaseKind::invalid, "head_dim_96");
    c.invalid = {"q1.shape[3] (head_dim) must be 64, 128 or 256 but is 96"};
    out.push_back(c);
    Joint complex_full = s;
    complex_full.rope_product = "complex";
    c = joint_case(complex_full, CaseKind::invalid, "complex_full_width");
    c.invalid = {"rope_product=complex", "cache_full_width is true"};
    out.push_back(c);
  }
  return out;
}

const CaseSet kCases("joint_qknorm_rope", make);

// The logical element of one stream's tensor (q1 ... v2) for joint row (b, j), head h, channel i.
struct Streams {
  int64_t B, S1, S2, H, D, R;
  int in[2][3];     // [stream][q, k, v]
  int weight[2][2];  // [stream][q, k]
  int out[3];
  int cache, positions;
};

Streams streams(const OracleIo& io) {
  Streams s{};
  const char* kinds = "qkv";
  for (int w = 0; w < 2; ++w)
    for (int k = 0; k < 3; ++k) s.in[w][k] = io.id(std::string(1, kinds[k]) + std::to_string(w + 1));
  for (int w = 0; w < 2; ++w)
    for (int k = 0; k < 2; ++k) s.weight[w][k] = io.id(std::string(1, kinds[k]) + std::to_string(w + 1) + "_weight");
  for (int k = 0; k < 3; ++k) s.out[k] = io.id(std::string(1, kinds[k]));
  s.cache = io.id("cos_sin_cache");
  s.positions = io.id("positions");
  const std::vector<int64_t>& q1 = io.shape(s.in[0][0]);
  s.B = q1[0], s.S1 = q1[1], s.H = q1[2], s.D = q1[3];
  s.S2 = io.shape(s.in[1][0])[1];
  s.R = static_cast<int64_t>(io.number("rope_dim"));
  return s;
}

void v_copied(OracleIo& io) {
  const Streams s = streams(io);
  const int64_t J = s.S1 + s.S2, HD = s.H * s.D;
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t j = 0; j < J; ++j) {
      const bool second = j >= s.S1;
      const int64_t t = second ? j - s.S1 : j, S = second ? s.S2 : s.S1;
      for (int64_t e = 0; e < HD; ++e)
        io.expect_bits(s.out[2], (b * J + j) * HD + e, io.bits(s.in[second][2], (b * S + t) * HD + e));
    }
}

double unit_roundoff(DType t) { return t == DType::f16 ? 0x1p-11 : 0x1p-8; }

// qknorm_rope's float64 oracle over the joint rows: rms = sqrt(mean(x^2) + eps), n = x / rms * w,
// y = n0 c -+ n1 s in double; allowed 3u (|n0 c| + |n1 s|) + 2u |y| + 1e-5 (...) + a floor for f16
// subnormals (the contract's roundings: the norm, a 16-bit cache's products, the store). A stream's
// weights swapped, a wrong joint row, position or pairing costs O(|n0 c| + |n1 s|).
void qk_float64(OracleIo& io) {
  const Streams s = streams(io);
  const bool neox = io.flag("is_neox"), full = io.flag("cache_full_width");
  const double eps = io.number("eps");
  const DType act = io.dtype(s.in[0][0]);
  const double u = unit_roundoff(act), floor = act == DType::f16 ? 3 * 0x1p-24 : 1e-30;
  const int64_t J = s.S1 + s.S2, HD = s.H * s.D, half = s.R / 2, width = full ? 2 * s.R : s.R;
  std::vector<double> x(s.D), n(s.D), cs(s.D), sn(s.D);
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t j = 0; j < J; ++j) {
      const bool second = j >= s.S1;
      const int64_t t = second ? j - s.S1 : j, S = second ? s.S2 : s.S1;
      const int64_t pos = static_cast<int64_t>(io.in(s.positions, j));
      for (int64_t ch = 0; ch < s.R; ++ch) {
        const int64_t p = neox ? ch % half : ch / 2;
        cs[ch] = io.in(s.cache, pos * width + (full ? ch : p));
        sn[ch] = io.in(s.cache, pos * width + (full ? s.R + ch : half + p));
      }
      for (int kind = 0; kind < 2; ++kind)
        for (int64_t h = 0; h < s.H; ++h) {
          double ss = 0;
          for (int64_t i = 0; i < s.D; ++i) {
            x[i] = io.in(s.in[second][kind], (b * S + t) * HD + h * s.D + i);
            ss += x[i] * x[i];
          }
          const double rms = std::sqrt(ss / static_cast<double>(s.D) + eps);
          for (int64_t i = 0; i < s.D; ++i) n[i] = x[i] / rms * io.in(s.weight[second][kind], i);
          const int64_t row = (b * J + j) * HD + h * s.D;
          for (int64_t i = 0; i < s.D; ++i) {
            double want = n[i], magnitude = std::fabs(n[i]);
            if (i < s.R) {
              const bool lead = neox ? i < half : i % 2 == 0;
              const int64_t partner = neox ? (lead ? i + half : i - half) : (lead ? i + 1 : i - 1);
              const double rotated = lead ? -n[partner] : n[partner];
              want = n[i] * cs[i] + rotated * sn[i];
              magnitude = std::fabs(n[i] * cs[i]) + std::fabs(rotated * sn[i]);
            }
            io.expect(s.out[kind], row + i, want, 3 * u * magnitude + 2 * u * std::fabs(want) + 1e-5 * magnitude + floor);
          }
        }
    }
}

const OracleSet kCopy("joint_qknorm_rope", {"v copied bit for bit into its joint row", v_copied});
const OracleSet kFloat64("joint_qknorm_rope", {"q, k in float64 per stream, within the contract's rounding bound",
                                               qk_float64});

}  // namespace
}  // namespace ditops::optest
