// fp8_static_quant's cases: decode and adaLN widths at M in {1, 2, 16} with both reciprocals, the
// boundary scale 0.025 of the issue, odd widths (the scalar path), f16, pointers off 16 bytes, an
// empty call, out over x and invalid inputs. ieee is byte-equal to the reference; div_full's
// inverse may differ by an ulp from the reference's IEEE division, so a byte may move by one code.
// The float64 oracle below: x times fl32(1 / scale) exact in double, rounded to fp32, clamped to
// +-448, rounded on the e4m3 grid (the reference's reciprocal is IEEE in both modes).
#include <string>
#include <utility>
#include <vector>

#include "case_table.h"
#include "op_test_driver.h"
#include "rounding_oracle.h"

namespace ditops::optest {
namespace {

using Dims = std::vector<std::pair<std::string, int64_t>>;

std::vector<OpCase> make() {
  // x * (1 / 0.025): most of the e4m3 range, some beyond 448.
  const Row table{.options = {{"fp8_reciprocal", "ieee"}},
                  .tensors = {{.name = "x", .fill = Fill::normal(4.0)}, {.name = "scale", .fill = Fill::constant(0.025)}}};
  std::vector<Row> rows;
  for (const auto& [M, K] : {std::pair<int64_t, int64_t>{1, 5120}, {2, 3072}, {16, 5120}, {9, 6144}, {4, 17408}})
    for (const char* reciprocal : {"ieee", "div_full"})
      rows.push_back({.dims = {{"M", M}, {"K", K}}, .options = {{"fp8_reciprocal", reciprocal}}});
  for (double scale : {0.4754464328289032, 1.0})
    rows.push_back({.dims = {{"M", 3}, {"K", 1024}}, .tensors = {{.name = "scale", .fill = Fill::constant(scale)}}});
  for (DType dt : {DType::f16, DType::bf16}) {
    for (int64_t K : {5, 17, 1000}) rows.push_back({.dims = {{"M", 7}, {"K", K}}, .dtype = dt, .kind = CaseKind::odd});
    for (const auto& [xo, oo] : {std::pair<int64_t, int64_t>{1, 0}, {0, 1}, {8, 16}})
      rows.push_back({.dims = {{"M", 5}, {"K", 256}}, .dtype = dt,
                      .kind = xo % 8 || oo % 16 ? CaseKind::misaligned : CaseKind::odd,
                      .tensors = {{.name = "x", .offset = xo}, {.name = "out", .offset = oo}}});
  }
  // NaN of both signs stays NaN, infinities saturate; the quantization's boundaries at 0.025
  // (fp8_linear's case of the same values); every dtype's special values.
  rows.push_back({.dims = {{"M", 1}, {"K", 4}}, .kind = CaseKind::odd,
                  .tensors = {{.name = "x", .fill = Fill::bits({0x7FC0, 0xFFC0, 0x7F80, 0xFF80})}},
                  .name = "nan_and_infinities"});
  rows.push_back({.dims = {{"M", 1}, {"K", 16}}, .kind = CaseKind::odd,
                  .tensors = {{.name = "x", .fill = Fill::bits({0x43E0, 0xC3E0, 0x4134, 0xC134, 0x4130, 0xC130, 0x3C55,
                                                                0xBC55, 0x4200, 0xC200, 0x4133, 0xC133, 0x0000, 0x8000,
                                                                0x3F80, 0x3F00})}},
                  .name = "quantization_boundaries"});
  for (DType dt : {DType::bf16, DType::f16})
    for (double scale : {1.0, 0.025})
      rows.push_back({.dims = {{"M", 3}, {"K", 100}}, .dtype = dt, .kind = CaseKind::odd,
                      .tensors = {{.name = "x", .fill = Fill::special(4.0)}, {.name = "scale", .fill = Fill::constant(scale)}}});
  rows.push_back({.dims = {{"M", 0}, {"K", 64}}, .kind = CaseKind::empty});
  // Refused before anything is written.
  const Dims small = {{"M", 4}, {"K", 64}};
  rows.push_back({.dims = small, .kind = CaseKind::aliased, .tensors = {{.name = "out", .storage = "x"}},
                  .name = "out_overlaps_x", .invalid = {"x overlaps out in memory"}});
  for (const auto& [tensor, name, invalid] : std::vector<std::tuple<RowTensor, std::string, std::vector<std::string>>>{
           {{.name = "out", .dtype = DType::bf16}, "out_bf16", {"out.dtype must be f8e4m3fn", "bf16"}},
           {{.name = "scale", .shape = {{2}}}, "two_scales", {"scale must have exactly 1 element", "2"}},
           {{.name = "x", .dtype = DType::f32}, "f32_input", {"x.dtype must be", "f32"}},
           {{.name = "out", .shape = {{4, 65}}}, "out_width_wrong", {"out.shape[1] must equal K=64", "65"}},
           {{.name = "x", .shape = {{1, 4, 64}}}, "rank_3", {"x must have rank 2 but has rank 3"}}})
    rows.push_back({.dims = small, .kind = CaseKind::invalid, .tensors = {tensor}, .name = name, .invalid = invalid});
  uint32_t seed = 1;
  std::vector<OpCase> out = table_cases("fp8_static_quant", table, rows, seed);
  // div_full's reciprocal may be an ulp from the reference's IEEE division: a byte one code off.
  for (OpCase& c : out)
    for (const auto& [option, value] : c.options)
      if (option == "fp8_reciprocal" && value == "div_full") c.tolerance = {1, 0.0, 0.05, 16};
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
