// token_cat_fp8's cases: the FLUX.2 shapes (tokens up to 4608, widths (6144, 18432) and
// (3072, 9216)) with both reciprocals, odd widths (the scalar path), f16,
// pointers off 16 bytes, special values, an empty call, out overlapping an input and invalid inputs.
// ieee is bit-exact against the reference (equal bytes); div_full's inverse may differ by an ulp
// from the reference's IEEE division, so a byte may move by one code there. A scale <= 0 / NaN / Inf
// is refused on the CPU only (CUDA does not read it on the host): tests/test_token_cat_fp8.cpp.
// The float64 oracle: x times fl32(1 / scale) is exact in double, rounded to fp32, clamped to
// +-448 and rounded on the e4m3 grid (the reference's reciprocal is IEEE in both modes).
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "case_table.h"
#include "op_test_driver.h"
#include "rounding_oracle.h"

namespace ditops::optest {
namespace {

using Dims = std::vector<std::pair<std::string, int64_t>>;

// The dims of a call and whether it is large (run only where a device compares it).
Row shape(int64_t B, int64_t S, int64_t Da, int64_t Dm) {
  return {.dims = {{"B", B}, {"S", S}, {"Da", Da}, {"Dm", Dm}}, .large = B * S * (Da + Dm) > (1 << 22)};
}

Row with(Row r, std::vector<RowTensor> tensors, const char* reciprocal = nullptr) {
  r.tensors = std::move(tensors);
  if (reciprocal) r.options = {{"fp8_reciprocal", reciprocal}};
  return r;
}

RowTensor scale(double s) { return {.name = "input_scale", .fill = Fill::constant(s)}; }

std::vector<OpCase> make() {
  // With scale 0.013: spread over the e4m3 range and beyond 448.
  const Row table{.options = {{"fp8_reciprocal", "ieee"}},
                  .tensors = {{.name = "attn", .fill = Fill::normal(3.0)},
                              {.name = "mlp", .fill = Fill::normal(1.5)},
                              scale(0.013)}};
  std::vector<Row> rows;
  auto add = [&](Row r, std::optional<DType> dtype = std::nullopt, CaseKind kind = CaseKind::model) {
    r.dtype = dtype;
    r.kind = kind;
    rows.push_back(std::move(r));
  };
  // 16384 tokens (and 4096 at FLUX.2 width) run in tests/test_token_cat_fp8.cpp's GPU test: the
  // reference of this driver's repeated runs took minutes there (H200 host, 16 cores).
  for (const auto& [Da, Dm, tokens] : {std::tuple<int64_t, int64_t, int64_t>{6144, 18432, 1}, {6144, 18432, 127},
                                       {6144, 18432, 4608}, {3072, 9216, 127}, {3072, 9216, 4096}})
    for (const char* reciprocal : {"ieee", "div_full"}) add(with(shape(1, tokens, Da, Dm), {}, reciprocal));
  // Scaled down for the CPU, other scales, f16.
  for (double s : {0.4754464328289032, 0.03125, 1.0}) add(with(shape(1, 33, 3072, 9216), {scale(s)}));
  for (DType dt : {DType::f16, DType::bf16}) {
    // Odd widths: the scalar path (any Da, Dm), and a 16-byte width beside an odd one.
    for (const auto& [Da, Dm] : {std::pair<int64_t, int64_t>{5, 7}, {6143, 18433}, {16, 1}, {1, 16}, {17, 31},
                                 {0, 24}, {24, 0}})
      add(shape(2, 9, Da, Dm), dt, CaseKind::odd);
    // Pointers off 16 bytes (widths that would take the vector path).
    for (const auto& [a, m, o] : {std::tuple<int64_t, int64_t, int64_t>{1, 0, 0}, {0, 3, 0}, {0, 0, 1}, {8, 8, 16}})
      add(with(shape(2, 17, 256, 768), {{.name = "attn", .offset = a}, {.name = "mlp", .offset = m},
                                         {.name = "out", .offset = o}}),
          dt, a % 8 || m % 8 || o % 16 ? CaseKind::misaligned : CaseKind::odd);
  }
  // The widths at 256 tokens and one token, div_full: the oracle checks each on the CPU.
  for (const auto& [Da, Dm, tokens, reciprocal] :
       {std::tuple<int64_t, int64_t, int64_t, const char*>{6144, 18432, 256, "ieee"}, {3072, 9216, 256, "ieee"},
        {3072, 9216, 1, "ieee"}, {6144, 18432, 64, "div_full"}}) {
    Row r = with(shape(1, tokens, Da, Dm), {}, reciprocal);
    r.large = false;
    add(r, DType::bf16);
  }
  // Odd widths at other scales (1.0 with div_full), three tokens, and a batch of three tokens of one.
  for (DType dt : {DType::bf16, DType::f16})
    for (const auto& [Da, Dm] : {std::pair<int64_t, int64_t>{5, 7}, {6143, 18433}, {16, 1}, {1, 16}, {0, 24},
                                 {24, 0}, {17, 31}, {3072, 9217}})
      for (double s : {0.013, 1.0, 3.7, 0x1p-10})
        add(with(shape(1, 3, Da, Dm), {scale(s)}, s == 1.0 ? "div_full" : "ieee"), dt, CaseKind::odd);
  add(with(shape(3, 1, 5, 7), {scale(0.5)}), std::nullopt, CaseKind::odd);
  // Odd widths with pointers off 16 bytes (attn by an element and out by 16 bytes; mlp by three
  // and out by one), both reciprocals; one call without PDL.
  for (DType dt : {DType::bf16, DType::f16})
    for (const auto& [Da, Dm] : {std::pair<int64_t, int64_t>{5, 7}, {6143, 18433}, {16, 1}, {0, 24}, {24, 0},
                                 {17, 31}, {3072, 9216}})
      for (int misalign : {0, 1, 2})
        for (const char* reciprocal : {"ieee", "div_full"}) {
          const int64_t a = misalign == 1 ? 1 : 0, m = misalign == 2 ? 3 : 0;
          const int64_t o = misalign == 2 ? 1 : misalign == 1 ? 16 : 0;
          add(with(shape(2, 33, Da, Dm),
                   {{.name = "attn", .offset = a}, {.name = "mlp", .offset = m}, {.name = "out", .offset = o},
                    scale(misalign == 0 ? 0.013 : misalign == 1 ? 1.0 : 3.7)},
                   reciprocal),
              dt, a % 8 || m % 8 || o % 16 ? CaseKind::misaligned : CaseKind::odd);
        }
  {
    Row r = shape(1, 129, 6144, 18432);
    r.options = {{"use_pdl", "false"}};
    add(r);
  }
  // Special values at scale 1: signed zeros, bf16 subnormals (e4m3 zeros), the e4m3 rounding
  // midpoints (ties to even), 2^-10 and its neighbours, +-448 and the midpoint beyond it, 480
  // (eager's cast alone would give NaN), ~1e30, +-Inf and NaN of both signs; mlp in reverse order.
  const std::vector<uint64_t> specials = {0x0000, 0x8000, 0x0001, 0x8001, 0x3F88, 0x3F98, 0xBF98, 0x3A80,
                                          0xBA80, 0x3AC0, 0x3B40, 0x3C70, 0x43E0, 0xC3E0, 0x43E8, 0x43F0,
                                          0x7149, 0xF149, 0x7F80, 0xFF80, 0x7FC0, 0xFFC0, 0x4348, 0x4378};
  const auto n = static_cast<int64_t>(specials.size());
  add(with(shape(1, 1, n, n), {{.name = "attn", .fill = Fill::bits(specials)},
                               {.name = "mlp", .fill = Fill::bits({specials.rbegin(), specials.rend()})}, scale(1.0)}),
      std::nullopt, CaseKind::odd);
  // f16: its subnormals, the largest finite value, 2^-8 and -Inf.
  add(with(shape(1, 1, 4, 1), {{.name = "attn", .fill = Fill::bits({0x0001, 0x8001, 0x7BFF, 0x1C00})},
                               {.name = "mlp", .fill = Fill::bits({0xFC00})}, scale(1.0)}),
      DType::f16, CaseKind::odd);
  for (DType dt : {DType::bf16, DType::f16})
    for (double s : {1.0, 0.013})
      add(with(shape(2, 5, 64, 63), {{.name = "attn", .fill = Fill::special(3.0)},
                                     {.name = "mlp", .fill = Fill::special(1.5)}, scale(s)}),
          dt, CaseKind::odd);
  add(shape(1, 0, 64, 192), std::nullopt, CaseKind::empty);
  // out over an input's bytes, and invalid inputs: refused before anything is written.
  for (const char* input : {"attn", "mlp"})
    rows.push_back({.dims = {{"B", 1}, {"S", 4}, {"Da", 64}, {"Dm", 64}}, .kind = CaseKind::aliased,
                    .tensors = {{.name = "out", .storage = input}}, .name = std::string("out_overlaps_") + input,
                    .invalid = {std::string(input) + " overlaps out in memory"}});
  const Dims small = {{"B", 2}, {"S", 8}, {"Da", 32}, {"Dm", 48}};
  for (const auto& [name, kind, tensors, invalid] :
       std::vector<std::tuple<std::string, CaseKind, std::vector<RowTensor>, std::vector<std::string>>>{
           {"mlp_dtype_differs", CaseKind::invalid, {{.name = "mlp", .dtype = DType::f16}}, {"mlp.dtype must be bf16", "f16"}},
           {"tokens_differ", CaseKind::invalid, {{.name = "mlp", .shape = {{2, 9, 48}}}}, {"mlp.shape[1] must equal S=8", "9"}},
           {"batch_differs", CaseKind::invalid, {{.name = "mlp", .shape = {{3, 8, 48}}}}, {"mlp.shape[0] must equal B=2", "3"}},
           {"out_width_wrong", CaseKind::invalid, {{.name = "out", .shape = {{2, 8, 79}}}},
            {"out.shape[2] must equal Da+Dm=80", "79"}},
           {"out_bf16", CaseKind::invalid, {{.name = "out", .dtype = DType::bf16}}, {"out.dtype must be f8e4m3fn", "bf16"}},
           {"two_scales", CaseKind::invalid, {{.name = "input_scale", .shape = {{2}}}},
            {"input_scale must have exactly 1 element", "2"}},
           {"f32_inputs", CaseKind::invalid, {{.name = "attn", .dtype = DType::f32}, {.name = "mlp", .dtype = DType::f32}},
            {"attn.dtype must be", "f32"}},
           {"scale_f16", CaseKind::invalid, {{.name = "input_scale", .dtype = DType::f16}},
            {"input_scale.dtype must be f32", "f16"}},
           {"out_tokens_differ", CaseKind::invalid, {{.name = "out", .shape = {{2, 7, 80}}}},
            {"out.shape[1] must equal S=8", "but is 7"}},
           {"attn_strided", CaseKind::invalid, {{.name = "attn", .strides = {8 * 48, 48, 1}}}, {"attn must be contiguous"}},
           {"out_strided", CaseKind::invalid, {{.name = "out", .strides = {8 * 81, 81, 1}}}, {"out must be contiguous"}},
           {"scale_inside_out", CaseKind::aliased, {{.name = "input_scale", .storage = "out"}},
            {"input_scale overlaps out in memory"}},
           {"rank_2", CaseKind::invalid,
            {{.name = "attn", .shape = {{16, 32}}}, {.name = "mlp", .shape = {{16, 48}}}, {.name = "out", .shape = {{16, 80}}}},
            {"attn must have rank 3 but has rank 2"}}})
    rows.push_back({.dims = small, .kind = kind, .tensors = tensors, .name = name, .invalid = invalid});
  uint32_t seed = 1;
  std::vector<OpCase> out = table_cases("token_cat_fp8", table, rows, seed);
  // div_full's inverse may be an ulp from the reference's IEEE division: a byte one code off.
  for (OpCase& c : out)
    for (const auto& [option, value] : c.options)
      if (option == "fp8_reciprocal" && value == "div_full") c.tolerance = {1, 0.0, 0.05, 16};
  // Every model case again with each pointer an element off its alignment (the scalar path).
  add_variants(out, {{"attn", "mlp", "out"}});
  return out;
}

const CaseSet kCases("token_cat_fp8", make);

void tc_oracle(OracleIo& io) {
  const int attn = io.id("attn"), mlp = io.id("mlp"), out = io.id("out");
  const double inv = testing_oracle::ieee_inverse(io.in(io.id("input_scale"), 0));
  const int64_t Da = io.shape(attn)[2], Dm = io.shape(mlp)[2], rows = io.numel(out) / std::max<int64_t>(Da + Dm, 1);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < Da + Dm; ++c) {
      const double x = c < Da ? io.in(attn, r * Da + c) : io.in(mlp, r * Dm + c - Da);
      io.expect(out, r * (Da + Dm) + c, testing_oracle::round_e4m3_saturated(testing_oracle::round_f32(x * inv)));
    }
}

const OracleSet kOracle("token_cat_fp8", {"float64 transcription of the static fp8 quantization", tc_oracle});

}  // namespace
}  // namespace ditops::optest
