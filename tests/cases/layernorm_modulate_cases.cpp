// The layernorm_modulate family's cases: layernorm_modulate and layernorm_modulate_fp8 (scale
// and shift as chunks of one adaLN modulation projection, both row mappings, amplitudes
// 1e-4..100, in place, stats_out, special scales and signed zeros, wider chunk strides) and
// qk_head_layernorm (GQA, in place); empty, overlapping and invalid calls. The mappings give the
// same bytes (related cases, on a device too).
//
// The oracles (below the cases): float64 LayerNorm and modulation within the rounding steps'
// bound; the eager rounding steps from aten's statistics (src/reference/aten_layer_norm.h, checked
// against an independent simulation of aten's threads by tests/test_layernorm_modulate.cpp)
// exactly, and the statistics themselves (rstd within 2 fp32 ulp on a device, where MUFU.RSQ
// computes it); and the eager steps from each implementation's own stats_out, exactly.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "op_test_driver.h"
#include "reference/aten_layer_norm.h"
#include "rounding_oracle.h"

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
  int64_t chunk_stride = 0;  // > 0: scale at column 0 and shift at this column of rows of 2 x it
  bool rowwise = false;      // layernorm_modulate_fp8_rowwise (input_scale unused)
};

// The reference's rstd is correctly rounded where the GPU uses MUFU.RSQ (<= 2 fp32 ulp): an
// element may move by one bf16 ulp of the normalized value, carried through (1 + scale) and the
// shift (|d| <= 2^-6 (|y (1 + scale)| + |out|)); stats may differ in rstd's last two bits.
Tolerance close_bf16() { return {2, 8.0, 0.02, 16}; }

OpCase ln_case(const Ln& s, CaseKind kind, uint32_t seed) {
  const bool fp8 = s.input_scale > 0 && !s.rowwise;
  const int64_t chunks = s.shift ? 6 : 4;  // scale/shift are chunks of a [B, chunks * D] projection
  const int64_t row = s.chunk_stride ? 2 * s.chunk_stride : chunks * s.D, shift_at = s.chunk_stride ? s.chunk_stride : s.D;
  OpCase c{.op = fp8 ? "layernorm_modulate_fp8" : s.rowwise ? "layernorm_modulate_fp8_rowwise" : "layernorm_modulate",
           .kind = kind,
           .seed = seed};
  char amp[32];
  std::snprintf(amp, sizeof amp, "%g", s.amplitude);
  c.name = "B" + std::to_string(s.B) + "_S" + std::to_string(s.S) + "_D" + std::to_string(s.D) +
           (s.shift ? "_shift" : "") + "_amp" + amp + "_" + s.mapping + (s.in_place ? "_in_place" : "") +
           (s.stats ? "_stats" : "") + (fp8 ? std::string("_s") + std::to_string(s.input_scale) + "_" + s.reciprocal : "") +
           (s.chunk_stride ? "_chunks_of_" + std::to_string(s.chunk_stride) : "");
  TensorCase x{"x", DType::bf16, {s.B, s.S, s.D}};
  x.fill = Fill::normal(s.amplitude, 0.3);
  TensorCase scale{"scale", DType::bf16, {s.B, s.D}, {row, 1}};
  scale.fill = Fill::normal(0.3);
  c.tensors = {x, scale};
  if (s.shift) c.tensors.push_back({"shift", DType::bf16, {s.B, s.D}, {row, 1}, "scale", shift_at});
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
  if (s.rowwise) {
    // The e4m3 bytes follow y, which may move by y's bound (2 ulps at max(|y|, 8)): times 448 / amax
    // in the quantized domain, so below 64 a code compares at 64's ulp (amax >= 4 at these fills;
    // H200: 3 codes at a cancelling shift). The row's scale follows its amax by as many bf16 steps
    // (2^16 fp32 ulps each, below 8 / 448 at that floor's) plus its own rounding.
    c.tolerance_for.push_back({"out", {2, 64.0, 0.1, 64}});
    c.tolerance_for.push_back({"out_scale", {3 * 65536, 8.0 / 448, 0.05, 2}});
  }
  c.large = s.B * s.S * s.D > (1 << 21);
  return c;
}

