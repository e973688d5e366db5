// norm_scale_shift's cases: the GPU grid (LayerNorm / RMSNorm, residual + gate, affine weight and
// bias, every broadcast class of scale and gate, fp8 and NVFP4 outputs with and without y, all
// numerics, fp16/bf16/fp32, amplitudes 1e-4..100), Wan's float32 chains (norm1/norm3, norm2 with
// and without the gated residual, the cross-attention residual into norm3; f32 operands as chunks
// of [B, 6, D] and of [B, S, 6, D]), plus empty, overlapping and invalid calls; every broadcast class
// of scale and gate in both numerics, the statistics at f32, the NVFP4 padding rows and a zero
// row, eager against sglang (told apart).
//
// The oracles (below the cases): residual_out by each numerics' steps, exactly; y as float64
// LayerNorm / RMSNorm, affine and modulation, within a bound of the dtype's roundings and the
// statistics' fp32 error; the fp8 bytes as the static quantization of the reference's own y, and
// the NVFP4 blocks of it (block scales by ref::nvfp4_block_scale, codes by the E2M1 converter:
// both checked exhaustively by tests/test_norm_scale_shift.cpp), padding rows zero.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "ditops/norm_scale_shift.h"
#include "op_test_driver.h"
#include "reference/fp8_fp4.h"
#include "rounding_oracle.h"

