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

#include "op_test_driver.h"
#include "rounding_oracle.h"

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
  // The widths at 256 tokens and one token, div_full (f16 below): the oracle checks each on
  // the CPU.
  for (const auto& [Da, Dm, tokens, dt, reciprocal] :
       {std::tuple<int64_t, int64_t, int64_t, DType, const char*>{6144, 18432, 256, DType::bf16, "ieee"},
        {3072, 9216, 256, DType::bf16, "ieee"}, {3072, 9216, 1, DType::bf16, "ieee"},
        {6144, 18432, 64, DType::bf16, "div_full"}}) {
    Tc s;
    s.S = tokens;
    s.Da = Da;
    s.Dm = Dm;
    s.dtype = dt;
    s.reciprocal = reciprocal;
    OpCase c = tc_case(s, CaseKind::model, seed++);
    c.large = false;
    out.push_back(c);
  }
  // Odd widths at other scales (1.0 with div_full), three tokens, and a batch of three tokens of one.
  for (DType dt : {DType::bf16, DType::f16})
    for (const auto& [Da, Dm] : {std::pair<int64_t, int64_t>{5, 7}, {6143, 18433}, {16, 1}, {1, 16}, {0, 24},
                                 {24, 0}, {17, 31}, {3072, 9217}})
      for (double scale : {0.013, 1.0, 3.7, 0x1p-10}) {
        Tc s;
        s.S = 3;
        s.Da = Da;
        s.Dm = Dm;
        s.dtype = dt;
        s.scale = scale;
        s.reciprocal = scale == 1.0 ? "div_full" : "ieee";
        add(s, CaseKind::odd);
      }
  {
    Tc s;
    s.B = 3;
    s.Da = 5;
    s.Dm = 7;
    s.scale = 0.5;
    add(s, CaseKind::odd);
  }
  // Odd widths with pointers off 16 bytes (attn by an element and out by 16 bytes; mlp by three
  // and out by one), both reciprocals; one call without PDL.
  for (DType dt : {DType::bf16, DType::f16})
    for (const auto& [Da, Dm] : {std::pair<int64_t, int64_t>{5, 7}, {6143, 18433}, {16, 1}, {0, 24}, {24, 0},
                                 {17, 31}, {3072, 9216}})
      for (int misalign : {0, 1, 2})
        for (const char* reciprocal : {"ieee", "div_full"}) {
          Tc s;
          s.dtype = dt;
          s.B = 2;
          s.S = 33;
          s.Da = Da;
          s.Dm = Dm;
          s.attn_off = misalign == 1 ? 1 : 0;
          s.mlp_off = misalign == 2 ? 3 : 0;
          s.out_off = misalign == 2 ? 1 : misalign == 1 ? 16 : 0;
          s.scale = misalign == 0 ? 0.013 : misalign == 1 ? 1.0 : 3.7;
          s.reciprocal = reciprocal;
          const bool off = s.attn_off % 8 || s.mlp_off % 8 || s.out_off % 16;
          add(s, off ? CaseKind::misaligned : CaseKind::odd);
        }
  out.push_back(option_variant(tc_case(Tc{1, 129}, CaseKind::model, seed++), {{"use_pdl", "false"}}, "nopdl"));
  // Special values at scale 1: signed zeros, bf16 subnormals (e4m3 zeros), the e4m3 rounding
  // midpoints (ties to even), 2^-10 and its neighbours, +-448 and the midpoint beyond it, 480
  // (eager's cast alone would give NaN), ~1e30, +-Inf and NaN of both signs; mlp in reverse order.
  {
    const std::vector<uint64_t> specials = {0x0000, 0x8000, 0x0001, 0x8001, 0x3F88, 0x3F98, 0xBF98, 0x3A80,
                                            0xBA80, 0x3AC0, 0x3B40, 0x3C70, 0x43E0, 0xC3E0, 0x43E8, 0x43F0,
                                            0x7149, 0xF149, 0x7F80, 0xFF80, 0x7FC0, 0xFFC0, 0x4348, 0x4378};
    const int64_t n = static_cast<int64_t>(specials.size());
    Tc s;
    s.Da = n;
    s.Dm = n;
    s.scale = 1.0;
    OpCase c = tc_case(s, CaseKind::odd, seed++);
    c.name += "_special_bits";
    c.tensors[0].fill = Fill::bits(specials);
    c.tensors[1].fill = Fill::bits(std::vector<uint64_t>(specials.rbegin(), specials.rend()));
    out.push_back(c);
    // f16: its subnormals, the largest finite value, 2^-8 and -Inf.
    Tc h;
    h.Da = 4;
    h.Dm = 1;
    h.dtype = DType::f16;
    h.scale = 1.0;
    c = tc_case(h, CaseKind::odd, seed++);
    c.name += "_special_bits";
    c.tensors[0].fill = Fill::bits({0x0001, 0x8001, 0x7BFF, 0x1C00});
    c.tensors[1].fill = Fill::bits({0xFC00});
    out.push_back(c);
    for (DType dt : {DType::bf16, DType::f16})
      for (double scale : {1.0, 0.013}) {
        Tc v;
        v.B = 2;
        v.S = 5;
        v.Da = 64;
        v.Dm = 63;
        v.dtype = dt;
        v.scale = scale;
        c = tc_case(v, CaseKind::odd, seed++);
        c.name += "_special";
        c.tensors[0].fill = Fill::special(3.0);
        c.tensors[1].fill = Fill::special(1.5);
        out.push_back(c);
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
  c.invalid = {"out.shape[2] must equal Da+Dm=80", "79"};
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
  c.name = "scale_f16";
  c.tensors[2].dtype = DType::f16;
  c.invalid = {"input_scale.dtype must be f32", "f16"};
  out.push_back(c);
  c = tc_case(small, CaseKind::invalid, seed++);
  c.name = "out_tokens_differ";
  c.tensors[3].shape = {2, 7, 80};
  c.invalid = {"out.shape[1] must equal S=8", "but is 7"};
  out.push_back(c);
  c = tc_case(small, CaseKind::invalid, seed++);
  c.name = "attn_strided";
  c.tensors[0].strides = {8 * 48, 48, 1};
  c.invalid = {"attn must be contiguous"};
  out.push_back(c);
  c = tc_case(small, CaseKind::invalid, seed++);
  c.name = "out_strided";
  c.tensors[3].strides = {8 * 81, 81, 1};
  c.invalid = {"out must be contiguous"};
  out.push_back(c);
  c = tc_case(small, CaseKind::aliased, seed++);
  c.name = "scale_inside_out";
  std::swap(c.tensors[2], c.tensors[3]);  // out first: it owns the buffer
  c.tensors[3].storage = "out";
  c.invalid = {"input_scale overlaps out in memory"};
  out.push_back(c);
  c = tc_case(small, CaseKind::invalid, seed++);
  c.name = "rank_2";
  c.tensors[0].shape = {16, 32};
  c.tensors[1].shape = {16, 48};
  c.tensors[3].shape = {16, 80};
  c.invalid = {"attn must have rank 3 but has rank 2"};
  out.push_back(c);
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