OpCase qk_case(int64_t B, int64_t S, int64_t H, int64_t Hk, int64_t Dh, bool in_place, CaseKind kind, uint32_t seed) {
  OpCase c{.op = "qk_head_layernorm", .kind = kind, .seed = seed};
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
      for (bool shift : {true, false}) {
        std::string warp;  // the mappings give the same bytes
        for (const char* mapping : {"warp", "cta", "automatic"}) {
          Ln s{B, S, D, shift, amp, eps, mapping};
          s.stats = mapping[0] == 'w';
          OpCase c = ln_case(s, D % 64 == 0 && S > 1 ? CaseKind::model : CaseKind::odd, seed++);
          if (warp.empty()) warp = c.name;
          else c.same_as = {warp};
          out.push_back(c);
        }
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
          s.stats = true;  // the fp8 bytes follow from the call's own statistics, on a device too
          OpCase c = ln_case(s, CaseKind::model, seed++);
          // div.full's inverse may differ by an ulp from the reference's IEEE division, and with
          // the bf16 value's own ulp that may move a code by two (H200: 2 of 245760 at s=0.4754).
          c.tolerance_for.push_back({"out", {2, 0.0, 0.05, 16}});
          out.push_back(c);
        }
  // fp8_rowwise: the model widths (FLUX.1 / Qwen-Image / HunyuanVideo 3072, FLUX.2 6144, 8192), both
  // mappings, shift on and off, amplitudes 1e-4 to 100; the full FLUX.1 and Qwen-Image CFG calls
  // (large); odd widths; chunk views; zero rows (scale -1 makes every value a zero).
  for (auto [B, S, D] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {1, 33, 3072}, {2, 17, 6144}, {1, 9, 8192}, {2, 5, 516}, {3, 4, 12}, {1, 4608, 3072}, {2, 6912, 3072},
           {1, 512, 3072}})
    for (auto [amp, eps] : std::vector<std::pair<double, double>>{{1e-4, 1e-6}, {1.0, 1e-6}, {100.0, 1e-5}})
      for (bool shift : {true, false}) {
        if (B * S * D > (1 << 21) && (amp != 1.0 || !shift)) continue;
        std::string warp;
        for (const char* mapping : {"warp", "cta"}) {
          Ln s{B, S, D, shift, amp, eps, mapping};
          s.rowwise = true;
          s.stats = mapping[0] == 'w';
          OpCase c = ln_case(s, D % 64 == 0 && S > 1 ? CaseKind::model : CaseKind::odd, seed++);
          if (warp.empty()) warp = c.name;
          else c.same_as = {warp};
          out.push_back(c);
        }
      }
  {
    Ln s{1, 7, 3072, true, 1.0, 1e-5, "automatic", 0, "ieee", false, true, 3 * 3072};
    s.rowwise = true;
    out.push_back(ln_case(s, CaseKind::strided, seed++));
    Ln z{2, 3, 256, false};
    z.rowwise = true;
    OpCase c = ln_case(z, CaseKind::odd, seed++);
    c.name += "_zero_rows";
    c.tensors[1].fill = Fill::constant(-1.0);  // 1 + scale = 0: every value a signed zero, scale 1
    out.push_back(c);
    Ln e{2, 0, 256};
    e.rowwise = true;
    out.push_back(ln_case(e, CaseKind::empty, seed++));
    Ln a{2, 8, 256};
    a.rowwise = true;
    c = ln_case(a, CaseKind::aliased, seed++);
    c.name = "fp8_rowwise_out_over_x";
    c.tensors.push_back({"out", DType::f8e4m3fn, {2, 8, 256}, {}, "x"});
    c.invalid = {"out (fp8) must not overlap x"};
    out.push_back(c);
    c = ln_case(a, CaseKind::invalid, seed++);
    c.name = "fp8_rowwise_scale_shape";
    c.tensors.push_back({"out_scale", DType::f32, {2, 8}});
    c.invalid = {"out_scale must have rank 3 but has rank 2"};
    out.push_back(c);
    c = ln_case(a, CaseKind::aliased, seed++);
    c.name = "fp8_rowwise_scale_inside_out";
    c.tensors.push_back({"out", DType::f8e4m3fn, {2, 8, 256}});
    c.tensors.push_back({"out_scale", DType::f32, {2, 8, 1}, {}, "out"});
    c.invalid = {"out_scale overlaps out in memory"};
    out.push_back(c);
  }
  // The eager steps over scale and shift as chunks 3 D apart (rows of 6 D), 6 D apart, adjacent,
  // 4 D apart; the fp8 quantization of amplitude-30 values (the clamp reached at 0.005).
  for (const Ln& s : {Ln{1, 7, 3072, true, 1.0, 1e-5, "automatic", 0, "ieee", false, false, 3 * 3072},
                      Ln{2, 5, 2240, false, 1.0, 1e-5, "automatic", 0, "ieee", false, false, 6 * 2240},
                      Ln{2, 3, 516, true, 1.0, 1e-5, "automatic", 0, "ieee", false, false, 516},
                      Ln{1, 1, 128, true, 1.0, 1e-5, "automatic", 0, "ieee", false, false, 4 * 128}})
    out.push_back(ln_case(s, CaseKind::strided, seed++));
  for (double is : {0.005, 0.03125, 0.4754464328289032, 1.0}) {
    Ln s{2, 9, 6144, true, 30.0, 1e-6, "automatic", is, "ieee", false, false, 2 * 6144};
    out.push_back(ln_case(s, CaseKind::strided, seed++));
  }
  // Special scales and signed zeros: a row [1, -1, 0, 0, ...] has mean 0, so its zeros normalize
  // to +0; scale -1 makes (1 + scale) 0 (zeros with y's sign), 0 keeps y, 1 doubles it exactly; a
  // +0 shift turns -0 into +0, a -0 shift keeps it.
  for (double scale : {-2.0, -1.0, 0.0, 1.0})
    for (int shift : {0, 1, 2}) {  // none, +0, -0
      Ln s{1, 1, 8, shift != 0};
      OpCase c = ln_case(s, CaseKind::odd, seed++);
      c.name = "special_scale_" + std::to_string(static_cast<int>(scale)) +
               (shift == 0 ? "" : shift == 1 ? "_shift_plus_0" : "_shift_minus_0");
      c.tensors[0].fill = Fill::bits({0x3F80, 0xBF80, 0x0000, 0x0000});
      c.tensors[1].fill = Fill::constant(scale);
      // scale and shift share one buffer: its fill is scale's; shift's elements get their own value
      if (shift != 0) {
        c.tensors[1].strides = {8, 1};
        c.tensors[2] = TensorCase{"shift", DType::bf16, {1, 8}};
        c.tensors[2].fill = Fill::bits({shift == 1 ? uint64_t{0x0000} : uint64_t{0x8000}});
      }
      out.push_back(c);
    }
  // In place (out is x): equal to the out-of-place result.
  {
    Ln s{1, 4, 1024};
    s.in_place = true;
    out.push_back(ln_case(s, CaseKind::aliased, seed++));
  }
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
    c = ln_case({2, 4, 96}, CaseKind::invalid, seed++);
    c.name = "D_90_in_rows_of_96";
    c.tensors[0].shape = {2, 4, 90};
    c.tensors[0].strides = {4 * 96, 96, 1};
    c.invalid = {"x.shape[2] (D) must be a multiple of 4", "but is 90"};
    out.push_back(c);
    c = ln_case({2, 4, 96}, CaseKind::invalid, seed++);
    c.name = "shift_of_stride_2";
    c.tensors[2].strides = {6 * 96, 2};
    c.invalid = {"shift.stride"};
    out.push_back(c);
    c = ln_case({2, 4, 96}, CaseKind::invalid, seed++);
    c.name = "x_f32";
    c.tensors[0].dtype = DType::f32;
    c.invalid = {"x.dtype must be bf16 but is f32"};
    out.push_back(c);
    c = ln_case({2, 4, 96}, CaseKind::invalid, seed++);
    c.name = "out_rows_overlapping";
    c.tensors.push_back({"out", DType::bf16, {2, 4, 96}, {4 * 96, 8, 1}});
    c.invalid = {"out.stride(1) must be >= D=96"};
    out.push_back(c);
    Ln q{2, 4, 96};
    q.input_scale = 0.5;
    c = ln_case(q, CaseKind::invalid, seed++);
    c.name = "fp8_two_input_scales";
    c.tensors[3].shape = {2};
    c.invalid = {"input_scale must have exactly 1 element but has 2"};
    out.push_back(c);
    c = ln_case(q, CaseKind::invalid, seed++);
    c.name = "fp8_out_bf16";
    c.tensors.push_back({"out", DType::bf16, {2, 4, 96}});
    c.invalid = {"out.dtype must be f8e4m3fn but is bf16"};
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
  for (bool in_place : {false, true}) out.push_back(qk_case(2, 3, 4, 2, 40, in_place, CaseKind::odd, seed++));
  out.push_back(qk_case(1, 0, 24, 24, 128, false, CaseKind::empty, seed++));
  {
    OpCase c = qk_case(1, 4, 2, 2, 132, false, CaseKind::invalid, seed++);
    c.name = "head_dim_132";
    c.invalid = {"q.shape[3] (head_dim) must be a multiple of 4 in [4, 128] but is 132"};
    out.push_back(c);
    c = qk_case(2, 3, 4, 4, 136, false, CaseKind::invalid, seed++);
    c.name = "head_dim_136";
    c.invalid = {"q.shape[3] (head_dim) must be a multiple of 4 in [4, 128] but is 136"};
    out.push_back(c);
    c = qk_case(2, 3, 4, 4, 128, false, CaseKind::invalid, seed++);
    c.name = "batch_not_collapsing_into_tokens";
    c.tensors[0].strides = {5000, 4 * 128, 128, 1};
    c.invalid = {"q.stride(0) must be S * stride(1) = 1536"};
    out.push_back(c);
    c = qk_case(2, 3, 4, 4, 128, false, CaseKind::aliased, seed++);
    c.name = "k_out_is_q_out";
    c.tensors.push_back({"q_out", DType::bf16, {2, 3, 4, 128}});
    c.tensors.push_back({"k_out", DType::bf16, {2, 3, 4, 128}, {}, "q_out"});
    c.invalid = {"must not overlap"};
    out.push_back(c);
  }
  return out;
}

