// qknorm_rope's cases: the GPU grid (head dims, partial rotary, NeoX, GQA, packed QKV, cache and
// position dtypes), in both rounding modes and norm orders, diffusers' RMSNorm chain (aten_mean
// order, weight rounding twice), plus empty, strided, misaligned, aliased and invalid calls.
#include "op_test_driver.h"

namespace ditops::optest {
namespace {

struct Qk {
  int64_t T;
  int64_t Hq, Hk, D, R;
  bool neox = false, full_width = false;
  DType act = DType::bf16, cache = DType::f32, pos = DType::i64;
  bool packed = false;      // q and k are views of one [T, (Hq + 2 Hk) D] QKV projection
  int64_t row_padding = 0;  // elements after each token's heads (a strided token row)
  int64_t misalign = 0;     // elements q's buffer is moved off its alignment
  bool spread_weights = false;  // weights 1 + 0.5 N(0,1) (some negative) instead of 0.5 + |N(0,1)|
};

OpCase qk_case(const Qk& s, const char* rounding, const char* order, CaseKind kind,
               const char* weight_rounding = "once") {
  const int64_t P = 2 * s.T + 8, width = s.full_width ? 2 * s.R : s.R;
  OpCase c;
  c.op = "qknorm_rope";
  c.kind = kind;
  c.name = "T" + std::to_string(s.T) + "_Hq" + std::to_string(s.Hq) + "_Hk" + std::to_string(s.Hk) + "_D" +
           std::to_string(s.D) + "_R" + std::to_string(s.R) + (s.neox ? "_neox" : "") + (s.full_width ? "_full" : "") +
           "_" + dtype_name(s.act) + "_cache_" + dtype_name(s.cache) + "_pos_" + dtype_name(s.pos) +
           (s.packed ? "_packed" : "") + (s.row_padding ? "_padded" : "") + (s.misalign ? "_misaligned" : "") + "_" +
           rounding + "_" + order + (std::string(weight_rounding) == "once" ? "" : std::string("_") + weight_rounding) +
           (s.spread_weights ? "_spread_weights" : "");
  c.seed = static_cast<uint32_t>(s.T * 131 + s.D + s.R + s.neox);
  const int64_t row = s.packed ? (s.Hq + 2 * s.Hk) * s.D : s.Hq * s.D + s.row_padding;
  TensorCase q{"q", s.act, {s.T, s.Hq, s.D}, {row, s.D, 1}};
  q.offset = s.misalign;
  TensorCase k{"k", s.act, {s.T, s.Hk, s.D}};
  if (s.packed) {
    k.strides = {row, s.D, 1};
    k.storage = "q";
    k.offset = s.misalign + s.Hq * s.D;
  } else if (s.row_padding) {
    k.strides = {s.Hk * s.D + s.row_padding, s.D, 1};
  }
  TensorCase wq{"q_weight", s.act, {s.D}}, wk{"k_weight", s.act, {s.D}};
  wq.fill = wk.fill = s.spread_weights ? Fill::normal(0.5, 2.0) : Fill::positive(0.5);
  TensorCase cache{"cos_sin_cache", s.cache, {P, width}};
  cache.fill = Fill::wave();
  TensorCase pos{"positions", s.pos, {s.T}};
  pos.fill = Fill::index(P);
  c.tensors = {q, k, wq, wk, cache, pos};
  c.options = {{"is_neox", s.neox ? "true" : "false"}, {"rope_dim", std::to_string(s.R)},
               {"cache_full_width", s.full_width ? "true" : "false"}, {"rounding", rounding}, {"norm_order", order},
               {"norm_weight_rounding", weight_rounding}};
  // The reference's rsqrt is correctly rounded, the GPU's is rsqrtf (as aten's): where the factor
  // differs in its last bit a normalized value moves by one ulp, which the rotation carries into
  // its outputs (one ulp at the inputs' scale, |w x / rms| <= ~4), and a 16-bit cache's rotation
  // by one more (H200: 2 ulp on 5 of 921088 elements with a bf16 full-width cache). With the
  // weight rounding twice the factor's ulp moves rne16(x * factor), which the weight multiply
  // rounds again: the same bound is expected there, unmeasured on a device.
  c.tolerance = {2, 4.0, 0.1, 64};
  c.large = s.T * (s.Hq + s.Hk) * s.D > (1 << 20);  // the CPU reference takes ~0.1 s per million
  return c;
}

std::vector<OpCase> make() {
  std::vector<OpCase> out;
  auto modes = [&](const Qk& s, CaseKind kind) {
    for (const char* rounding : {"rounded", "fp32"})
      for (const char* order : {"aten", "warp"}) out.push_back(qk_case(s, rounding, order, kind));
  };
  // The GPU grid: head dims, partial rotary, NeoX, tokens 1 / 9 (packed QKV) / 129 (GQA) / 1031.
  for (int64_t D : {64, 128, 256})
    for (int64_t R : {D, D / 2})
      for (bool neox : {false, true})
        for (int64_t T : {1, 9, 129, 1031})
          for (DType pos : {DType::i32, DType::i64}) {
            Qk s{T, T == 129 ? 32 : 24, T == 129 ? 8 : 24, D, R, neox};
            s.pos = pos;
            s.packed = T == 9;
            modes(s, T == 9 ? CaseKind::view : T == 1031 ? CaseKind::model : CaseKind::odd);
          }
  // Activation and cache dtypes, compact and full-width caches, on a packed QKV projection.
  for (DType act : {DType::bf16, DType::f16})
    for (DType cache : {DType::f32, act})
      for (bool full : {false, true})
        for (bool neox : {false, true}) {
          Qk s{257, 28, 28, 128, 128, neox, full, act, cache, DType::i64, true};
          modes(s, CaseKind::view);
        }
  // Model shape (FLUX: 4608 tokens of 24 heads), scaled down on the CPU.
  modes(Qk{4608, 24, 24, 128, 128}, CaseKind::model);
  modes(Qk{64, 24, 24, 128, 128}, CaseKind::model);
  // Strided token rows; pointers off 16 bytes (the unaligned loads).
  modes(Qk{33, 8, 4, 128, 64, false, false, DType::bf16, DType::f32, DType::i64, false, 24}, CaseKind::strided);
  modes(Qk{17, 4, 4, 64, 64, true, false, DType::f16, DType::f16, DType::i32, false, 8, 1}, CaseKind::misaligned);
  modes(Qk{17, 3, 5, 128, 32, false, false, DType::bf16, DType::f32, DType::i64, true, 0, 3}, CaseKind::misaligned);
  // Empty: no tokens, nothing written.
  modes(Qk{0, 8, 8, 128, 128}, CaseKind::empty);

  // diffusers' RMSNorm (norm_order=aten_mean, norm_weight_rounding=twice; HunyuanVideo, Qwen-Image)
  // and MochiRMSNorm (aten_mean, once), D 64 and 128, bf16 and fp16, weights spread around 1
  // (weights of exactly 1 make once and twice the same computation).
  for (int64_t D : {64, 128})
    for (DType act : {DType::bf16, DType::f16})
      for (bool neox : {false, true}) {
        Qk s{129, 24, 8, D, D, neox, !neox, act, DType::f32, DType::i64};
        s.spread_weights = true;
        for (const char* weight_rounding : {"twice", "once"})
          out.push_back(qk_case(s, "rounded", "aten_mean", CaseKind::model, weight_rounding));
      }
  {
    // The twice chain on a packed QKV view with a 16-bit cache, partial rotary with strided rows,
    // pointers off 16 bytes, one token, and the other orders (defined, no eager chain).
    Qk packed{33, 6, 6, 128, 128, true, false, DType::bf16, DType::bf16, DType::i32, true};
    Qk partial{17, 3, 5, 128, 64, false, true, DType::f16, DType::f32, DType::i64, false, 24};
    Qk misaligned{9, 4, 4, 64, 64, true, false, DType::bf16, DType::f32, DType::i64, false, 8, 1};
    Qk single{1, 24, 24, 128, 128, false, true};
    for (Qk* s : {&packed, &partial, &misaligned, &single}) s->spread_weights = true;
    out.push_back(qk_case(packed, "rounded", "aten_mean", CaseKind::view, "twice"));
    out.push_back(qk_case(partial, "rounded", "aten_mean", CaseKind::strided, "twice"));
    out.push_back(qk_case(misaligned, "rounded", "aten_mean", CaseKind::misaligned, "twice"));
    out.push_back(qk_case(single, "rounded", "aten_mean", CaseKind::odd, "twice"));
    for (const char* order : {"aten", "warp"}) out.push_back(qk_case(single, "rounded", order, CaseKind::odd, "twice"));
    Qk wide{9, 4, 4, 256, 256};
    wide.spread_weights = true;
    out.push_back(qk_case(wide, "rounded", "warp", CaseKind::odd, "twice"));
    out.push_back(qk_case(Qk{0, 8, 8, 64, 64}, "rounded", "aten_mean", CaseKind::empty, "twice"));
  }

  // Aliased: q and k are both written, so any shared element is refused, naming both.
  {
    OpCase c = qk_case(Qk{4, 4, 4, 128, 128}, "rounded", "aten", CaseKind::aliased);
    c.name = "q_and_k_the_same_view";
    c.tensors[1].storage = "q";
    c.invalid = {"q and k must not alias"};
    out.push_back(c);
    c.name = "k_overlapping_q_by_one_head";
    c.tensors[1].offset = 128;
    c.invalid = {"q and k overlap in memory"};
    out.push_back(c);
  }
  // Invalid inputs: the message names the tensor, the dimension, the expected and actual value.
  {
    OpCase c = qk_case(Qk{4, 2, 2, 96, 96}, "rounded", "aten", CaseKind::invalid);
    c.name = "head_dim_96";
    c.invalid = {"q.shape[2] (head_dim) must be 64, 128 or 256 but is 96"};
    out.push_back(c);
    c = qk_case(Qk{4, 2, 2, 128, 128}, "rounded", "aten", CaseKind::invalid);
    c.name = "k_dtype_differs_from_q";
    c.tensors[1].dtype = DType::f16;
    c.invalid = {"k", "f16", "bf16"};
    out.push_back(c);
    c = qk_case(Qk{4, 2, 2, 128, 128}, "rounded", "aten", CaseKind::invalid);
    c.name = "cache_width_not_rope_dim";
    c.tensors[4].shape[1] = 96;
    c.invalid = {"cos_sin_cache.shape[1] must be 128", "but is 96"};
    out.push_back(c);
    c = qk_case(Qk{4, 2, 2, 128, 128}, "rounded", "aten", CaseKind::invalid);
    c.name = "positions_length_not_T";
    c.tensors[5].shape[0] = 3;
    c.invalid = {"positions", "4", "3"};
    out.push_back(c);
    c = qk_case(Qk{4, 2, 2, 256, 256}, "rounded", "aten_mean", CaseKind::invalid, "twice");
    c.name = "aten_mean_at_head_dim_256";
    c.invalid = {"norm_order=aten_mean needs head_dim 64 or 128", "head_dim is 256"};
    out.push_back(c);
    c = qk_case(Qk{4, 2, 2, 128, 128}, "fp32", "aten_mean", CaseKind::invalid, "twice");
    c.name = "twice_with_fp32_rounding";
    c.invalid = {"norm_weight_rounding=twice needs rounding=rounded"};
    out.push_back(c);
  }
  return out;
}

const CaseSet kCases("qknorm_rope", make);

}  // namespace
}  // namespace ditops::optest