namespace ditops::optest {
namespace {

struct Nss {
  int64_t B, S, D;
  DType dt = DType::bf16;
  const char* norm = "layer";
  const char* numerics = "eager";
  bool residual = false;
  int affine = 0;            // 0 none, 1 weight, 2 weight and bias
  const char* quant = "";    // "", "fp8", "nvfp4", "fp8_rowwise"
  int scale_class = 2;       // 0 scalar, 1 [D], 2 [B,1,D], 3 [B,S,D], 4 [B,F,1,D]; 7.. operand_shape
  double amplitude = 1.0, eps = 1e-6;
  bool without_y = false;    // quantized outputs only
  const char* e2m1 = "software";
  // Which operands are given (the float32 chain's sites leave some out) and their classes: -1 the
  // grid's defaults (shift [B,1,D], gate (scale_class + 2) % 5); 5 a chunk of [B, 6, D] ([B,1,D]
  // with strides (6D, D, 1)), 6 a chunk of [B, S, 6, D] squeezed ([B,S,D], strides (6SD, 6D, 1)).
  bool with_scale = true, with_shift = true, with_gate = true;
  int shift_class = -1, gate_class = -1;
  const char* norm_order = "aten";  // aten_mean: diffusers' RMSNorm (LTX-2)
};

std::vector<int64_t> operand_shape(int cls, int64_t B, int64_t S, int64_t D) {
  switch (cls) {
    case 0: return {};
    case 1: return {D};
    case 2: case 5: return {B, 1, D};
    case 3: case 6: return {B, S, D};
    case 7: return {1};                                 // scalar
    case 8: return {1, D};                              // per channel
    case 9: case 10: return {B, D};                     // per batch; 10: a chunk of [B, 6 D]
    case 11: return {1, 1, D};                          // per channel
    case 12: return {1, S, D};                          // per token
    case 13: return {1, S % 3 == 0 ? 3 : 1, 1, D};      // per frame
    default: return {B, S % 3 == 0 ? 3 : 1, 1, D};
  }
}

// An operand of class `cls`; classes 5 and 6 are chunk `chunk` of the modulation projection, held
// in the buffer of `owner` (the first chunked operand given) and viewed by the others.
TensorCase operand_case(const std::string& name, int cls, int chunk, DType dt, int64_t B, int64_t S, int64_t D,
                        const std::string& owner) {
  TensorCase t{name, dt, operand_shape(cls, B, S, D)};
  t.fill = Fill::normal(0.3);
  if (cls == 5) t.strides = {6 * D, D, 1};
  if (cls == 6) t.strides = {S * 6 * D, 6 * D, 1};
  if (cls == 10) t.strides = {6 * D, 1};
  if (cls == 5 || cls == 6) {
    t.offset = chunk * D;
    if (name != owner) t.storage = owner;
  }
  return t;
}

OpCase nss_case(const Nss& s, CaseKind kind, uint32_t seed) {
  OpCase c{.op = "norm_scale_shift", .kind = kind, .seed = seed};
  char amp[32];
  std::snprintf(amp, sizeof amp, "%g", s.amplitude);
  c.name = std::string(dtype_name(s.dt)) + "_B" + std::to_string(s.B) + "_S" + std::to_string(s.S) + "_D" +
           std::to_string(s.D) + "_" + s.norm + "_" + s.numerics + (s.residual ? "_residual" : "") +
           (s.affine ? "_affine" + std::to_string(s.affine) : "") + (*s.quant ? std::string("_") + s.quant : "") +
           "_scale" + std::to_string(s.scale_class) + "_amp" + amp + (s.without_y ? "_without_y" : "") +
           (std::string(s.quant) == "nvfp4" ? std::string("_e2m1_") + s.e2m1 : "") +
           (s.with_scale ? "" : "_no_scale") + (s.with_shift ? "" : "_no_shift") +
           (s.residual && !s.with_gate ? "_no_gate" : "") +
           (s.shift_class >= 0 ? "_shift" + std::to_string(s.shift_class) : "") +
           (s.gate_class >= 0 ? "_gate" + std::to_string(s.gate_class) : "") +
           (std::string(s.norm_order) == "aten" ? "" : std::string("_") + s.norm_order);
  // The float32 chain's operands, weight and bias are f32.
  const DType op_dt = std::string(s.numerics) == "float32" ? DType::f32 : s.dt;
  TensorCase x{"x", s.dt, {s.B, s.S, s.D}};
  x.fill = Fill::normal(s.amplitude, 0.25);
  const int shift_class = s.shift_class < 0 ? 2 : s.shift_class;
  const int gate_class = s.gate_class < 0 ? (s.scale_class + 2) % 5 : s.gate_class;
  const bool with_gate = s.residual && s.with_gate;
  auto chunked = [](int cls) { return cls == 5 || cls == 6; };
  const std::string owner = s.with_scale && chunked(s.scale_class)   ? "scale"
                            : s.with_shift && chunked(shift_class) ? "shift"
                                                                   : "gate";
  c.tensors = {x};
  // Wan's chunk order: shift, scale, gate (msa: 0, 1, 2).
  if (s.with_scale) c.tensors.push_back(operand_case("scale", s.scale_class, 1, op_dt, s.B, s.S, s.D, owner));
  if (s.with_shift) c.tensors.push_back(operand_case("shift", shift_class, 0, op_dt, s.B, s.S, s.D, owner));
  if (s.residual) {
    TensorCase residual{"residual", s.dt, {s.B, s.S, s.D}};
    residual.fill = Fill::normal(s.amplitude);
    c.tensors.push_back(residual);
    if (with_gate) c.tensors.push_back(operand_case("gate", gate_class, 2, op_dt, s.B, s.S, s.D, owner));
  }
  if (s.affine >= 1) {
    TensorCase w{"weight", op_dt, {s.D}};
    w.fill = Fill::normal(0.2, 5.0);  // 1 + 0.2 N
    c.tensors.push_back(w);
  }
  if (s.affine == 2) {
    TensorCase b{"bias", op_dt, {s.D}};
    b.fill = Fill::normal(0.1);
    c.tensors.push_back(b);
  }
  const std::string quant = s.quant;
  if (quant == "fp8") {
    TensorCase is{"input_scale", DType::f32, {1}};
    is.fill = Fill::constant(0.4754464328289032);
    c.tensors.push_back(is);
  }
  if (quant == "nvfp4") {
    TensorCase gs{"global_scale", DType::f32, {1}};
    gs.fill = Fill::constant(0.625);
    c.tensors.push_back(gs);
  }
  c.options = {{"norm", s.norm}, {"eps", std::to_string(s.eps)}, {"numerics", s.numerics}, {"e2m1", s.e2m1}};
  if (std::string(s.norm_order) != "aten") c.options.push_back({"norm_order", s.norm_order});
  if (!quant.empty()) c.options.push_back({"store_y", s.without_y ? "false" : "true"});
  if (quant == "fp8_rowwise") c.options.push_back({"rowwise_fp8", "true"});
  // The reference's rsqrt / rcp.approx / div.full are correctly rounded, the GPU's MUFU: where
  // rstd's last bit differs y moves by a few rounding steps at max(|y|, 1) (measured at most 5.87
  // half-ulps over the grid); an fp8 byte or NVFP4 code / scale may flip at a midpoint.
  // residual_out involves no approximation: bytes equal.
  c.tolerance = {4, 1.0, 0.02, 64};
  // An fp32 y keeps every bit of rstd's difference: most elements may differ, by a few steps
  // (tests/test_norm_scale_shift_gpu.cpp bounds the steps at 8; H200: up to 4 at 12.8 %).
  if (s.dt == DType::f32) c.tolerance = {8, 1.0, 1.0, 0};
  c.tolerance_for = {{"residual_out", {}}, {"fp8", {2, 0.0, 0.02, 64}}, {"nvfp4_packed", {1, 0.0, 0.02, 64}},
                     {"nvfp4_scales", {1, 0.0, 0.02, 16}},
                     // fp8_rowwise: the bytes follow y, which may move by y's bound (4 steps at max(|y|,
                     // 1)): times 448 / amax in the quantized domain, so below 32 a code compares at 32's
                     // ulp (amax >= 2 at these fills; H200: 4 codes at a cancelling shift). Where y is the
                     // row's amax the row's scale moves by as many steps of the dtype (a bf16 step is 2^16
                     // fp32 ulps) and every byte of that row by up to one code.
                     {"fp8_rowwise", {2, 32.0, 0.1, 64}}, {"fp8_scale", {5 * 65536, 0.0, 0.1, 4}}};
  c.large = s.B * s.S * s.D > (1 << 21);
  return c;
}

std::vector<OpCase> make() {
  std::vector<OpCase> out;
  uint32_t seed = 1;
  int k = 0;
  const double amps[] = {1e-4, 1.0, 100.0};
  const double epss[] = {1e-6, 1e-5};
  for (auto [B, S] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {2, 9}, {1, 257}, {3, 33}})
    for (int64_t D : {64, 2240, 3072, 5120})
      for (const char* norm : {"layer", "rms"})
        for (bool residual : {false, true}) {
          ++k;
          Nss s{B, S, D, DType::bf16, norm, "eager", residual, norm[0] == 'r' ? k % 2 : k % 3, "", k % 5,
                amps[k % 3], epss[k % 2]};
          out.push_back(nss_case(s, S == 1 || D == 64 ? CaseKind::odd : CaseKind::model, seed++));
        }
  for (DType dt : {DType::f16, DType::f32})
    for (int affine : {0, 1, 2}) {
      ++k;
      out.push_back(nss_case({2, 17, 1024, dt, "layer", "eager", true, affine, "", k % 5, amps[k % 3], 1e-5},
                             CaseKind::odd, seed++));
    }
  for (const char* numerics : {"eager", "sglang"})
    for (const char* quant : {"", "fp8", "nvfp4"})
      for (auto [B, S] : std::vector<std::pair<int64_t, int64_t>>{{1, 127}, {2, 65}}) {
        ++k;
        Nss s{B, S, 3072, DType::bf16, "layer", numerics, true, 0, quant, k % 5, amps[k % 3], 1e-6};
        out.push_back(nss_case(s, CaseKind::model, seed++));
        if (std::string(quant) == "nvfp4") {
          s.e2m1 = "automatic";  // the hardware conversion where the device has it
          out.push_back(nss_case(s, CaseKind::model, seed++));
        }
      }
  // More rows than resident CTAs; operands per batch, per token and per frame.
  out.push_back(nss_case({3, 700, 3072, DType::bf16, "layer", "eager", true, 0, "", 2, 1.0, 1e-6}, CaseKind::model, seed++));
  out.push_back(nss_case({3, 700, 3072, DType::bf16, "layer", "eager", false, 0, "nvfp4", 3, 1.0, 1e-6}, CaseKind::model, seed++));
  out.push_back(nss_case({128, 17, 1024, DType::bf16, "rms", "eager", true, 1, "fp8", 4, 100.0, 1e-5}, CaseKind::model, seed++));
  // Quantized outputs without y.
  out.push_back(nss_case({1, 127, 3072, DType::bf16, "layer", "eager", true, 0, "nvfp4", 2, 1.0, 1e-6, true}, CaseKind::model, seed++));
  out.push_back(nss_case({3, 700, 3072, DType::bf16, "layer", "eager", true, 0, "nvfp4", 4, 0.01, 1e-5, true}, CaseKind::model, seed++));
  out.push_back(nss_case({2, 65, 1088, DType::f16, "layer", "eager", false, 2, "nvfp4", 1, 100.0, 1e-6, true}, CaseKind::odd, seed++));
  out.push_back(nss_case({2, 65, 3072, DType::bf16, "layer", "eager", true, 0, "fp8", 3, 1.0, 1e-6, true}, CaseKind::model, seed++));
  // NVFP4 block scales shared over a quad's lanes: 5 slots (the last partly empty), 1 slot.
  out.push_back(nss_case({2, 65, 2304, DType::bf16, "layer", "eager", true, 0, "nvfp4", 1, 1.0, 1e-6}, CaseKind::odd, seed++));
  out.push_back(nss_case({1, 33, 256, DType::bf16, "layer", "eager", false, 1, "nvfp4", 0, 1.0, 1e-5, true}, CaseKind::odd, seed++));
  // Strided x: a padded row stride (x is read only).
  {
    OpCase c = nss_case({2, 9, 256, DType::bf16, "layer", "eager", true, 0, "", 2}, CaseKind::strided, seed++);
    c.name += "_x_row_padded";
    c.tensors[0].strides = {9 * 320, 320, 1};
    out.push_back(c);
  }
  // Empty: no tokens.
  out.push_back(nss_case({1, 0, 3072, DType::bf16, "layer", "eager", true, 0, "", 2}, CaseKind::empty, seed++));
  out.push_back(nss_case({2, 0, 256, DType::bf16, "rms", "eager", false, 1, "fp8", 1}, CaseKind::empty, seed++));