const CaseSet kCases("layernorm_modulate", make);

using testing_oracle::round_dtype;
using testing_oracle::round_e4m3_saturated;
using testing_oracle::round_f32;

float bf16r(float v) { return static_cast<float>(round_dtype(v, DType::bf16)); }

// A row's bf16 bits, for aten's statistics twin.
std::vector<uint16_t> row_bits(const OracleIo& io, int t, int64_t first, int64_t n) {
  std::vector<uint16_t> bits(n);
  for (int64_t i = 0; i < n; ++i) bits[i] = static_cast<uint16_t>(io.bits(t, first + i));
  return bits;
}

// The op's tensors and options, for every oracle of the family.
struct LnCall {
  bool qk, fp8, rowwise;
  int x, scale, shift, out, stats, input_scale, out_scale;
  int64_t rows, S, D;
  float eps;
  double inv;  // fp8: fl32(1 / input_scale)
};

LnCall ln_call(const OracleIo& io) {
  LnCall c;
  c.qk = io.has("q");
  c.eps = std::stof(io.option("eps"));
  if (c.qk) return c;
  c.x = io.id("x");
  c.scale = io.id("scale");
  c.shift = io.id("shift");
  c.out = io.id("out");
  c.stats = io.id("stats_out");
  c.input_scale = io.id("input_scale");
  c.out_scale = io.id("out_scale");
  c.fp8 = c.input_scale >= 0;
  c.rowwise = c.out_scale >= 0;
  c.S = io.shape(c.x)[1];
  c.D = io.shape(c.x)[2];
  c.rows = io.shape(c.x)[0] * c.S;
  c.inv = c.fp8 ? testing_oracle::ieee_inverse(io.in(c.input_scale, 0)) : 0;
  return c;
}

