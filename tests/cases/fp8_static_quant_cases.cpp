// fp8_static_quant's cases: decode and adaLN widths at M in {1, 2, 16} with both reciprocals, the
// boundary scale 0.025 of the issue, odd widths (the scalar path), f16, pointers off 16 bytes, an
// empty call, out over x and invalid inputs. ieee is byte-equal to the reference; div_full's
// inverse may differ by an ulp from the reference's IEEE division, so a byte may move by one code.
#include <string>
#include <tuple>
#include <vector>

#include "op_test_driver.h"

namespace ditops::optest {
namespace {

struct Sq {
  int64_t M = 1, K = 5120;
  DType dtype = DType::bf16;
  const char* reciprocal = "ieee";
  double scale = 0.025;
  int64_t x_off = 0, out_off = 0;
};

OpCase sq_case(const Sq& s, CaseKind kind, uint32_t seed) {
  OpCase c;
  c.op = "fp8_static_quant";
  c.kind = kind;
  c.seed = seed;
  c.name = std::string(dtype_name(s.dtype)) + "_M" + std::to_string(s.M) + "_K" + std::to_string(s.K) + "_s" +
           std::to_string(s.scale) + "_" + s.reciprocal +
           (s.x_off || s.out_off ? "_off" + std::to_string(s.x_off) + "_" + std::to_string(s.out_off) : "");
  TensorCase x{"x", s.dtype, {s.M, s.K}};
  x.fill = Fill::normal(4.0);  // with scale 0.025: most of the e4m3 range, some beyond 448
  x.offset = s.x_off;
  TensorCase scale{"scale", DType::f32, {1}};
  scale.fill = Fill::constant(s.scale);
  TensorCase out{"out", DType::f8e4m3fn, {s.M, s.K}};
  out.offset = s.out_off;
  c.tensors = {x, scale, out};
  c.options = {{"fp8_reciprocal", s.reciprocal}};
  if (std::string(s.reciprocal) == "div_full") c.tolerance = {1, 0.0, 0.05, 16};
  return c;
}

std::vector<OpCase> make() {
  std::vector<OpCase> out;
  uint32_t seed = 1;
  auto add = [&](const Sq& s, CaseKind kind) { out.push_back(sq_case(s, kind, seed++)); };
  for (const auto& [M, K] : {std::pair<int64_t, int64_t>{1, 5120}, {2, 3072}, {16, 5120}, {9, 6144}, {4, 17408}})
    for (const char* reciprocal : {"ieee", "div_full"}) {
      Sq s;
      s.M = M;
      s.K = K;
      s.reciprocal = reciprocal;
      add(s, CaseKind::model);
    }
  for (double scale : {0.4754464328289032, 1.0}) {
    Sq s;
    s.M = 3;
    s.K = 1024;
    s.scale = scale;
    add(s, CaseKind::model);
  }
  for (DType dt : {DType::f16, DType::bf16}) {
    for (int64_t K : {int64_t{5}, int64_t{17}, int64_t{1000}}) {
      Sq s;
      s.M = 7;
      s.K = K;
      s.dtype = dt;
      add(s, CaseKind::odd);
    }
    for (const auto& [xo, oo] : {std::pair<int64_t, int64_t>{1, 0}, {0, 1}, {8, 16}}) {
      Sq s;
      s.M = 5;
      s.K = 256;
      s.dtype = dt;
      s.x_off = xo;
      s.out_off = oo;
      add(s, (xo % 8 || oo % 16) ? CaseKind::misaligned : CaseKind::odd);
    }
  }
  {
    Sq s;
    s.M = 0;
    s.K = 64;
    add(s, CaseKind::empty);
  }
  {
    Sq s;
    s.M = 4;
    s.K = 64;
    OpCase c = sq_case(s, CaseKind::aliased, seed++);
    c.name = "out_overlaps_x";
    c.tensors[2].storage = "x";
    c.invalid = {"x overlaps out in memory"};
    out.push_back(c);
  }
  Sq small;
  small.M = 4;
  small.K = 64;
  OpCase c = sq_case(small, CaseKind::invalid, seed++);
  c.name = "out_bf16";
  c.tensors[2].dtype = DType::bf16;
  c.invalid = {"out.dtype must be f8e4m3fn", "bf16"};
  out.push_back(c);
  c = sq_case(small, CaseKind::invalid, seed++);
  c.name = "two_scales";
  c.tensors[1].shape = {2};
  c.invalid = {"scale must have exactly 1 element", "2"};
  out.push_back(c);
  c = sq_case(small, CaseKind::invalid, seed++);
  c.name = "f32_input";
  c.tensors[0].dtype = DType::f32;
  c.invalid = {"x.dtype must be", "f32"};
  out.push_back(c);
  c = sq_case(small, CaseKind::invalid, seed++);
  c.name = "out_width_wrong";
  c.tensors[2].shape = {4, 65};
  c.invalid = {"out.shape[1] must equal K=64", "65"};
  out.push_back(c);
  c = sq_case(small, CaseKind::invalid, seed++);
  c.name = "rank_3";
  c.tensors[0].shape = {1, 4, 64};
  c.invalid = {"x must have rank 2 but has rank 3"};
  out.push_back(c);
  return out;
}

const CaseSet kCases("fp8_static_quant", make);

}  // namespace
}  // namespace ditops::optest
