// The layernorm_modulate family's cases: layernorm_modulate and layernorm_modulate_fp8 (scale
// and shift as chunks of one adaLN modulation projection, both row mappings, amplitudes
// 1e-4..100, in place, stats_out) and qk_head_layernorm (GQA, in place); empty, overlapping and
// invalid calls.
#include "op_test_driver.h"

namespace ditops::optest {
namespace {

struct Ln {
  int64_t B, S, D;
  bool shift = true;
  double amplitude = 1.0, eps = 1e-6;
  const char* mapping = "automatic";
  double input_scale = 0;  // > 0: the fp8 op
  const char* reciprocal = "ieee";
  bool in_place = false, stats = false;
};

// The reference's rstd is correctly rounded where the GPU uses MUFU.RSQ (<= 2 fp32 ulp): an
// element may move by one bf16 ulp of the normalized value, carried through (1 + scale) and the
// shift (|d| <= 2^-6 (|y (1 + scale)| + |out|)); stats may differ in rstd's last two bits.
Tolerance close_bf16() { return {2, 8.0, 0.02, 16}; }

OpCase ln_case(const Ln& s, CaseKind kind, uint32_t seed) {
  const bool fp8 = s.input_scale > 0;
  const int64_t chunks = s.shift ? 6 : 4;  // scale/shift are chunks of a [B, chunks * D] projection
  OpCase c;
  c.op = fp8 ? "layernorm_modulate_fp8" : "layernorm_modulate";
  c.kind = kind;
  c.seed = seed;
  char amp[32];
  std::snprintf(amp, sizeof amp, "%g", s.amplitude);
  c.name = "B" + std::to_string(s.B) + "_S" + std::to_string(s.S) + "_D" + std::to_string(s.D) +
           (s.shift ? "_shift" : "") + "_amp" + amp + "_" + s.mapping + (s.in_place ? "_in_place" : "") +
           (s.stats ? "_stats" : "") + (fp8 ? std::string("_s") + std::to_string(s.input_scale) + "_" + s.reciprocal : "");
  TensorCase x{"x", DType::bf16, {s.B, s.S, s.D}};
  x.fill = Fill::normal(s.amplitude, 0.3);
  TensorCase scale{"scale", DType::bf16, {s.B, s.D}, {chunks * s.D, 1}};
  scale.fill = Fill::normal(0.3);
  c.tensors = {x, scale};
  if (s.shift) c.tensors.push_back({"shift", DType::bf16, {s.B, s.D}, {chunks * s.D, 1}, "scale", s.D});
  if (fp8) {
    TensorCase is{"input_scale", DType::f32, {1}};
    is.fill = Fill::constant(s.input_scale);
    c.tensors.push_back(is);
  }
  if (s.in_place) c.tensors.push_back({"out", DType::bf16, {s.B, s.S, s.D}, {}, "x"});
  if (s.stats) c.tensors.push_back({"stats_out", DType::f32, {s.B, s.S, 2}});
  c.options = {{"eps", std::to_string(s.eps)}, {"mapping", s.mapping}};
  if (fp8) c.options.push_back({"fp8_reciprocal", s.reciprocal});
  c.tolerance = close_bf16();
  // An e4m3 code may flip where the bf16 value moved; stats: rstd within 2 fp32 ulp on any row.
  c.tolerance_for = {{"stats_out", {2, 0.0, 1.0, 0}}};
  c.large = s.B * s.S * s.D > (1 << 21);
  return c;
}

OpCase qk_case(int64_t B, int64_t S, int64_t H, int64_t Hk, int64_t Dh, bool in_place, CaseKind kind, uint32_t seed) {
  OpCase c;
  c.op = "qk_head_layernorm";
  c.kind = kind;
  c.seed = seed;
  c.name = "B" + std::to_string(B) + "_S" + std::to_string(S) + "_H" + std::to_string(H) + "_Hk" + std::to_string(Hk) +
           "_Dh" + std::to_string(Dh) + (in_place ? "_in_place" : "");
  TensorCase q{"q", DType::bf16, {B, S, H, Dh}}, k{"k", DType::bf16, {B, S, Hk, Dh}};
  q.fill = Fill::normal(4.0, 0.25);
  k.fill = Fill::normal(4.0);
  c.tensors = {q, k};
  if (in_place) {
    c.tensors.push_back({"q_out", DType::bf16, {B, S, H, Dh}, {}, "q"});
    c.tensors.push_back({"k_out", DType::bf16, {B, S, Hk, Dh}, {}, "k"});
  }
  // rstd correctly rounded against MUFU.RSQ: one bf16 ulp of the element.
  c.tolerance = {1, 0.0, 0.02, 16};
  c.large = B * S * (H + Hk) * Dh > (1 << 21);
  return c;
}

std::vector<OpCase> make() {
  std::vector<OpCase> out;
  uint32_t seed = 1;
  // The GPU grid: model widths (2240 SANA, 3072 FLUX, 4096, 5120, 6144, 8192) and odd ones, every
  // amplitude, with and without shift, each row mapping.
  for (auto [B, S, D] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {1, 1, 128}, {1, 37, 2240}, {2, 300, 3072}, {1, 129, 4096}, {1, 64, 5120}, {1, 33, 6144}, {1, 9, 8192},
           {2, 17, 516}, {3, 5, 12}})
    for (auto [amp, eps] : std::vector<std::pair<double, double>>{{1e-4, 1e-6}, {1.0, 1e-6}, {100.0, 1e-5}})
      for (bool shift : {true, false})
        for (const char* mapping : {"warp", "cta", "automatic"}) {
          Ln s{B, S, D, shift, amp, eps, mapping};
          s.stats = mapping[0] == 'w';
          out.push_back(ln_case(s, D % 64 == 0 && S > 1 ? CaseKind::model : CaseKind::odd, seed++));
        }
  // FLUX's shape.
  out.push_back(ln_case({1, 4608, 3072}, CaseKind::model, seed++));
  // fp8: static scales, both reciprocals, both mappings.
  for (Ln s : {Ln{1, 127, 6144, true, 3.0}, Ln{2, 40, 3072, false, 1.0}})
    for (double is : {0.005, 0.03125, 0.25, 0.4754464328289032, 1.0})
      for (const char* mapping : {"warp", "cta"})
        for (const char* reciprocal : {"ieee", "div_full"}) {
          s.input_scale = is;
          s.mapping = mapping;
          s.reciprocal = reciprocal;
          OpCase c = ln_case(s, CaseKind::model, seed++);
          // div.full's inverse may differ by an ulp from the reference's IEEE division.
          c.tolerance_for.push_back({"out", {1, 0.0, 0.05, 16}});
          out.push_back(c);
        }
  // In place (out is x): equal to the out-of-place result.
  for (const char* mapping : {"warp", "cta"}) {
    Ln s{2, 33, 3072};
    s.mapping = mapping;
    s.in_place = true;
    out.push_back(ln_case(s, CaseKind::aliased, seed++));
  }
  // Empty: no rows.
  out.push_back(ln_case({1, 0, 3072}, CaseKind::empty, seed++));
  {
    Ln s{2, 0, 256, false};
    s.input_scale = 0.5;
    out.push_back(ln_case(s, CaseKind::empty, seed++));
  }
  // Overlaps that must be refused, naming the tensors.
  {
    OpCase c = ln_case({2, 8, 256}, CaseKind::aliased, seed++);
    c.name = "out_overlaps_x_shifted";
    c.tensors.push_back({"out", DType::bf16, {2, 8, 256}, {}, "x", 128});
    c.invalid = {"out overlaps x without being the same view"};
    out.push_back(c);
    c = ln_case({2, 8, 256}, CaseKind::aliased, seed++);
    c.name = "out_is_scale";
    c.tensors.push_back({"out", DType::bf16, {2, 8, 256}, {}, "scale"});
    c.invalid = {"out must not overlap scale or shift"};
    out.push_back(c);
    Ln s{2, 8, 256};
    s.input_scale = 0.5;
    c = ln_case(s, CaseKind::aliased, seed++);
    c.name = "fp8_out_over_x";
    c.tensors.push_back({"out", DType::f8e4m3fn, {2, 8, 256}, {}, "x"});
    c.invalid = {"out (fp8) must not overlap x"};
    out.push_back(c);
  }
  // Invalid inputs.
  {
    OpCase c = ln_case({1, 4, 8196}, CaseKind::invalid, seed++);
    c.name = "D_8196_too_wide";
    c.invalid = {"x.shape[2] (D) must be a multiple of 4 in [4, 8192]", "8196"};
    out.push_back(c);
    c = ln_case({1, 4, 10}, CaseKind::invalid, seed++);
    c.name = "D_10_not_multiple_of_4";
    c.invalid = {"x.shape[2] (D)", "10"};
    out.push_back(c);
    c = ln_case({2, 4, 256}, CaseKind::invalid, seed++);
    c.name = "scale_width_differs";
    c.tensors[1].shape = {2, 128};
    c.invalid = {"scale", "256", "128"};
    out.push_back(c);
  }

  // qk_head_layernorm: the GPU grid, in place and not.
  for (auto [B, S, H, Hk, Dh] : std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>>{
           {1, 129, 32, 32, 128}, {2, 37, 3, 5, 40}, {1, 129, 5, 5, 64}, {1, 7, 2, 1, 4}, {1, 1, 1, 1, 124}})
    for (bool in_place : {true, false})
      out.push_back(qk_case(B, S, H, Hk, Dh, in_place, in_place ? CaseKind::aliased : Dh == 128 ? CaseKind::model : CaseKind::odd, seed++));
  out.push_back(qk_case(1, 4608, 24, 24, 128, false, CaseKind::model, seed++));
  out.push_back(qk_case(1, 0, 24, 24, 128, false, CaseKind::empty, seed++));
  {
    OpCase c = qk_case(1, 4, 2, 2, 132, false, CaseKind::invalid, seed++);
    c.name = "head_dim_132";
    c.invalid = {"q.shape[3] (head_dim) must be a multiple of 4 in [4, 128] but is 132"};
    out.push_back(c);
  }
  return out;
}

const CaseSet kCases("layernorm_modulate", make);

}  // namespace
}  // namespace ditops::optest