// The eager steps of one element from the row's statistics (fp32 as aten computes them):
// y = bf16(rstd (x - mean)), bf16(y bf16(1 + scale)), + shift; fp8: the static quantization of it.
double eager_steps(const OracleIo& io, const LnCall& c, int64_t r, int64_t i, float mean, float rstd) {
  const int64_t b = r / c.S;
  const float x = static_cast<float>(io.in(c.x, r * c.D + i));
  const float y = bf16r(rstd * (x - mean));
  const float op = bf16r(1.0f + static_cast<float>(io.in(c.scale, b * c.D + i)));
  float v = bf16r(y * op);
  if (c.shift >= 0) v = bf16r(v + static_cast<float>(io.in(c.shift, b * c.D + i)));
  if (!c.fp8) return v;
  return round_e4m3_saturated(round_f32(v * c.inv));
}

// A row's expectations from its statistics by the eager steps: each element's, or with the rowwise
// output the recipe over the row's bf16 values (the scale in double: bf16(amax * fp32(1/448)), 1 for 0).
void expect_row(OracleIo& io, const LnCall& c, int64_t r, float mean, float rstd) {
  if (!c.rowwise) {
    for (int64_t i = 0; i < c.D; ++i) io.expect(c.out, r * c.D + i, eager_steps(io, c, r, i, mean, rstd));
    return;
  }
  std::vector<double> v(static_cast<size_t>(c.D));
  double amax = 0;
  for (int64_t i = 0; i < c.D; ++i) {
    v[static_cast<size_t>(i)] = eager_steps(io, c, r, i, mean, rstd);
    amax = std::fmax(amax, std::fabs(v[static_cast<size_t>(i)]));
  }
  double s = round_dtype(round_f32(amax * round_f32(1.0 / 448.0)), DType::bf16);
  if (s == 0) s = 1;
  io.expect(c.out_scale, r, s);
  for (int64_t i = 0; i < c.D; ++i) io.expect(c.out, r * c.D + i, round_e4m3_saturated(round_f32(v[static_cast<size_t>(i)] / s)));
}

