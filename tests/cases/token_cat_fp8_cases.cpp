// token_cat_fp8's cases: the FLUX.2 shapes (tokens up to 4608, widths (6144, 18432) and
// (3072, 9216)) with both reciprocals, odd widths (the scalar path), f16,
// pointers off 16 bytes, an empty call, out overlapping an input and invalid inputs. ieee is
// bit-exact against the reference (equal bytes); div_full's inverse may differ by an ulp from the
// reference's IEEE division, so a byte may move by one code there. A scale <= 0 / NaN / Inf is
// refused on the CPU only (CUDA does not read it on the host): tests/test_token_cat_fp8.cpp.
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "op_test_driver.h"

namespace ditops::optest {
namespace {

struct Tc {
  int64_t B = 1, S = 1, Da = 6144, Dm = 18432;
  DType dtype = DType::bf16;
  const char* reciprocal = "ieee";
  double scale = 0.013;
  int64_t attn_off = 0, mlp_off = 0, out_off = 0;  // elements off 16-byte alignment
};

OpCase tc_case(const Tc& s, CaseKind kind, uint32_t seed) {
  OpCase c;
  c.op = "token_cat_fp8";
  c.kind = kind;
  c.seed = seed;
  c.name = std::string(dtype_name(s.dtype)) + "_B" + std::to_string(s.B) + "_S" + std::to_string(s.S) + "_Da" +
           std::to_string(s.Da) + "_Dm" + std::to_string(s.Dm) + "_s" + std::to_string(s.scale) + "_" + s.reciprocal +
           (s.attn_off || s.mlp_off || s.out_off
                ? "_off" + std::to_string(s.attn_off) + "_" + std::to_string(s.mlp_off) + "_" + std::to_string(s.out_off)
                : "");
  TensorCase attn{"attn", s.dtype, {s.B, s.S, s.Da}}, mlp{"mlp", s.dtype, {s.B, s.S, s.Dm}};
  attn.fill = Fill::normal(3.0);  // with scale 0.013, spread over the e4m3 range and beyond 448
  mlp.fill = Fill::normal(1.5);
  attn.offset = s.attn_off;
  mlp.offset = s.mlp_off;
  TensorCase scale{"input_scale", DType::f32, {1}};
  scale.fill = Fill::constant(s.scale);
  TensorCase out{"out", DType::f8e4m3fn, {s.B, s.S, s.Da + s.Dm}};
  out.offset = s.out_off;
  c.tensors = {attn, mlp, scale, out};
  c.options = {{"fp8_reciprocal", s.reciprocal}};
  if (std::string(s.reciprocal) == "div_full") c.tolerance = {1, 0.0, 0.05, 16};
  c.large = s.B * s.S * (s.Da + s.Dm) > (1 << 22);
  return c;
}

std::vector<OpCase> make() {
  std::vector<OpCase> out;
  uint32_t seed = 1;
  auto add = [&](const Tc& s, CaseKind kind) { out.push_back(tc_case(s, kind, seed++)); };
  // 16384 tokens (and 4096 at FLUX.2 width) run in tests/test_token_cat_fp8.cpp's GPU test: the
  // reference of this driver's repeated runs took minutes there (H200 host, 16 cores).
  for (const auto& [Da, Dm, tokens] : {std::tuple<int64_t, int64_t, int64_t>{6144, 18432, 1}, {6144, 18432, 127},
                                       {6144, 18432, 4608}, {3072, 9216, 127}, {3072, 9216, 4096}})
    for (const char* reciprocal : {"ieee", "div_full"}) {
      Tc s;
      s.S = tokens;
      s.Da = Da;
      s.Dm = Dm;
      s.reciprocal = reciprocal;
      add(s, CaseKind::model);
    }
  // Scaled down for the CPU, other scales, f16.
  for (double scale : {0.4754464328289032, 0.03125, 1.0}) {
    Tc s;
    s.S = 33;
    s.Da = 3072;
    s.Dm = 9216;
    s.scale = scale;
    add(s, CaseKind::model);
  }
  for (DType dt : {DType::f16, DType::bf16}) {
    // Odd widths: the scalar path (any Da, Dm), and a 16-byte width beside an odd one.
    for (const auto& [Da, Dm] : {std::pair<int64_t, int64_t>{5, 7}, {6143, 18433}, {16, 1}, {1, 16}, {17, 31},
                                 {0, 24}, {24, 0}}) {
      Tc s;
      s.B = 2;
      s.S = 9;
      s.Da = Da;
      s.Dm = Dm;
      s.dtype = dt;
      add(s, CaseKind::odd);
    }
    // Pointers off 16 bytes (widths that would take the vector path).
    for (const auto& [a, m, o] : {std::tuple<int64_t, int64_t, int64_t>{1, 0, 0}, {0, 3, 0}, {0, 0, 1}, {8, 8, 16}}) {
      Tc s;
      s.B = 2;
      s.S = 17;
      s.Da = 256;
      s.Dm = 768;
      s.dtype = dt;
      s.attn_off = a;
      s.mlp_off = m;
      s.out_off = o;
      add(s, (a % 8 || m % 8 || o % 16) ? CaseKind::misaligned : CaseKind::odd);
    }
  }
  {
    Tc s;
    s.S = 0;
    s.Da = 64;
    s.Dm = 192;
    add(s, CaseKind::empty);
  }
  // out over an input's bytes: refused before anything is written.
  for (const char* input : {"attn", "mlp"}) {
    Tc s;
    s.S = 4;
    s.Da = 64;
    s.Dm = 64;
    OpCase c = tc_case(s, CaseKind::aliased, seed++);
    c.name = std::string("out_overlaps_") + input;
    c.tensors[3].storage = input;
    c.invalid = {std::string(input) + " overlaps out in memory"};
    out.push_back(c);
  }
  // Invalid inputs.
  Tc small;
  small.B = 2;
  small.S = 8;
  small.Da = 32;
  small.Dm = 48;
  OpCase c = tc_case(small, CaseKind::invalid, seed++);
  c.name = "mlp_dtype_differs";
  c.tensors[1].dtype = DType::f16;
  c.invalid = {"mlp.dtype must be bf16", "f16"};
  out.push_back(c);
  c = tc_case(small, CaseKind::invalid, seed++);
  c.name = "tokens_differ";
  c.tensors[1].shape = {2, 9, 48};
  c.invalid = {"mlp.shape[1] must equal S=8", "9"};
  out.push_back(c);
  c = tc_case(small, CaseKind::invalid, seed++);
  c.name = "batch_differs";
  c.tensors[1].shape = {3, 8, 48};
  c.invalid = {"mlp.shape[0] must equal B=2", "3"};
  out.push_back(c);
  c = tc_case(small, CaseKind::invalid, seed++);
  c.name = "out_width_wrong";
  c.tensors[3].shape = {2, 8, 79};
  c.invalid = {"out.shape[2] must equal D=80", "79"};
  out.push_back(c);
  c = tc_case(small, CaseKind::invalid, seed++);
  c.name = "out_bf16";
  c.tensors[3].dtype = DType::bf16;
  c.invalid = {"out.dtype must be f8e4m3fn", "bf16"};
  out.push_back(c);
  c = tc_case(small, CaseKind::invalid, seed++);
  c.name = "two_scales";
  c.tensors[2].shape = {2};
  c.invalid = {"input_scale must have exactly 1 element", "2"};
  out.push_back(c);
  c = tc_case(small, CaseKind::invalid, seed++);
  c.name = "f32_inputs";
  c.tensors[0].dtype = c.tensors[1].dtype = DType::f32;
  c.invalid = {"attn.dtype must be", "f32"};
  out.push_back(c);
  c = tc_case(small, CaseKind::invalid, seed++);
  c.name = "rank_2";
  c.tensors[0].shape = {16, 32};
  c.tensors[1].shape = {16, 48};
  c.tensors[3].shape = {16, 80};
  c.invalid = {"attn must have rank 3 but has rank 2"};
  out.push_back(c);
  return out;
}

const CaseSet kCases("token_cat_fp8", make);

}  // namespace
}  // namespace ditops::optest