  // Wan's float32 chains (numerics=float32: bf16 x and residual, f32 operands, weight and bias):
  // norm1 / norm3 `(norm(x.float()) * (1 + scale) + shift).type_as(x)`, norm2 (affine, no
  // modulation) behind the gated residual `(x.float() + attn * gate).type_as(x)`, norm3 behind the
  // cross-attention residual `x + attn` (no gate), norm2 alone; the modulation as chunks of
  // [B, 6, D] (Wan 2.1 / 2.2 14B) or of [B, S, 6, D] (2.2 TI2V, per token).
  {
    const auto wan = [&](int64_t B, int64_t S, int64_t D, const char* site, int cls, CaseKind kind) {
      Nss w{B, S, D, DType::bf16, "layer", "float32", false, 0, "", cls, 1.0, 1e-6};
      const std::string which = site;
      if (which == "norm2_gated") {  // residual_out = the gated residual, y = norm2 of it
        w.residual = true;
        w.affine = 2;
        w.with_scale = w.with_shift = false;
        w.gate_class = cls;
      } else if (which == "norm3_residual") {  // residual_out = x + attn, y = norm3 of it
        w.residual = true;
        w.with_gate = false;
        w.shift_class = cls;
      } else if (which == "norm2") {
        w.affine = 2;
        w.with_scale = w.with_shift = false;
      } else {  // norm1 / norm3
        w.shift_class = cls;
      }
      OpCase c = nss_case(w, kind, seed++);
      c.name = "wan_" + which + "_" + c.name;
      out.push_back(c);
    };
    for (int64_t D : {5120, 1536})
      for (const char* site : {"norm1", "norm2_gated", "norm3_residual", "norm2"}) wan(1, 32760, D, site, 5, CaseKind::model);
    wan(2, 32760, 5120, "norm1", 5, CaseKind::model);
    wan(2, 32760, 5120, "norm2_gated", 5, CaseKind::model);
    wan(1, 2048, 3072, "norm1", 6, CaseKind::model);  // TI2V 5B width, per token
    wan(1, 2048, 3072, "norm2_gated", 6, CaseKind::model);
    // The same small enough for the CPU, odd token counts, both batch sizes.
    for (const char* site : {"norm1", "norm2_gated", "norm3_residual", "norm2"}) {
      wan(2, 33, 1536, site, 5, CaseKind::strided);
      wan(1, 65, 5120, site, 5, CaseKind::strided);
      wan(2, 17, 1536, site, 6, CaseKind::strided);
    }
    wan(2, 9, 5120, "norm3_residual", 6, CaseKind::strided);
    // Other widths and classes: 5 slots with an idle tail (2240), the widest rows (8192), 64,
    // f16, an f32 x (the eager fp32 kernel), weight alone, scale alone, shift alone, amplitudes.
    const auto f32chain = [&](Nss w, CaseKind kind) { out.push_back(nss_case(w, kind, seed++)); };
    // (gates of class 2: a 0-dim gate is refused with a 16-bit x, below)
    Nss wide{2, 9, 2240, DType::bf16, "layer", "float32", true, 2, "", 3, 100.0, 1e-5};
    wide.gate_class = 2;
    f32chain(wide, CaseKind::odd);
    f32chain({1, 17, 8192, DType::bf16, "layer", "float32", false, 0, "", 2, 1.0, 1e-6}, CaseKind::odd);
    f32chain({1, 17, 8192, DType::bf16, "layer", "float32", true, 2, "", 1, 1e-4, 1e-6}, CaseKind::odd);
    f32chain({3, 5, 64, DType::bf16, "layer", "float32", true, 1, "", 4, 1.0, 1e-6}, CaseKind::odd);
    Nss half{2, 17, 1024, DType::f16, "layer", "float32", true, 1, "", 3, 1.0, 1e-5};
    half.gate_class = 2;
    f32chain(half, CaseKind::odd);
    f32chain({2, 17, 1024, DType::f32, "layer", "float32", true, 2, "", 2, 1.0, 1e-5}, CaseKind::odd);
    Nss only{2, 33, 1536, DType::bf16, "layer", "float32", false, 0, "", 0, 1.0, 1e-6};
    only.with_shift = false;  // scale alone (a scalar)
    f32chain(only, CaseKind::odd);
    only.with_shift = true;
    only.with_scale = false;  // shift alone
    f32chain(only, CaseKind::odd);
    only.with_shift = false;  // the bare norm, no affine
    f32chain(only, CaseKind::odd);
  }

  // Every broadcast class of scale (with a [B, 1, D] shift) and of gate (residual variant), both
  // numerics, at B 2, S 6 (frames of 2 tokens), D 64.
  for (const char* numerics : {"eager", "sglang"})
    for (int cls : {0, 7, 1, 8, 9, 10, 11, 2, 12, 3, 4, 13}) {
      Nss scale{2, 6, 64, DType::bf16, "layer", numerics, false, 0, "", cls};
      OpCase c = nss_case(scale, CaseKind::odd, seed++);
      out.push_back(c);
      Nss gate{2, 6, 64, DType::bf16, "layer", numerics, true, 0, "", 2};
      gate.gate_class = cls;
      out.push_back(nss_case(gate, CaseKind::odd, seed++));
    }
  // The statistics at f32 (the normalized value alone: scale 0, no shift): both norms, every
  // amplitude and eps, three widths.
  for (const char* norm : {"layer", "rms"})
    for (double amp : {1e-4, 1.0, 100.0})
      for (double eps : {1e-6, 1e-5})
        for (int64_t D : {64, 2240, 3072}) {
          Nss st{1, 5, D, DType::f32, norm, "eager", false, 0, "", 1, amp, eps};
          st.with_shift = false;
          OpCase c = nss_case(st, CaseKind::odd, seed++);
          c.name += eps == 1e-6 ? "_scale_zero" : "_scale_zero_eps1e-5";
          c.tensors[1].fill = Fill::constant(0.0);
          out.push_back(c);
        }
  // The two numerics round differently: told apart on the same values.
  {
    Nss eager{1, 9, 3072, DType::bf16, "layer", "eager", false, 0, "", 11};
    eager.shift_class = 11;
    const OpCase e = nss_case(eager, CaseKind::model, seed++);
    eager.numerics = "sglang";
    OpCase g = nss_case(eager, CaseKind::model, seed++);
    g.differs_from = {e.name};
    out.push_back(e);
    out.push_back(g);
  }
  // The residual variant in both numerics, a per-batch gate, a [B, D] scale.
  for (const char* numerics : {"eager", "sglang"}) {
    Nss r{2, 7, 256, DType::bf16, "layer", numerics, true, 0, "", 9, 2.0};
    r.gate_class = 2;
    r.with_shift = false;
    out.push_back(nss_case(r, CaseKind::odd, seed++));
  }
  // fp8 as the static quantization of y, both reciprocals; NVFP4 over 130 rows (a second 128-row
  // tile, its padding rows zero) and with a row of zeros (block scale 0, zero codes).
  for (const char* reciprocal : {"div_full", "ieee"}) {
    Nss q{1, 4, 192, DType::bf16, "layer", "eager", false, 0, "fp8", 1, 3.0};
    q.with_shift = false;
    OpCase c = nss_case(q, CaseKind::odd, seed++);
    c.name += std::string("_") + reciprocal;
    c.options.emplace_back("fp8_reciprocal", reciprocal);
    out.push_back(c);
  }
  {
    Nss q{1, 130, 128, DType::bf16, "layer", "eager", false, 0, "nvfp4", 1, 2.0};
    q.with_shift = false;
    out.push_back(nss_case(q, CaseKind::odd, seed++));
    OpCase c = nss_case(q, CaseKind::odd, seed++);
    c.name += "_zero_rows";
    std::vector<uint64_t> rows;  // a row of values, a row of zeros
    for (int i = 0; i < 128; ++i) {
      const float v = static_cast<float>(std::sin(0.7 * i) * 2.0);
      uint32_t f;
      std::memcpy(&f, &v, 4);
      rows.push_back((f + 0x7FFF + ((f >> 16) & 1)) >> 16);  // bf16, nearest even
    }
    rows.resize(256, 0);
    c.tensors[0].fill = Fill::bits(rows);
    out.push_back(c);
  }

