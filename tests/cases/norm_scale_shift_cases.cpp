// norm_scale_shift's cases: the GPU grid (LayerNorm / RMSNorm, residual + gate, affine weight and
// bias, every broadcast class of scale and gate, fp8 and NVFP4 outputs with and without y, all
// numerics, fp16/bf16/fp32, amplitudes 1e-4..100), Wan's float32 chains (norm1/norm3, norm2 with
// and without the gated residual, the cross-attention residual into norm3; f32 operands as chunks
// of [B, 6, D] and of [B, S, 6, D]), plus empty, overlapping and invalid calls.
#include "op_test_driver.h"

namespace ditops::optest {
namespace {

struct Nss {
  int64_t B, S, D;
  DType dt = DType::bf16;
  const char* norm = "layer";
  const char* numerics = "eager";
  bool residual = false;
  int affine = 0;            // 0 none, 1 weight, 2 weight and bias
  const char* quant = "";    // "", "fp8", "nvfp4"
  int scale_class = 2;       // 0 scalar, 1 [D], 2 [B,1,D], 3 [B,S,D], 4 [B,F,1,D]
  double amplitude = 1.0, eps = 1e-6;
  bool without_y = false;    // quantized outputs only
  const char* e2m1 = "software";
  // Which operands are given (the float32 chain's sites leave some out) and their classes: -1 the
  // grid's defaults (shift [B,1,D], gate (scale_class + 2) % 5); 5 a chunk of [B, 6, D] ([B,1,D]
  // with strides (6D, D, 1)), 6 a chunk of [B, S, 6, D] squeezed ([B,S,D], strides (6SD, 6D, 1)).
  bool with_scale = true, with_shift = true, with_gate = true;
  int shift_class = -1, gate_class = -1;
};

std::vector<int64_t> operand_shape(int cls, int64_t B, int64_t S, int64_t D) {
  switch (cls) {
    case 0: return {};
    case 1: return {D};
    case 2: case 5: return {B, 1, D};
    case 3: case 6: return {B, S, D};
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
  if (cls >= 5) {
    t.offset = chunk * D;
    if (name != owner) t.storage = owner;
  }
  return t;
}

OpCase nss_case(const Nss& s, CaseKind kind, uint32_t seed) {
  OpCase c;
  c.op = "norm_scale_shift";
  c.kind = kind;
  c.seed = seed;
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
           (s.gate_class >= 0 ? "_gate" + std::to_string(s.gate_class) : "");
  // The float32 chain's operands, weight and bias are f32.
  const DType op_dt = std::string(s.numerics) == "float32" ? DType::f32 : s.dt;
  TensorCase x{"x", s.dt, {s.B, s.S, s.D}};
  x.fill = Fill::normal(s.amplitude, 0.25);
  const int shift_class = s.shift_class < 0 ? 2 : s.shift_class;
  const int gate_class = s.gate_class < 0 ? (s.scale_class + 2) % 5 : s.gate_class;
  const bool with_gate = s.residual && s.with_gate;
  const std::string owner = s.with_scale && s.scale_class >= 5   ? "scale"
                            : s.with_shift && shift_class >= 5 ? "shift"
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
  if (!quant.empty()) c.options.push_back({"store_y", s.without_y ? "false" : "true"});
  // The reference's rsqrt / rcp.approx / div.full are correctly rounded, the GPU's MUFU: where
  // rstd's last bit differs y moves by a few rounding steps at max(|y|, 1) (measured at most 5.87
  // half-ulps over the grid); an fp8 byte or NVFP4 code / scale may flip at a midpoint.
  // residual_out involves no approximation: bytes equal.
  c.tolerance = {4, 1.0, 0.02, 64};
  // An fp32 y keeps every bit of rstd's difference: most elements may differ, by a few steps
  // (tests/test_norm_scale_shift_gpu.cpp bounds the steps at 8; H200: up to 4 at 12.8 %).
  if (s.dt == DType::f32) c.tolerance = {8, 1.0, 1.0, 0};
  c.tolerance_for = {{"residual_out", {}}, {"fp8", {2, 0.0, 0.02, 64}}, {"nvfp4_packed", {1, 0.0, 0.02, 64}},
                     {"nvfp4_scales", {1, 0.0, 0.02, 16}}};
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

  // In place: y is x (equal to the out-of-place result).
  {
    OpCase c = nss_case({1, 8, 256}, CaseKind::aliased, seed++);
    c.name = "y_is_x";
    c.tensors.push_back({"y", DType::bf16, {1, 8, 256}, {}, "x"});
    out.push_back(c);
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
    for (auto& t : c.tensors)
      if (t.name == "weight") t.dtype = DType::bf16;
    c.invalid = {"weight.dtype must be f32 (numerics=float32", "but is bf16"};
    out.push_back(c);
    c = nss_case(f32, CaseKind::invalid, seed++);
    c.name = "float32_residual_f32";
    for (auto& t : c.tensors)
      if (t.name == "residual") t.dtype = DType::f32;
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
    c.invalid = {"numerics=float32 has no quantized output (fp8 requested)"};
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
    Nss no_scale{1, 4, 64, DType::bf16, "layer", "sglang", false, 0, "", 2};
    no_scale.with_scale = false;
    c = nss_case(no_scale, CaseKind::invalid, seed++);
    c.name = "sglang_without_scale";
    c.invalid = {"scale is required (numerics=sglang"};
    out.push_back(c);
  }
  return out;
}

const CaseSet kCases("norm_scale_shift", make);

}  // namespace
}  // namespace ditops::optest
