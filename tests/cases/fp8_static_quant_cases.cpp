// fp8_static_quant's cases: decode and adaLN widths at M in {1, 2, 16} with both reciprocals, the
// boundary scale 0.025 of the issue, odd widths (the scalar path), f16, pointers off 16 bytes, an
// empty call, out over x and invalid inputs. ieee is byte-equal to the reference; div_full's
// inverse may differ by an ulp from the reference's IEEE division, so a byte may move by one code.
// The float64 oracle below: x times fl32(1 / scale) exact in double, rounded to fp32, clamped to
// +-448, rounded on the e4m3 grid (the reference's reciprocal is IEEE in both modes).
#include <string>
#include <tuple>
#include <vector>

#include "op_test_driver.h"
#include "rounding_oracle.h"

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
  // NaN of both signs stays NaN, infinities saturate; the quantization's boundaries at 0.025
  // (fp8_linear's case of the same values); every dtype's special values.
  {
    Sq s;
    s.M = 1;
    s.K = 4;
    OpCase c = sq_case(s, CaseKind::odd, seed++);
    c.name = "nan_and_infinities";
    c.tensors[0].fill = Fill::bits({0x7FC0, 0xFFC0, 0x7F80, 0xFF80});
    out.push_back(c);
    s.K = 16;
    c = sq_case(s, CaseKind::odd, seed++);
    c.name = "quantization_boundaries";
    c.tensors[0].fill = Fill::bits({0x43E0, 0xC3E0, 0x4134, 0xC134, 0x4130, 0xC130, 0x3C55, 0xBC55, 0x4200, 0xC200,
                                    0x4133, 0xC133, 0x0000, 0x8000, 0x3F80, 0x3F00});
    out.push_back(c);
    for (DType dt : {DType::bf16, DType::f16})
      for (double scale : {1.0, 0.025}) {
        Sq v;
        v.M = 3;
        v.K = 100;
        v.dtype = dt;
        v.scale = scale;
        c = sq_case(v, CaseKind::odd, seed++);
        c.name += "_special";
        c.tensors[0].fill = Fill::special(4.0);
        out.push_back(c);
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
  // Every model case again with x and out an element off their alignment.
  add_variants(out, {{"x", "out"}});
  return out;
}

const CaseSet kCases("fp8_static_quant", make);

void sq_oracle(OracleIo& io) {
  const int x = io.id("x"), out = io.id("out");
  const double inv = testing_oracle::ieee_inverse(io.in(io.id("scale"), 0));
  for (int64_t i = 0; i < io.numel(x); ++i)
    io.expect(out, i, testing_oracle::round_e4m3_saturated(testing_oracle::round_f32(io.in(x, i) * inv)));
}

const OracleSet kOracle("fp8_static_quant", {"float64 transcription of the static fp8 quantization", sq_oracle});

}  // namespace
}  // namespace ditops::optest
