// adaLN pre-norm with modulation, optionally behind a gated residual and in front of a quantizer:
//
//   v            = residual + x * gate            (gated-residual variant; else v = x)
//   residual_out = v                              (gated-residual variant)
//   y            = norm(v) * (1 + scale) + shift  (norm: LayerNorm or RMSNorm over D, optional
//                                                  affine weight [D] / bias [D]; scale optional
//                                                  except with sglang numerics: absent = 0)
//   fp8          = e4m3(y * (1 / input_scale))    (static FP8, optional)
//   fp8_rowwise, fp8_scale = the per-token dynamic e4m3 of y (optional; eager and float32 numerics):
//                  s = T(amax|y| * fp32(1/448)), 1 where 0; fp8_rowwise = e4m3(clamp(y / s, +-448)),
//                  fp8_scale = s (fp32) per row: torchao 0.18's float8 rowwise recipe
//                  (ditops.eager.fp8_rowwise_eager, docs/fp8_rowwise_quant.md) of the 16-bit y
//   nvfp4        = NVFP4(y) with global_scale     (packed E2M1 + 128x4-swizzled E4M3 block scales)
//
// Shapes (every stride counts elements; last stride 1 wherever a dim is longer than 1):
//   x, residual        [B, S, D] bf16/fp16/fp32, batch and token strides free.
//   y, residual_out,   [B, S, D], batch/token strides free, rows must not overlap. y has x's dtype,
//   fp8, fp8_rowwise   fp8 is f8e4m3fn (or u8), fp8_rowwise f8e4m3fn. An output may BE an input
//                      (same data, strides, dtype: in place, each row is read fully before it is
//                      written) but may not overlap any input or output otherwise.
//   scale, shift, gate broadcast operands, dtype of x (numerics=float32: f32), one of the classes
//                        scalar: rank 0 or all dims 1 with no D       []   [1]
//                        per channel:                                  [D] [1,D] [1,1,D]
//                        per batch:                                    [B,D] [B,1,D]
//                        per token:                                    [1,S,D] [B,S,D]
//                        per frame (S = F * tokens per frame):         [B,F,1,D] [1,F,1,D]
//                      with free strides (a chunk of the adaLN projection works without a copy).
//                      shift is optional; gate is optional with residual (absent = 1).
//   weight, bias       [D] (affine; bias needs weight; RMSNorm takes no bias), dtype of x
//                      (numerics=float32: f32).
//   input_scale        fp32, one element, on the device of x (fp8 only).
//   fp8_scale          fp32 [B, S, 1] contiguous (with fp8_rowwise; x bf16 or f16).
//   nvfp4_packed       [B*S, D/2] u8 or fp4e2m1x2, contiguous (two values per byte, even element
//                      in the low nibble); nvfp4_scales [pad128(B*S), D/16] u8 contiguous, the
//                      128x4 swizzled layout (padding rows written as 0); global_scale fp32,
//                      one element. D % 64 == 0.
//   D: D % 4 == 0 and 16 <= D <= 8192 (fp32 x: <= 4096); sglang numerics: D % 16 == 0.
// norm_order=aten_mean (norm=rms, eager numerics, no affine, 128 <= D < 8192): the RMSNorm of
// diffusers' RMSNorm module, whose variance is x.float().pow(2).mean(-1) (LTX-2).
// numerics=float32 (Wan's FP32LayerNorm chains): x and residual bf16/f16 (or f32), every
// operand f32, every operation in fp32 and y (and residual_out) rounded once to x's dtype;
// LayerNorm only, no quantized output but fp8_rowwise (of that rounded y).
// At most one quantized output (fp8, fp8_rowwise or nvfp4); y is written only where given (the
// bindings' store_y) when one is requested.
// B*S == 0 is a no-op. The numerics, operation by operation, are in docs/norm_scale_shift.md.
#pragma once

#include <string>

#include "ditops/fp8_reciprocal.h"
#include "ditops/op_function.h"
#include "ditops/registry.h"
#include "ditops/tensor.h"

