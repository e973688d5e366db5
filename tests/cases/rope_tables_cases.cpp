// rope_tables' cases: FLUX.1's joint ids (512 text rows of zeros, then (0, h, w) over a 64 x 64 or
// 64 x 72 latent grid; axes 16, 56, 56; theta 10000) and FLUX.2's image ids ((0, h, w, 0) over 64 x 64) and
// text ids ((0, 0, 0, l) for 512 tokens; axes 32 x 4; theta 2000), at full size (large: where a
// device compares them) and scaled down for the CPU; odd sizes (one row, 7 rows, one axis, more id
// columns than axes); ids of any strides (a column slice of a wider tensor, column-major); large and
// negative positions; empty calls; refusals.
//
// The reference uses the C library's double pow, cos and sin where the kernel uses CUDA's: a float32
// value may be one ulp apart (below 2^-10 in magnitude, one ulp of 2^-10: a double's difference in
// the angle is absolute).
//
// The oracle (below): the same chain in long double (powl, cosl, sinl), bounding the reference's
// float32 values by one float32 ulp plus the double chain's error, |angle| * 2^-48.
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "op_test_driver.h"

namespace ditops::optest {
namespace {

uint64_t f32_bits(float v) {
  uint32_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
}

// Position ids as raw float32 patterns, row-major [rows, columns].
struct Ids {
  std::vector<uint64_t> bits;
  int64_t rows = 0;
  int64_t columns = 0;
  void row(std::vector<float> values) {
    for (float v : values) bits.push_back(f32_bits(v));
    columns = static_cast<int64_t>(values.size());
    ++rows;
  }
};

// FLUX.1: `text` rows of zeros, then (0, h, w) for h < H and w < W in steps of `step`.
Ids flux1_ids(int64_t text, int64_t H, int64_t W, int64_t step) {
  Ids ids;
  for (int64_t l = 0; l < text; ++l) ids.row({0.f, 0.f, 0.f});
  for (int64_t h = 0; h < H; h += step)
    for (int64_t w = 0; w < W; w += step) ids.row({0.f, static_cast<float>(h), static_cast<float>(w)});
  return ids;
}

// FLUX.2's image ids (0, h, w, 0) and text ids (0, 0, 0, l).
Ids flux2_image_ids(int64_t H, int64_t W, int64_t step) {
  Ids ids;
  for (int64_t h = 0; h < H; h += step)
    for (int64_t w = 0; w < W; w += step) ids.row({0.f, static_cast<float>(h), static_cast<float>(w), 0.f});
  return ids;
}
Ids flux2_text_ids(int64_t L, int64_t step) {
  Ids ids;
  for (int64_t l = 0; l < L; l += step) ids.row({0.f, 0.f, 0.f, static_cast<float>(l)});
  return ids;
}

using Options = std::vector<std::pair<std::string, std::string>>;
const Options kFlux1 = {{"axes_dim0", "16"}, {"axes_dim1", "56"}, {"axes_dim2", "56"}, {"axes_dim3", "0"},
                        {"theta", "10000"}};
const Options kFlux2 = {{"axes_dim0", "32"}, {"axes_dim1", "32"}, {"axes_dim2", "32"}, {"axes_dim3", "32"},
                        {"theta", "2000"}};

int64_t width_of(const Options& o) {
  int64_t D = 0;
  for (int a = 0; a < 4; ++a)
    for (const auto& [name, value] : o)
      if (name == "axes_dim" + std::to_string(a)) D += std::stoll(value);
  return D;
}

// A case of S rows of A id columns; ids filled normal(scale) unless given.
OpCase rt_case(const std::string& name, CaseKind kind, int64_t S, int64_t A, const Options& options, uint32_t seed) {
  OpCase c{.op = "rope_tables", .name = name, .kind = kind, .seed = seed};
  const int64_t D = width_of(options);
  TensorCase ids{"ids", DType::f32, {S, A}};
  ids.fill = Fill::normal(40.0);
  c.tensors = {ids, TensorCase{"cos", DType::f32, {S, D}}, TensorCase{"sin", DType::f32, {S, D}}};
  c.options = options;
  // CUDA's double functions against the C library's: a float32 ulp, compared at 2^-10 below it
  c.tolerance = {1.0, 0x1p-10, 0.01, 16};
  c.large = S * D > (int64_t{1} << 19);
  return c;
}

OpCase ids_case(const std::string& name, CaseKind kind, const Ids& ids, const Options& options, uint32_t seed) {
  OpCase c = rt_case(name, kind, ids.rows, ids.columns, options, seed);
  c.tensors[0].fill = Fill::bits(ids.bits);
  return c;
}

Options with(Options o, const std::string& name, const std::string& value) {
  for (auto& [n, v] : o)
    if (n == name) v = value;
  return o;
}

std::vector<OpCase> make() {
  std::vector<OpCase> out;
  uint32_t seed = 1;
  // FLUX.1-dev at 1024 x 1024 (a 64 x 64 latent grid: 4608 joint rows) and 1024 x 1152 (64 x 72, 4608
  // image tokens) after 512 text tokens: the joint ids; then scaled down (8 text rows, every 7th h and w).
  out.push_back(ids_case("flux1_joint_4608", CaseKind::model, flux1_ids(512, 64, 64, 1), kFlux1, seed++));
  out.push_back(ids_case("flux1_joint_5120", CaseKind::model, flux1_ids(512, 64, 72, 1), kFlux1, seed++));
  out.push_back(ids_case("flux1_joint_scaled", CaseKind::model, flux1_ids(8, 64, 72, 7), kFlux1, seed++));
  // FLUX.2 at 1024 x 1024 (64 x 64): image ids and 512 text ids, each its own call as the model makes
  // them; then scaled down.
  out.push_back(ids_case("flux2_image_4096", CaseKind::model, flux2_image_ids(64, 64, 1), kFlux2, seed++));
  out.push_back(ids_case("flux2_text_512", CaseKind::model, flux2_text_ids(512, 1), kFlux2, seed++));
  out.push_back(ids_case("flux2_image_scaled", CaseKind::model, flux2_image_ids(64, 64, 9), kFlux2, seed++));
  out.push_back(ids_case("flux2_text_scaled", CaseKind::model, flux2_text_ids(512, 13), kFlux2, seed++));
  // Odd sizes: one row, seven rows, one axis, two axes of odd pair counts, ids with more columns than
  // axes (FLUX.2 reads the first four of five), FLUX.1's widths from random positions.
  out.push_back(rt_case("one_row", CaseKind::odd, 1, 4, kFlux2, seed++));
  out.push_back(rt_case("seven_rows", CaseKind::odd, 7, 4, kFlux2, seed++));
  out.push_back(rt_case("one_axis", CaseKind::odd, 7, 1,
                        {{"axes_dim0", "8"}, {"axes_dim1", "0"}, {"axes_dim2", "0"}, {"axes_dim3", "0"}}, seed++));
  out.push_back(rt_case("two_axes_6_10", CaseKind::odd, 5, 2,
                        {{"axes_dim0", "6"}, {"axes_dim1", "10"}, {"axes_dim2", "0"}, {"axes_dim3", "0"},
                         {"theta", "10000"}},
                        seed++));
  out.push_back(rt_case("more_columns_than_axes", CaseKind::odd, 9, 5, kFlux2, seed++));
  out.push_back(rt_case("flux1_widths_random", CaseKind::odd, 33, 3, kFlux1, seed++));
  // ids of any strides: the columns [2, 5) of a [S, 7] tensor, and a column-major [S, 3] view.
  {
    OpCase c = rt_case("ids_column_slice", CaseKind::view, 11, 3, kFlux1, seed++);
    c.tensors[0].strides = {7, 1};
    c.tensors[0].offset = 2;
    out.push_back(c);
  }
  {
    OpCase c = rt_case("ids_column_major", CaseKind::strided, 13, 4, kFlux2, seed++);
    c.tensors[0].strides = {1, 13};
    out.push_back(c);
  }
  // Large and negative positions, signed zeros, half-integers: the angle's double product matters.
  {
    Ids ids;
    for (float v : {10000.f, -10000.f, -1.f, -4095.5f, 32767.f, -65536.f, 100000.f, 0.5f, -0.f, 0.f, 12345.678f,
                    -0.25f})
      ids.row({v, -v, v * 0.5f, v == 0.f ? 0.f : 1.f / v});
    out.push_back(ids_case("large_negative_positions", CaseKind::odd, ids, kFlux2, seed++));
    Ids flux1;
    for (float v : {10000.f, -10000.f, -4095.5f, 32767.f, 100000.f, -0.f}) flux1.row({v, -v, 2.f * v});
    out.push_back(ids_case("large_negative_positions_flux1", CaseKind::odd, flux1, kFlux1, seed++));
  }
  // Other bases.
  out.push_back(rt_case("theta_256", CaseKind::odd, 6, 4, with(kFlux2, "theta", "256"), seed++));
  out.push_back(rt_case("theta_1e6", CaseKind::odd, 6, 3, with(kFlux1, "theta", "1000000"), seed++));
  // Empty: no rows.
  out.push_back(rt_case("empty", CaseKind::empty, 0, 4, kFlux2, seed++));
  out.push_back(rt_case("empty_flux1", CaseKind::empty, 0, 3, kFlux1, seed++));
  // Refusals: nothing written.
  auto invalid = [&](const std::string& name, std::vector<std::string> fragments, const Options& options,
                     auto edit) {
    OpCase c = rt_case(name, CaseKind::invalid, 4, 4, kFlux2, seed++);
    c.options = options;
    edit(c);
    c.invalid = std::move(fragments);
    out.push_back(c);
  };
  const auto none = [](OpCase&) {};
  invalid("odd_axis", {"axes_dim1 must be even and positive", "but is 31"}, with(kFlux2, "axes_dim1", "31"),
          [](OpCase& c) { c.tensors[1].shape = c.tensors[2].shape = {4, 127}; });
  invalid("negative_axis", {"axes_dim2 must be even and positive", "but is -32"}, with(kFlux2, "axes_dim2", "-32"),
          none);
  invalid("first_axis_zero", {"axes_dim0 must be even and positive", "but is 0"}, with(kFlux2, "axes_dim0", "0"),
          none);
  invalid("axis_after_zero", {"axes_dim3 must be 0 (axes_dim2 = 0 ended the axes) but is 32"},
          with(kFlux2, "axes_dim2", "0"), none);
  invalid("more_axes_than_columns", {"ids.shape[1] must be >= 4", "but is 3"}, kFlux2,
          [](OpCase& c) { c.tensors[0].shape = {4, 3}; });
  invalid("cos_width_wrong", {"cos.shape[1] must equal D=128 (the sum of axes_dim: 32+32+32+32) but is 96"}, kFlux2,
          [](OpCase& c) { c.tensors[1].shape = {4, 96}; });
  invalid("sin_width_wrong", {"sin.shape[1]", "96"}, kFlux2, [](OpCase& c) { c.tensors[2].shape = {4, 96}; });
  invalid("cos_rows_wrong", {"cos.shape[0]", "5"}, kFlux2, [](OpCase& c) { c.tensors[1].shape = {5, 128}; });
  invalid("cos_bf16", {"cos.dtype must be f32", "bf16"}, kFlux2, [](OpCase& c) { c.tensors[1].dtype = DType::bf16; });
  invalid("ids_bf16", {"ids.dtype must be f32", "bf16"}, kFlux2, [](OpCase& c) { c.tensors[0].dtype = DType::bf16; });
  invalid("sin_not_contiguous", {"sin"}, kFlux2, [](OpCase& c) { c.tensors[2].strides = {256, 1}; });
  {
    OpCase c = rt_case("sin_over_cos", CaseKind::aliased, 4, 4, kFlux2, seed++);
    c.tensors[2].storage = "cos";
    c.invalid = {"cos overlaps sin in memory"};
    out.push_back(c);
  }
  {
    OpCase c = rt_case("cos_over_ids", CaseKind::aliased, 4, 4, kFlux2, seed++);
    c.tensors[1].storage = "ids";
    c.tensors[0].shape = {4, 128};
    c.invalid = {"ids overlaps cos in memory"};
    out.push_back(c);
  }
  // Every model case again with the ids one element off (its view moves with it), and without PDL.
  Variants v;
  v.misalign = {"ids"};
  v.options = {{{{"use_pdl", "false"}}, "nopdl"}};
  add_variants(out, v);
  return out;
}

const CaseSet kCases("rope_tables", make);

// The chain in long double: the reference's values within one float32 ulp plus the double chain's
// error in the angle (each of e, pow, the reciprocal and the product one rounding of a double, pow's
// relative error magnified by ln(theta) * e < 16).
void rope_tables_oracle(OracleIo& io) {
  const int ids = io.id("ids"), cos_t = io.id("cos"), sin_t = io.id("sin");
  const int64_t S = io.shape(ids)[0], A = io.shape(ids)[1], D = io.shape(cos_t)[1];
  std::vector<int64_t> dims;
  for (int a = 0; a < 4; ++a) {
    const int64_t d = static_cast<int64_t>(io.number("axes_dim" + std::to_string(a)));
    if (d == 0) break;
    dims.push_back(d);
  }
  const long double theta = io.number("theta");
  const auto ulp32 = [](long double v) {
    const long double m = std::fabs(v);
    if (m < 0x1p-126L) return static_cast<long double>(0x1p-149L);
    int e;
    std::frexp(static_cast<double>(m), &e);
    return std::ldexp(1.0L, e - 24);
  };
  for (int64_t s = 0; s < S; ++s) {
    int64_t col = 0;
    for (size_t a = 0; a < dims.size(); ++a) {
      const long double pos = io.in(ids, s * A + static_cast<int64_t>(a));
      for (int64_t k = 0; k < dims[a] / 2; ++k) {
        const long double f = 1.0L / std::pow(theta, static_cast<long double>(2 * k) / dims[a]);
        const long double angle = pos * f;
        const long double c = std::cos(angle), sn = std::sin(angle);
        const long double slack = std::fabs(angle) * 0x1p-48L;
        for (int64_t i : {col + 2 * k, col + 2 * k + 1}) {
          io.expect(cos_t, s * D + i, static_cast<double>(c), static_cast<double>(ulp32(c) + slack));
          io.expect(sin_t, s * D + i, static_cast<double>(sn), static_cast<double>(ulp32(sn) + slack));
        }
      }
      col += dims[a];
    }
  }
}

const Oracle kRopeTables{.name = "the chain in long double (powl, cosl, sinl), within a float32 ulp",
                         .expect = rope_tables_oracle};
const OracleSet kOracles("rope_tables", kRopeTables);

}  // namespace
}  // namespace ditops::optest