// float64 LayerNorm, modulated in double: within the bf16 steps' roundings (four of 2^-8 on
// |y (1 + scale)|, one on |out|) and the statistics' fp32 error (AtenStats: rstd 2^-14 relative).
void ln_float64(OracleIo& io) {
  const LnCall c = ln_call(io);
  auto stats = [&](int t, int64_t first, int64_t n) {
    double mean = 0, var = 0;
    for (int64_t i = 0; i < n; ++i) mean += io.in(t, first + i);
    mean /= static_cast<double>(n);
    for (int64_t i = 0; i < n; ++i) var += (io.in(t, first + i) - mean) * (io.in(t, first + i) - mean);
    return std::pair<double, double>{mean, 1.0 / std::sqrt(var / static_cast<double>(n) + c.eps)};
  };
  if (c.qk) {
    for (const auto& [in, out] : {std::pair<const char*, const char*>{"q", "q_out"}, {"k", "k_out"}}) {
      const int t = io.id(in), o = io.id(out);
      const int64_t Dh = io.shape(t)[3], rows = io.numel(t) / std::max<int64_t>(Dh, 1);
      for (int64_t r = 0; r < rows; ++r) {
        const auto [mean, rstd] = stats(t, r * Dh, Dh);
        for (int64_t i = 0; i < Dh; ++i) {
          const double y = (io.in(t, r * Dh + i) - mean) * rstd;
          io.expect(o, r * Dh + i, y, 0x1p-7 * std::fabs(y) + 1e-5);
        }
      }
    }
    return;
  }
  for (int64_t r = 0; r < c.rows; ++r) {
    const int64_t b = r / io.shape(c.x)[1];
    const auto [mean, rstd] = stats(c.x, r * c.D, c.D);
    for (int64_t i = 0; i < c.D; ++i) {
      const double y = (io.in(c.x, r * c.D + i) - mean) * rstd;
      const double ym = y * (1.0 + io.in(c.scale, b * c.D + i));
      const double v = ym + (c.shift >= 0 ? io.in(c.shift, b * c.D + i) : 0.0);
      io.expect(c.out, r * c.D + i, v, 0x1p-6 * std::fabs(ym) + 0x1p-7 * std::fabs(v) + 1e-5);
    }
  }
}