  // In place: y is x (equal to the out-of-place result).
  {
    OpCase c = nss_case({1, 8, 256}, CaseKind::aliased, seed++);
    c.name = "y_is_x";
    c.tensors.push_back({"y", DType::bf16, {1, 8, 256}, {}, "x"});
    out.push_back(c);
    // y over x and residual_out over residual.
    c = nss_case({2, 5, 96, DType::bf16, "layer", "eager", true, 0, "", 9}, CaseKind::aliased, seed++);
    c.name = "y_is_x_residual_out_is_residual";
    c.tensors.push_back({"y", DType::bf16, {2, 5, 96}, {}, "x"});
    c.tensors.push_back({"residual_out", DType::bf16, {2, 5, 96}, {}, "residual"});
    out.push_back(c);
  }
  // diffusers' RMSNorm without a weight (norm_order=aten_mean), as LTX-2's blocks modulate it:
  // scale / shift per batch or per token as chunks of the [B, S, n, D] modulation (class 6), the
  // video and audio widths (LTX-2: 6144 x 4096 and 2048 rows scaled down), and the row counts
  // below 16 where aten's reduction widens its threads per row (64 .. 512).
  for (auto [B, S, D] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {2, 257, 4096}, {1, 65, 2048}, {1, 1, 4096}, {1, 3, 2048}, {3, 5, 3072}, {1, 9, 128}, {2, 33, 5120}})
    for (int cls : {2, 6}) {
      ++k;
      Nss s{B, S, D, DType::bf16, "rms", "eager", false, 0, "", cls, amps[k % 3], 1e-6};
      s.shift_class = cls;
      s.norm_order = "aten_mean";
      out.push_back(nss_case(s, B * S < 16 ? CaseKind::odd : CaseKind::model, seed++));
    }
  {
    Nss s{2, 17, 1024, DType::f16, "rms", "eager", true, 0, "", 3, 1.0, 1e-5};
    s.norm_order = "aten_mean";
    out.push_back(nss_case(s, CaseKind::odd, seed++));  // behind a gated residual, fp16
    s = Nss{1, 33, 2048, DType::f32, "rms", "eager", false, 0, "", 2, 1.0, 1e-6};
    s.norm_order = "aten_mean";
    out.push_back(nss_case(s, CaseKind::odd, seed++));  // fp32 x
    s = Nss{2, 65, 3072, DType::bf16, "rms", "eager", false, 0, "fp8", 6, 1.0, 1e-6};
    s.norm_order = "aten_mean";
    s.with_shift = false;
    out.push_back(nss_case(s, CaseKind::odd, seed++));  // fp8 output, no shift
  }
  // fp8_rowwise (issue 43: the FP8 producer of Wan and LTX-2), y's per-token dynamic e4m3, y written
  // only where asked. Wan 14B's and 1.3B's float32 norm1 / norm3 with the modulation as chunks of
  // [B, 6, D] (32760 tokens where a device compares them; scaled down here), 2.2 TI2V per token,
  // norm3 behind the cross-attention residual, norm2 behind the gated residual; LTX-2's mean-order
  // RMSNorm (video 6144 x 4096, audio, rows below 16); the eager LayerNorm / RMSNorm rows; odd
  // widths; with and without y (the same bytes); zero rows (the scale 1), tiny rows (the division
  // without the correction), special values; the refusals below.
  {
    const auto rowwise = [&](Nss s, CaseKind kind, const std::string& tag = "") {
      s.quant = "fp8_rowwise";
      OpCase c = nss_case(s, kind, seed++);
      if (!tag.empty()) c.name = tag + "_" + c.name;
      return c;
    };
    const auto add = [&](const OpCase& c) {
      out.push_back(c);
      return c.name;
    };
    // Wan (numerics=float32): x bf16, scale / shift f32 chunks of [B, 6, D] (class 5) or of
    // [B, S, 6, D] (class 6).
    const auto wan = [&](int64_t B, int64_t S, int64_t D, int cls, bool without_y, double amp = 1.0) {
      Nss w{B, S, D, DType::bf16, "layer", "float32", false, 0, "", cls, amp, 1e-6, without_y};
      w.shift_class = cls;
      return w;
    };
    add(rowwise(wan(1, 32760, 5120, 5, true), CaseKind::model, "wan14b_norm1"));
    add(rowwise(wan(1, 32760, 1536, 5, true), CaseKind::model, "wan1_3b_norm1"));
    add(rowwise(wan(1, 390, 5120, 5, true), CaseKind::model, "wan14b_norm1"));  // 32760 / 84 tokens
    {
      const std::string with_y = add(rowwise(wan(2, 65, 5120, 5, false, 30.0), CaseKind::model, "wan14b_norm3"));
      OpCase c = rowwise(wan(2, 65, 5120, 5, true, 30.0), CaseKind::model, "wan14b_norm3");
      c.same_as = {with_y};  // y written or not: the same e4m3 bytes and scales
      add(c);
    }
    add(rowwise(wan(2, 33, 1536, 5, false, 1e-3), CaseKind::model, "wan1_3b_norm1"));
    add(rowwise(wan(1, 257, 3072, 6, false), CaseKind::model, "wan_ti2v_norm1"));
    {
      Nss n3 = wan(2, 17, 5120, 5, false);
      n3.residual = true;
      n3.with_gate = false;  // x + attn, then norm3
      add(rowwise(n3, CaseKind::model, "wan14b_norm3_residual"));
      Nss n2 = wan(1, 33, 1536, 5, false);
      n2.residual = true;
      n2.affine = 2;
      n2.with_scale = n2.with_shift = false;
      n2.gate_class = 5;
      add(rowwise(n2, CaseKind::odd, "wan_norm2_gated"));
      Nss f16 = wan(2, 17, 1024, 2, false);
      f16.dt = DType::f16;
      add(rowwise(f16, CaseKind::odd));
      Nss odd = wan(3, 5, 68, 1, false);  // 17 vectors: one slot, most threads idle
      add(rowwise(odd, CaseKind::odd));
    }
    // LTX-2 (norm_order=aten_mean): scale / shift per batch (class 2) or chunks of [B, S, n, D].
    const auto ltx = [&](int64_t B, int64_t S, int64_t D, int cls, bool without_y) {
      Nss l{B, S, D, DType::bf16, "rms", "eager", false, 0, "", cls, 1.0, 1e-6, without_y};
      l.shift_class = cls;
      l.norm_order = "aten_mean";
      return l;
    };
    add(rowwise(ltx(1, 6144, 4096, 2, true), CaseKind::model, "ltx2_video"));
    add(rowwise(ltx(1, 257, 4096, 6, true), CaseKind::model, "ltx2_video"));
    {
      const std::string with_y = add(rowwise(ltx(2, 65, 4096, 2, false), CaseKind::model, "ltx2_video"));
      OpCase c = rowwise(ltx(2, 65, 4096, 2, true), CaseKind::model, "ltx2_video");
      c.same_as = {with_y};
      add(c);
    }
    {
      Nss audio = ltx(1, 65, 2048, 6, false);
      audio.residual = true;
      audio.gate_class = 6;
      add(rowwise(audio, CaseKind::model, "ltx2_audio"));
      add(rowwise(ltx(1, 3, 2048, 2, false), CaseKind::odd, "ltx2_audio"));  // aten's rows below 16
      add(rowwise(ltx(1, 9, 128, 6, false), CaseKind::odd));
      Nss f16 = ltx(2, 17, 1024, 3, false);
      f16.dt = DType::f16;
      add(rowwise(f16, CaseKind::odd));
    }
    // The eager rows: LayerNorm (staged at <= 6 slots), RMSNorm with a weight, affine, residual,
    // 10 slots (prefetched behind a residual), f16, odd widths.
    add(rowwise({1, 127, 3072, DType::bf16, "layer", "eager", true, 0, "", 2, 1.0, 1e-6}, CaseKind::model));
    // FLUX.1's / Qwen-Image's / HunyuanVideo's attention residual and norm2 into the FP8 feed-forward
    // (ditops.diffusers' "fp8_quant (residual + adaLN)"): the gate a [B, 1, D] chunk of [B, 6 D],
    // scale / shift [B, D] chunks of it; the image rows (4096) and the text rows (512), y not written.
    for (const int64_t S : {int64_t{4096}, int64_t{512}}) {
      Nss f{1, S, 3072, DType::bf16, "layer", "eager", true, 0, "", 10, 1.0, 1e-6, true};
      f.shift_class = 10;
      f.gate_class = 5;
      add(rowwise(f, CaseKind::model, "flux_norm2_residual"));
    }
    add(rowwise({2, 65, 3072, DType::bf16, "rms", "eager", false, 1, "", 3, 100.0, 1e-5, true}, CaseKind::model));
    add(rowwise({2, 9, 5120, DType::bf16, "layer", "eager", true, 0, "", 4, 1.0, 1e-6, true}, CaseKind::model));
    add(rowwise({3, 33, 2240, DType::f16, "layer", "eager", false, 2, "", 1, 1e-4, 1e-6}, CaseKind::odd));
    add(rowwise({2, 3, 16, DType::bf16, "layer", "eager", false, 0, "", 0, 1.0, 1e-5}, CaseKind::odd));
    add(rowwise({2, 7, 8192, DType::bf16, "layer", "eager", false, 0, "", 2, 1.0, 1e-6}, CaseKind::odd));
    {
      // e4m3 rows with padded rows of their own (a token stride of 320 bytes).
      OpCase c = rowwise({2, 9, 256, DType::bf16, "layer", "eager", false, 0, "", 2}, CaseKind::strided);
      c.name += "_rows_padded";
      c.tensors.push_back({"fp8_rowwise", DType::f8e4m3fn, {2, 9, 256}, {9 * 320, 320, 1}});
      add(c);
    }
    // Zero rows: 1 + scale = 0 and no shift makes every y a signed zero (scale 1 by the zero-row
    // rule), in both chains; a zero x row among others (its LayerNorm is 0).
    for (const char* numerics : {"eager", "float32"}) {
      Nss z{2, 3, 1536, DType::bf16, "layer", numerics, false, 0, "", 2};
      z.with_shift = false;
      OpCase c = rowwise(z, CaseKind::odd);
      c.name += "_zero_rows";
      c.tensors[1].fill = Fill::constant(-1.0);
      add(c);
      // Tiny rows: y = shift of ~1e-30, scales below 2^-64 (the division without the correction).
      z.with_shift = true;
      c = rowwise(z, CaseKind::odd);
      c.name += "_tiny_rows";
      c.tensors[1].fill = Fill::constant(-1.0);
      c.tensors[2].fill = Fill::normal(1e-30);
      add(c);
    }
    {
      Nss f16{2, 3, 256, DType::f16, "layer", "eager", false, 0, "", 2};
      OpCase c = rowwise(f16, CaseKind::odd);  // f16 amax near 448 * 2^-24: scales of 0 (taken as 1) and subnormals
      c.name += "_subnormal_scales";
      c.tensors[1].fill = Fill::constant(-1.0);
      c.tensors[2].fill = Fill::normal(4e-6);
      add(c);
      Nss mixed{1, 2, 128, DType::bf16, "layer", "eager", false, 0, "", 1};
      mixed.with_shift = false;
      c = rowwise(mixed, CaseKind::odd);
      c.name += "_one_zero_row";
      std::vector<uint64_t> rows;  // a row of values, a row of zeros
      for (int i = 0; i < 128; ++i) rows.push_back(0x3F80 + static_cast<uint64_t>((i * 37) % 256) - 128);
      rows.resize(256, 0);
      c.tensors[0].fill = Fill::bits(rows);
      add(c);
    }
    // Special values: NaN / Inf in some rows of x (a NaN row: NaN scale, 0x7F bytes), and Inf or
    // NaN in the modulation (an Inf scale: the division path; finite y become signed zeros).
    {
      OpCase c = rowwise({2, 9, 256, DType::bf16, "layer", "eager", false, 0, "", 2}, CaseKind::odd);
      c.name += "_special_x";
      c.tensors[0].fill = Fill::special(1.0, 397);
      add(c);
      Nss m{1, 8, 256, DType::bf16, "layer", "eager", false, 0, "", 3};
      m.with_shift = false;
      c = rowwise(m, CaseKind::odd);
      c.name += "_special_scale";
      c.tensors[1].fill = Fill::special(0.3, 211);
      add(c);
      c = rowwise({1, 8, 256, DType::bf16, "layer", "float32", false, 0, "", 3}, CaseKind::odd);
      c.name += "_special_shift";
      c.tensors[2].fill = Fill::special(0.3, 173);
      add(c);
    }
    add(rowwise({2, 0, 256, DType::bf16, "layer", "eager", false, 0, "", 2}, CaseKind::empty));
    add(rowwise({1, 0, 1536, DType::bf16, "layer", "float32", false, 0, "", 5}, CaseKind::empty));
    // Refusals, each naming what it expects.
    const Nss plain{2, 8, 64, DType::bf16, "layer", "eager", false, 0, "", 2};
    OpCase c = rowwise(plain, CaseKind::aliased);
    c.name = "fp8_rowwise_over_x";
    c.tensors.push_back({"fp8_rowwise", DType::f8e4m3fn, {2, 8, 64}, {}, "x"});
    c.invalid = {"fp8_rowwise overlaps x"};
    add(c);
    c = rowwise(plain, CaseKind::aliased);
    c.name = "fp8_scale_inside_fp8_rowwise";
    c.tensors.push_back({"fp8_rowwise", DType::f8e4m3fn, {2, 8, 64}});
    c.tensors.push_back({"fp8_scale", DType::f32, {2, 8, 1}, {}, "fp8_rowwise"});
    c.invalid = {"fp8_rowwise and fp8_scale overlap"};
    add(c);
    c = rowwise(plain, CaseKind::invalid);
    c.name = "fp8_rowwise_scale_rank_2";
    c.tensors.push_back({"fp8_scale", DType::f32, {2, 8}});
    c.invalid = {"fp8_scale must have rank 3 but has rank 2"};
    add(c);
    c = rowwise(plain, CaseKind::invalid);
    c.name = "fp8_rowwise_scale_strided";
    c.tensors.push_back({"fp8_scale", DType::f32, {2, 8, 1}, {16, 2, 1}});
    c.invalid = {"fp8_scale", "contiguous"};
    add(c);
    c = rowwise(plain, CaseKind::invalid);
    c.name = "fp8_rowwise_u8";
    c.tensors.push_back({"fp8_rowwise", DType::u8, {2, 8, 64}});
    c.invalid = {"fp8_rowwise", "f8e4m3fn", "u8"};
    add(c);
    c = rowwise(plain, CaseKind::misaligned);
    c.name = "fp8_rowwise_off_4_bytes";
    c.tensors.push_back({"fp8_rowwise", DType::f8e4m3fn, {2, 8, 64}});
    c.tensors.back().offset = 2;
    c.invalid = {"fp8_rowwise.data must be 4-byte aligned", "offset 2"};
    add(c);
    c = rowwise(plain, CaseKind::invalid);
    c.name = "fp8_rowwise_rows_overlapping";
    c.tensors.push_back({"fp8_rowwise", DType::f8e4m3fn, {2, 8, 64}, {8 * 64, 32, 1}});
    c.invalid = {"fp8_rowwise.stride(1) must be >= D=64"};
    add(c);
    c = rowwise({2, 8, 64, DType::f32, "layer", "eager", false, 0, "", 2}, CaseKind::invalid);
    c.name = "fp8_rowwise_f32_x";
    c.invalid = {"fp8_rowwise needs a 16-bit x", "but x.dtype is f32"};
    add(c);
    c = rowwise({2, 8, 64, DType::bf16, "layer", "sglang", false, 0, "", 2}, CaseKind::invalid);
    c.name = "fp8_rowwise_sglang";
    c.invalid = {"fp8_rowwise is computed for numerics=eager and numerics=float32 (numerics=sglang requested)"};
    add(c);
    for (const char* other : {"fp8", "nvfp4"}) {
      Nss both = plain;
      both.quant = other;
      c = nss_case(both, CaseKind::invalid, seed++);
      c.name = std::string(other) + "_and_fp8_rowwise";
      c.options.push_back({"rowwise_fp8", "true"});
      c.invalid = {"request at most one quantized output (fp8, fp8_rowwise or nvfp4), not two"};
      add(c);
    }
  }
  // Invalid inputs.
  {
    OpCase c = nss_case({1, 4, 64, DType::bf16, "layer", "eager", false, 0, "", 2}, CaseKind::invalid, seed++);
    c.name = "scale_batch_differs";
    c.tensors[1].shape = {2, 1, 64};
    c.invalid = {"scale.shape[0] must equal B=1 or 1 (broadcast) but is 2"};
    out.push_back(c);
    c = nss_case({1, 4, 64, DType::bf16, "rms", "sglang"}, CaseKind::invalid, seed++);
    c.name = "sglang_rms";
    c.invalid = {"numerics=sglang implements LayerNorm only"};
    out.push_back(c);
    c = nss_case({1, 4, 64, DType::bf16, "rms", "eager", false, 2}, CaseKind::invalid, seed++);
    c.name = "bias_with_rms";
    c.invalid = {"bias is given with norm=rms"};
    out.push_back(c);
    Nss mean{1, 4, 4096, DType::bf16, "layer", "eager", false, 0, "", 2};
    mean.norm_order = "aten_mean";
    c = nss_case(mean, CaseKind::invalid, seed++);
    c.name = "aten_mean_layer";
    c.invalid = {"norm_order=aten_mean is an RMSNorm order"};
    out.push_back(c);
    mean.norm = "rms";
    mean.affine = 1;
    c = nss_case(mean, CaseKind::invalid, seed++);
    c.name = "aten_mean_weight";
    c.invalid = {"norm_order=aten_mean takes no weight"};
    out.push_back(c);
    mean.affine = 0;
    mean.D = 64;
    c = nss_case(mean, CaseKind::invalid, seed++);
    c.name = "aten_mean_D_64";
    c.invalid = {"norm_order=aten_mean needs 128 <= D < 8192", "64"};
    out.push_back(c);
    mean.D = 8192;
    c = nss_case(mean, CaseKind::invalid, seed++);
    c.name = "aten_mean_D_8192";
    c.invalid = {"norm_order=aten_mean needs 128 <= D < 8192", "8192"};
    out.push_back(c);
    mean.D = 4096;
    mean.numerics = "sglang";
    c = nss_case(mean, CaseKind::invalid, seed++);
    c.name = "aten_mean_sglang";
    c.invalid = {"numerics=sglang implements LayerNorm only"};
    out.push_back(c);
    c = nss_case({1, 4, 66}, CaseKind::invalid, seed++);
    c.name = "D_66";
    c.invalid = {"x.shape[2] (D) must be a multiple of 4", "66"};
    out.push_back(c);
    // numerics=float32: what it refuses, each named with what is expected.
    const Nss f32{1, 4, 64, DType::bf16, "layer", "float32", true, 2, "", 2};
    c = nss_case(f32, CaseKind::invalid, seed++);
    c.name = "float32_scale_bf16";
    c.tensors[1].dtype = DType::bf16;
    c.invalid = {"scale.dtype must be f32 (numerics=float32", "but is bf16"};
    out.push_back(c);
    c = nss_case(f32, CaseKind::invalid, seed++);
    c.name = "float32_weight_bf16";
    c.tensor("weight").dtype = DType::bf16;
    c.invalid = {"weight.dtype must be f32 (numerics=float32", "but is bf16"};
    out.push_back(c);
    c = nss_case(f32, CaseKind::invalid, seed++);
    c.name = "float32_residual_f32";
    c.tensor("residual").dtype = DType::f32;
    c.invalid = {"residual.dtype must be bf16 (as x) but is f32"};
    out.push_back(c);
    c = nss_case({1, 4, 64, DType::bf16, "layer", "eager", false, 0, "", 2}, CaseKind::invalid, seed++);
    c.name = "eager_scale_f32";
    c.tensors[1].dtype = DType::f32;
    c.invalid = {"scale.dtype must be bf16 (as x; f32 operands beside a 16-bit x: numerics=float32) but is f32"};
    out.push_back(c);
    {
      Nss scalar_gate = f32;
      scalar_gate.gate_class = 0;
      c = nss_case(scalar_gate, CaseKind::invalid, seed++);
      c.name = "float32_0dim_gate";
      c.invalid = {"gate must have a dim with numerics=float32 beside a 16-bit x", "0-dim"};
      out.push_back(c);
    }
    c = nss_case({1, 4, 64, DType::bf16, "rms", "float32", false, 0, "", 2}, CaseKind::invalid, seed++);
    c.name = "float32_rms";
    c.invalid = {"numerics=float32 implements LayerNorm only"};
    out.push_back(c);
    c = nss_case({1, 4, 64, DType::bf16, "layer", "float32", false, 0, "fp8", 2}, CaseKind::invalid, seed++);
    c.name = "float32_fp8";
    c.invalid = {"numerics=float32 has no fp8 output (its quantized output is fp8_rowwise)"};
    out.push_back(c);
    c = nss_case({1, 4, 8196, DType::bf16, "layer", "float32", false, 0, "", 2}, CaseKind::invalid, seed++);
    c.name = "float32_D_8196";
    c.invalid = {"x.shape[2] (D) must be a multiple of 4 in [16, 8192] for bf16", "8196"};
    out.push_back(c);
    c = nss_case({1, 4, 5120, DType::f32, "layer", "float32", false, 0, "", 2}, CaseKind::invalid, seed++);
    c.name = "float32_f32_x_D_5120";
    c.invalid = {"x.shape[2] (D) must be a multiple of 4 in [16, 4096] for f32", "5120"};
    out.push_back(c);
    c = nss_case({1, 4, 64, DType::bf16, "layer", "float32", false, 0, "", 2}, CaseKind::misaligned, seed++);
    c.name = "float32_scale_off_16_bytes";
    c.tensors[1].offset = 2;
    c.invalid = {"scale.data must be 16-byte aligned", "offset 8"};
    out.push_back(c);
    // Scales that fit no broadcast class of x [2, 4, 64], or have another dtype.
    for (const auto& [name, shape, dtype, fragment] :
         std::vector<std::tuple<const char*, std::vector<int64_t>, DType, const char*>>{
             {"scale_batch_3_of_2", {3, 64}, DType::bf16, "scale.shape[0] must equal B=2 or 1 (broadcast) but is 3"},
             {"scale_tokens_3_of_4", {2, 3, 64}, DType::bf16, "scale.shape[1] must equal S=4"},
             {"scale_frames_3_of_4", {2, 3, 1, 64}, DType::bf16, "(frames F) must divide S=4 but is 3"},
             {"scale_width_60", {2, 60}, DType::bf16, "scale.shape[1] must equal D=64"},
             {"scale_f16", {2, 64}, DType::f16, "scale.dtype must be bf16"}}) {
      c = nss_case({2, 4, 64, DType::bf16, "layer", "eager", false, 0, "", 9}, CaseKind::invalid, seed++);
      c.name = name;
      c.tensors[1].shape = shape;
      c.tensors[1].dtype = dtype;
      c.invalid = {fragment};
      out.push_back(c);
    }
    c = nss_case({1, 2, 18, DType::bf16, "layer", "eager", false, 0, "", 1}, CaseKind::invalid, seed++);
    c.name = "D_18";
    c.invalid = {"x.shape[2] (D) must be a multiple of 4"};
    out.push_back(c);
    const Nss plain{2, 4, 64, DType::bf16, "layer", "eager", false, 0, "", 9};
    c = nss_case(plain, CaseKind::misaligned, seed++);
    c.name = "y_off_8_bytes";
    c.tensors.push_back({"y", DType::bf16, {2, 4, 64}});
    c.tensors.back().offset = 1;
    c.invalid = {"y.data must be 8-byte aligned"};
    out.push_back(c);
    c = nss_case(plain, CaseKind::aliased, seed++);
    c.name = "y_one_row_into_x";
    c.tensors.push_back({"y", DType::bf16, {2, 4, 64}, {}, "x", 64});
    c.invalid = {"y overlaps x"};
    out.push_back(c);
    c = nss_case({2, 4, 64, DType::bf16, "layer", "eager", true, 0, "", 9}, CaseKind::aliased, seed++);
    c.name = "y_is_residual_out";
    c.tensors.push_back({"y", DType::bf16, {2, 4, 64}});
    c.tensors.push_back({"residual_out", DType::bf16, {2, 4, 64}, {}, "y"});
    c.invalid = {"y and residual_out overlap"};
    out.push_back(c);
    {
      Nss one{1, 1, 64, DType::bf16, "layer", "eager", false, 0, "", 1};
      one.with_shift = false;
      c = nss_case(one, CaseKind::aliased, seed++);
      c.name = "y_over_scale";
      c.tensors.push_back({"y", DType::bf16, {1, 1, 64}, {}, "scale"});
      c.invalid = {"y overlaps scale"};
      out.push_back(c);
    }
    c = nss_case(plain, CaseKind::invalid, seed++);
    c.name = "y_rows_overlapping";
    c.tensors.push_back({"y", DType::bf16, {2, 4, 64}, {4 * 64, 32, 1}});
    c.invalid = {"y.stride(1) must be >= D=64"};
    out.push_back(c);
    c = nss_case(plain, CaseKind::invalid, seed++);
    c.name = "fp8_without_input_scale";
    c.tensors.push_back({"fp8", DType::f8e4m3fn, {2, 4, 64}});
    c.invalid = {"input_scale is required with the fp8 output"};
    out.push_back(c);
    c = nss_case(plain, CaseKind::invalid, seed++);
    c.name = "bias_without_weight";
    c.tensors.push_back({"bias", DType::bf16, {64}});
    c.invalid = {"bias is given without weight"};
    out.push_back(c);
    c = nss_case({2, 4, 64, DType::bf16, "layer", "eager", false, 0, "nvfp4", 9}, CaseKind::invalid, seed++);
    c.name = "nvfp4_scales_of_8_rows";
    c.tensors.push_back({"nvfp4_scales", DType::u8, {8, 4}});
    c.invalid = {"nvfp4_scales.shape[0] must be 128"};
    out.push_back(c);
    Nss no_scale{1, 4, 64, DType::bf16, "layer", "sglang", false, 0, "", 2};
    no_scale.with_scale = false;
    c = nss_case(no_scale, CaseKind::invalid, seed++);
    c.name = "sglang_without_scale";
    c.invalid = {"scale is required (numerics=sglang"};
    out.push_back(c);
  }
  // Every model case again with x's rows padded (its token stride free).
  Variants padded;
  padded.pad_rows = {"x"};
  add_variants(out, padded);
  return out;
}

