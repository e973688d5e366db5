// norm_scale_shift's cases: the GPU grid (LayerNorm / RMSNorm, residual + gate, affine weight and
// bias, every broadcast class of scale and gate, fp8 and NVFP4 outputs with and without y, both
// numerics, fp16/bf16/fp32, amplitudes 1e-4..100), plus empty, overlapping and invalid calls.
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
};

std::vector<int64_t> operand_shape(int cls, int64_t B, int64_t S, int64_t D) {
  switch (cls) {
    case 0: return {};
    case 1: return {D};
    case 2: return {B, 1, D};
    case 3: return {B, S, D};
    default: return {B, S % 3 == 0 ? 3 : 1, 1, D};
  }
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
           (std::string(s.quant) == "nvfp4" ? std::string("_e2m1_") + s.e2m1 : "");
  TensorCase x{"x", s.dt, {s.B, s.S, s.D}};
  x.fill = Fill::normal(s.amplitude, 0.25);
  TensorCase scale{"scale", s.dt, operand_shape(s.scale_class, s.B, s.S, s.D)};
  scale.fill = Fill::normal(0.3);
  TensorCase shift{"shift", s.dt, {s.B, 1, s.D}};
  shift.fill = Fill::normal(0.3);
  c.tensors = {x, scale, shift};
  if (s.residual) {
    TensorCase residual{"residual", s.dt, {s.B, s.S, s.D}}, gate{"gate", s.dt, operand_shape((s.scale_class + 2) % 5, s.B, s.S, s.D)};
    residual.fill = Fill::normal(s.amplitude);
    c.tensors.push_back(residual);
    c.tensors.push_back(gate);
  }
  if (s.affine >= 1) {
    TensorCase w{"weight", s.dt, {s.D}};
    w.fill = Fill::normal(0.2, 5.0);  // 1 + 0.2 N
    c.tensors.push_back(w);
  }
  if (s.affine == 2) {
    TensorCase b{"bias", s.dt, {s.D}};
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
  }
  return out;
}

const CaseSet kCases("norm_scale_shift", make);

}  // namespace
}  // namespace ditops::optest