namespace ditops {

enum class NormType : uint8_t { layer, rms };
const char* norm_type_name(NormType type);

enum class NssNumerics : uint8_t {
  // The eager PyTorch 2.11 chain on CUDA, op by op: residual + x * gate (product rounded, sum
  // rounded), F.layer_norm / F.rms_norm (aten's vectorized kernel order), then
  // y * (1 + scale) + shift with every op rounded to the dtype. Contract: bit_exact.
  eager,
  // SGLang's native Qwen-Image kernel (docs/norm_scale_shift.md §3): fma residual, two-pass
  // mean/var in its 16-elements-per-thread block order, norm rounded, y = rne(fma(norm, 1 + s,
  // shift)). LayerNorm without affine, 16-bit dtypes. Contract: bit_exact vs that chain as the doc
  // states it, checked against our CPU reference only (the chain itself is not available).
  sglang,
  // The eager chain computed in float32 as diffusers' Wan block writes it (FP32LayerNorm, float32
  // modulation and gates): v = (residual.float() + x * gate).type_as(residual) (or residual + x),
  // (F.layer_norm(v.float(), (D,), weight, bias, eps) * (1 + scale) + shift).type_as(x) with every
  // operand f32 and one rounding of y to x's dtype. LayerNorm, no quantized output. Contract:
  // bit_exact vs that chain (aten's statistics of a float32 row are those of its 16-bit values).
  float32,
};
const char* nss_numerics_name(NssNumerics numerics);

// The order of an RMSNorm's sum of squares (norm=rms, numerics=eager).
enum class NssNormOrder : uint8_t {
  // F.rms_norm's fused row kernel (torch.nn.RMSNorm).
  aten,
  // x.float().pow(2).mean(-1) on CUDA (torch 2.11's generic reduction): the squares rounded to
  // fp32, added in that kernel's order, times its factor fp32(rows) / fp32(rows * D); then
  // rsqrt(mean + eps) and one rounding of x * rstd. diffusers' RMSNorm without a weight (LTX-2's
  // block norms). No affine weight, 128 <= D < 8192.
  aten_mean,
};
const char* nss_norm_order_name(NssNormOrder order);

// How NVFP4 turns fp32 into E2M1 on the GPU (both give identical bits).
enum class E2m1Conversion : uint8_t {
  automatic,  // hardware where the device has it (sm_100a / sm_120a), else software
  software,   // integer compares, any sm_90+ device
  hardware,   // cvt.rn.satfinite.e2m1x2.f32 (sm_100a, sm_103a, sm_120a, ...)
};

struct NormScaleShiftOptions {
  NormType norm = NormType::layer;
  float eps = 1e-6f;
  NssNumerics numerics = NssNumerics::eager;
  NssNormOrder norm_order = NssNormOrder::aten;
  // inv = 1 / input_scale for the fp8 output: div.full.f32 as SGLang's static_quant_fp8 (Triton)
  // computes it, or the IEEE division of an eager `1.0 / input_scale`.
  Fp8Reciprocal fp8_reciprocal = Fp8Reciprocal::div_full;
  E2m1Conversion e2m1 = E2m1Conversion::automatic;
  bool use_pdl = true;
  DispatchOptions dispatch;
};

// An absent optional tensor is a default TensorView (data == nullptr).
struct NormScaleShiftInputs {
  TensorView x;
  TensorView residual;  // present: the gated-residual variant (residual_out required)
  TensorView gate;
  TensorView weight, bias;
  TensorView scale, shift;
  TensorView input_scale;   // fp8 output
  TensorView global_scale;  // nvfp4 output
};

struct NormScaleShiftOutputs {
  TensorView y;  // may be absent when a quantized output is requested
  TensorView residual_out;
  TensorView fp8;
  TensorView nvfp4_packed, nvfp4_scales;
  TensorView fp8_rowwise, fp8_scale;  // both or neither
};

// One broadcast operand after matching: element (b, s, c) is at
//   data + b*batch_stride + (s / frame_len)*frame_stride + s*token_stride + (per_channel ? c : 0).
struct NssOperand {
  enum class Kind : uint8_t { absent, scalar, channel, batch, token, frame };
  Kind kind = Kind::absent;
  const void* data = nullptr;
  int64_t batch_stride = 0, frame_stride = 0, token_stride = 0;
  int64_t frame_len = 1;  // tokens per frame (frame class)
  bool per_channel() const { return kind != Kind::absent && kind != Kind::scalar; }
};
const char* nss_operand_kind_name(NssOperand::Kind kind);

enum class NssQuant : uint8_t { none, fp8, nvfp4, fp8_rowwise };

// The call as every implementation sees it: the tensors in call order, the options, and what
// matching derives from them.
struct NormScaleShiftCall {
  NormScaleShiftInputs in;
  NormScaleShiftOutputs out;
  NormScaleShiftOptions options;
  NssOperand scale, shift, gate;
  int64_t batch = 0, seq = 0, rows = 0;  // rows = B*S
  int dim = 0;
  NssQuant quant = NssQuant::none;
  bool residual = false;
  bool store_y = false;
  int affine = 0;  // 0 none, 1 weight, 2 weight + bias
  bool modulate = true;  // scale or shift given (numerics=float32 without both: y = norm(v) alone)
  Stream stream = nullptr;
};

// norm_scale_shift(inputs, outputs, options = {}, stream = nullptr): validates every argument
// (throws Error naming the tensor, dimension, expected and actual value, before anything is
// written), selects an implementation and runs it on `stream`. Returns the name of the
// implementation that ran.
extern const OpFunction<std::string, NormScaleShiftCall, NormScaleShiftInputs, NormScaleShiftOutputs> norm_scale_shift;

// match_norm_scale_shift(the same arguments): validation alone: the call every implementation
// would receive.
extern const OpFunction<NormScaleShiftCall, NormScaleShiftCall, NormScaleShiftInputs, NormScaleShiftOutputs>
    match_norm_scale_shift;

// The dispatch reasoning for one call, without running it.
DispatchReport explain_norm_scale_shift(const NormScaleShiftCall& call);

// The CPU reference (the portable oracle): runs on CPU views of a matched call.
void norm_scale_shift_reference(const NormScaleShiftCall& call);

// Byte offset of the E4M3 scale of (row m, scale column k) in the 128x4 swizzled layout with
// `scale_cols` columns (a multiple of 4).
inline int64_t nvfp4_scale_offset(int64_t m, int64_t k, int64_t scale_cols) {
  return (m / 128) * (scale_cols / 4) * 512 + (k / 4) * 512 + (m % 32) * 16 + ((m % 128) / 32) * 4 + (k % 4);
}

}  // namespace ditops