const CaseSet kCases("norm_scale_shift", make);

using testing_oracle::round_dtype;
using testing_oracle::round_f32;
using testing_oracle::round_f32_sum;

struct NssCall {
  int x, residual, gate, scale, shift, weight, bias, y, residual_out, fp8, input_scale, packed, scales, global_scale,
      rowwise, row_scale;
  int64_t B, S, D;
  DType dt;
  std::string numerics;
  bool rms;
  double eps;
};

NssCall nss_call(const OracleIo& io) {
  NssCall c;
  for (auto [field, name] : {std::pair<int*, const char*>{&c.x, "x"}, {&c.residual, "residual"}, {&c.gate, "gate"},
                             {&c.scale, "scale"}, {&c.shift, "shift"}, {&c.weight, "weight"}, {&c.bias, "bias"},
                             {&c.y, "y"}, {&c.residual_out, "residual_out"}, {&c.fp8, "fp8"},
                             {&c.input_scale, "input_scale"}, {&c.packed, "nvfp4_packed"},
                             {&c.scales, "nvfp4_scales"}, {&c.global_scale, "global_scale"},
                             {&c.rowwise, "fp8_rowwise"}, {&c.row_scale, "fp8_scale"}})
    *field = io.id(name);
  c.B = io.shape(c.x)[0];
  c.S = io.shape(c.x)[1];
  c.D = io.shape(c.x)[2];
  c.dt = io.dtype(c.x);
  c.numerics = io.option("numerics");
  c.rms = io.option("norm") == "rms";
  c.eps = std::stof(io.option("eps"));
  return c;
}