// The eager steps from aten's statistics, exactly; the statistics themselves: mean exactly, rstd
// within 2 fp32 ulp (a device's MUFU.RSQ against the twin's correctly rounded rsqrt).
void ln_eager_steps(OracleIo& io) {
  const LnCall c = ln_call(io);
  if (c.qk) {
    for (const auto& [in, out] : {std::pair<const char*, const char*>{"q", "q_out"}, {"k", "k_out"}}) {
      const int t = io.id(in), o = io.id(out);
      const int64_t Dh = io.shape(t)[3], rows = io.numel(t) / std::max<int64_t>(Dh, 1);
      for (int64_t r = 0; r < rows; ++r) {
        const ref::RowStats st = ref::aten_row_stats_bf16(row_bits(io, t, r * Dh, Dh).data(), Dh, c.eps);
        for (int64_t i = 0; i < Dh; ++i)
          io.expect(o, r * Dh + i, bf16r(st.rstd * (static_cast<float>(io.in(t, r * Dh + i)) - st.mean)));
      }
    }
    return;
  }
  for (int64_t r = 0; r < c.rows; ++r) {
    const ref::RowStats st = ref::aten_row_stats_bf16(row_bits(io, c.x, r * c.D, c.D).data(), c.D, c.eps);
    expect_row(io, c, r, st.mean, st.rstd);
  }
}

void ln_statistics(OracleIo& io) {
  const LnCall c = ln_call(io);
  for (int64_t r = 0; r < c.rows; ++r) {
    const ref::RowStats st = ref::aten_row_stats_bf16(row_bits(io, c.x, r * c.D, c.D).data(), c.D, c.eps);
    io.expect(c.stats, 2 * r, st.mean, 0);
    io.expect(c.stats, 2 * r + 1, st.rstd, 2 * (std::nextafter(st.rstd, INFINITY) - st.rstd));
  }
}

// out from the call's own stats_out by the eager steps, exactly (an implementation's rstd may
// differ from the twin's; what it does with it may not).
void ln_own_statistics(OracleIo& io) {
  const LnCall c = ln_call(io);
  for (int64_t r = 0; r < c.rows; ++r) {
    const float mean = static_cast<float>(io.out(c.stats, 2 * r)), rstd = static_cast<float>(io.out(c.stats, 2 * r + 1));
    expect_row(io, c, r, mean, rstd);
  }
}

// The grid's other mappings write the warp case's bytes (related cases, on every implementation):
// the oracles check one case of each group.
bool checked(const OpCase& c) { return c.invalid.empty() && !c.large && c.same_as.empty(); }

bool has_stats(const OpCase& c) {
  if (!checked(c)) return false;
  bool stats = false, div_full = false;
  for (const TensorCase& t : c.tensors) stats = stats || t.name == "stats_out";
  for (const auto& [name, text] : c.options) div_full = div_full || (name == "fp8_reciprocal" && text == "div_full");
  return stats && !div_full;  // div.full's inverse on a device is not the IEEE one
}

bool not_fp8(const OpCase& c) {
  return checked(c) && c.op != "layernorm_modulate_fp8" && c.op != "layernorm_modulate_fp8_rowwise";
}

const Oracle kFloat64{.name = "float64 LayerNorm and modulation within the rounding steps' bound",
                      .expect = ln_float64,
                      .applies = not_fp8};
const Oracle kSteps{.name = "the eager steps from aten's statistics", .expect = ln_eager_steps, .applies = checked};
const Oracle kStatistics{.name = "aten's statistics: mean exact, rstd within 2 fp32 ulp",
                         .expect = ln_statistics,
                         .bounds_implementations = true,
                         .applies = has_stats};
const Oracle kOwnStatistics{.name = "the eager steps from the call's own stats_out",
                            .expect = ln_own_statistics,
                            .on_own_outputs = true,
                            .applies = has_stats};
const OracleSet kOracles[] = {
    {"layernorm_modulate", kFloat64},          {"layernorm_modulate", kSteps},
    {"layernorm_modulate", kStatistics},       {"layernorm_modulate", kOwnStatistics},
    {"layernorm_modulate_fp8", kSteps},        {"layernorm_modulate_fp8", kStatistics},
    {"layernorm_modulate_fp8", kOwnStatistics}, {"layernorm_modulate_fp8_rowwise", kSteps},
    {"layernorm_modulate_fp8_rowwise", kStatistics}, {"layernorm_modulate_fp8_rowwise", kOwnStatistics},
    {"qk_head_layernorm", kFloat64},
    {"qk_head_layernorm", kSteps}};

}  // namespace
}  // namespace ditops::optest