// A broadcast operand's value at (b, s, channel), read from its own shape (docs/norm_scale_shift.md:
// scalar, per channel, per batch, per token, per frame), independently of the op's matcher.
double operand(const OracleIo& io, int t, int64_t S, int64_t b, int64_t s, int64_t ch) {
  const std::vector<int64_t>& shape = io.shape(t);
  const size_t r = shape.size();
  std::vector<int64_t> idx(r, 0);
  if (r >= 1) idx[r - 1] = shape[r - 1] == 1 ? 0 : ch;
  if (r >= 2) idx[0] = shape[0] == 1 ? 0 : b;
  if (r == 3) idx[1] = shape[1] == 1 ? 0 : s;
  if (r == 4) idx[1] = shape[1] == 1 ? 0 : s / (S / shape[1]);
  int64_t flat = 0;
  for (size_t d = 0; d < r; ++d) flat = flat * shape[d] + idx[d];
  return io.in(t, flat);
}

// The residual step, v = residual + x * gate, by each numerics: eager rounds the product and the
// sum to the dtype (each through fp32); sglang rounds one fused multiply-add; float32 rounds the
// fp32 product of an f32 gate once with the sum.
double residual_step(const OracleIo& io, const NssCall& c, int64_t b, int64_t s, int64_t ch) {
  const int64_t i = (b * c.S + s) * c.D + ch;
  const double x = io.in(c.x, i), r = io.in(c.residual, i);
  if (c.gate < 0) return round_dtype(round_f32_sum(r, x), c.dt);
  const double g = operand(io, c.gate, c.S, b, s, ch);
  if (c.numerics == "sglang") return round_dtype(round_f32_sum(x * g, r), c.dt);
  double p = round_f32(x * g);  // exact in double, rounded once
  if (c.numerics == "eager") p = round_dtype(p, c.dt);
  return round_dtype(round_f32_sum(r, p), c.dt);
}

void nss_residual(OracleIo& io) {
  const NssCall c = nss_call(io);
  if (c.residual_out < 0) return;
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t s = 0; s < c.S; ++s)
      for (int64_t ch = 0; ch < c.D; ++ch) io.expect(c.residual_out, (b * c.S + s) * c.D + ch, residual_step(io, c, b, s, ch));
}

// y in double: the norm of v (residual step) or x, affine, modulation. The bound: the dtype's
// roundings (eight steps of its unit roundoff; float32 numerics: two) over the terms' magnitudes,
// and the fp32 statistics' error (2^-12 of the normalized value).
void nss_float64(OracleIo& io) {
  const NssCall c = nss_call(io);
  if (c.y < 0) return;
  const double u = c.dt == DType::bf16 ? 0x1p-8 : c.dt == DType::f16 ? 0x1p-11 : 0x1p-24;
  const double k = c.numerics == "float32" ? 2 * u : 8 * u;
  std::vector<double> h(c.D);
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t s = 0; s < c.S; ++s) {
      const int64_t row = (b * c.S + s) * c.D;
      for (int64_t ch = 0; ch < c.D; ++ch) h[ch] = c.residual >= 0 ? residual_step(io, c, b, s, ch) : io.in(c.x, row + ch);
      double mean = 0, var = 0;
      if (!c.rms) {
        for (double v : h) mean += v;
        mean /= static_cast<double>(c.D);
      }
      for (double v : h) var += (v - mean) * (v - mean);
      const double rstd = 1.0 / std::sqrt(var / static_cast<double>(c.D) + c.eps);
      for (int64_t ch = 0; ch < c.D; ++ch) {
        double n = (h[ch] - mean) * rstd, bias = 0;
        if (c.weight >= 0) n *= io.in(c.weight, ch);
        if (c.bias >= 0) bias = io.in(c.bias, ch);
        const double op = 1.0 + (c.scale >= 0 ? operand(io, c.scale, c.S, b, s, ch) : 0.0);
        const double shift = c.shift >= 0 ? operand(io, c.shift, c.S, b, s, ch) : 0.0;
        const double y = (n + bias) * op + shift;
        const double terms = std::fabs(n * op) + std::fabs(bias * op) + std::fabs(shift) + std::fabs(y);
        io.expect(c.y, row + ch, y, k * terms + 0x1p-12 * std::fabs(n * op) + 1e-6);
      }
    }
}

// The quantized outputs of the reference's own y: fp8 = e4m3(y * fl32(1 / input_scale)) saturated;
// NVFP4 blocks of 16: the block scale from the block's amax, the E2M1 code of each y times the
// block's factor, two per byte (even element low), scales 128x4-swizzled with padding rows 0.
void nss_quantized(OracleIo& io) {
  const NssCall c = nss_call(io);
  if (c.y < 0) return;
  const int64_t rows = c.B * c.S;
  if (c.fp8 >= 0) {
    const double inv = testing_oracle::ieee_inverse(io.in(c.input_scale, 0));
    for (int64_t i = 0; i < rows * c.D; ++i) {
      const double q = testing_oracle::round_e4m3_saturated(round_f32(io.out(c.y, i) * inv));
      io.expect(c.fp8, i, io.dtype(c.fp8) == DType::f8e4m3fn ? q : ref::float_to_e4m3_satfinite(static_cast<float>(q)));
    }
  }
  if (c.packed >= 0) {
    const float global = static_cast<float>(io.in(c.global_scale, 0));
    const int64_t cols = c.D / 16, padded = io.shape(c.scales)[0];
    for (int64_t m = 0; m < padded; ++m)
      for (int64_t k = 0; k < cols; ++k) {
        if (m >= rows) {
          io.expect(c.scales, nvfp4_scale_offset(m, k, cols), 0);
          continue;
        }
        float amax = 0;
        for (int i = 0; i < 16; ++i) amax = std::max(amax, std::fabs(static_cast<float>(io.out(c.y, m * c.D + 16 * k + i))));
        uint8_t sf = 0;
        const float factor = ref::nvfp4_block_scale(amax, global, &sf);
        io.expect(c.scales, nvfp4_scale_offset(m, k, cols), sf);
        for (int i = 0; i < 16; i += 2) {
          const uint8_t lo = ref::float_to_e2m1_satfinite(static_cast<float>(io.out(c.y, m * c.D + 16 * k + i)) * factor);
          const uint8_t hi = ref::float_to_e2m1_satfinite(static_cast<float>(io.out(c.y, m * c.D + 16 * k + i + 1)) * factor);
          io.expect(c.packed, (m * c.D + 16 * k + i) / 2, static_cast<double>(lo | hi << 4));
        }
      }
  }
}

// fp8_rowwise from a run's own y (every implementation's, on a device too), the recipe in double:
// s = T(fp32(amax * fp32(1/448))), 1 where it is 0, NaN for a row with a NaN; q = e4m3(fp32(y / s))
// saturated. Cases without y have a twin with y (same_as) or compare with the reference alone.
void nss_rowwise_of_own_y(OracleIo& io) {
  const NssCall c = nss_call(io);
  if (c.rowwise < 0 || c.y < 0) return;
  const double inv448 = round_f32(1.0 / 448.0);
  for (int64_t r = 0; r < c.B * c.S; ++r) {
    double amax = 0;
    bool nan = false;
    for (int64_t i = 0; i < c.D; ++i) {
      const double v = io.out(c.y, r * c.D + i);
      nan = nan || std::isnan(v);
      amax = std::fmax(amax, std::fabs(v));
    }
    double s = nan ? NAN : round_dtype(round_f32(amax * inv448), c.dt);
    if (s == 0) s = 1;
    io.expect(c.row_scale, r, s);
    for (int64_t i = 0; i < c.D; ++i)
      io.expect(c.rowwise, r * c.D + i, testing_oracle::round_e4m3_saturated(round_f32(io.out(c.y, r * c.D + i) / s)));
  }
}

const OracleSet kResidual("norm_scale_shift", {"the residual step by each numerics", nss_residual});
const OracleSet kRowwise("norm_scale_shift", {.name = "fp8_rowwise: the rowwise recipe of the run's own y",
                                              .expect = nss_rowwise_of_own_y,
                                              .on_own_outputs = true});
// Not on special values: at the largest finite values the fp32 statistics overflow (a NaN row),
// which the float64 bound does not model.
bool without_special_values(const OpCase& c) {
  return c.invalid.empty() && !c.large && std::none_of(c.tensors.begin(), c.tensors.end(), [](const TensorCase& t) {
           return t.fill && t.fill->kind == Fill::Kind::special;
         });
}
const OracleSet kFloat64("norm_scale_shift", {.name = "float64 norm, affine and modulation within the roundings' bound",
                                              .expect = nss_float64,
                                              .applies = without_special_values});
const OracleSet kQuantized("norm_scale_shift", {"the quantization of the reference's y", nss_quantized});

}  // namespace
}  // namespace ditops::optest
