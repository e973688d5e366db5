// Static per-tensor FP8 quantization of activations, as ModelOpt FP8 checkpoints and SGLang's
// static_quant_fp8 apply it before an FP8 linear:
//
//   out = e4m3fn(clamp(x.float() * inv, -448, 448)),   inv = 1 / scale
//
//   x      [M, K] bf16 or f16, contiguous
//   scale  fp32 with exactly one element, on x's device; read on the device (no host sync).
//          inv per Fp8Reciprocal: ieee (eager `1.0 / scale`) or div_full (SGLang's Triton
//          div.full.f32).
//   out    [M, K] float8_e4m3fn, contiguous, overlapping no input.
// Any M, K >= 0; M * K == 0 is a no-op. NaN stays NaN (0x7F), +-Inf and finite values beyond
// +-448 saturate to +-448, as eager's clamp then cast does. The scale must be finite and > 0: on
// CPU tensors the facade checks it; on CUDA the kernel computes eager's formula for any scale
// (docs/fp8_static_quant in docs/fp8_linear.md).
//
// The device code is token_cat_fp8's (kernels/token_cat_fp8.cuh) with one input: the same bytes.
#pragma once

#include <string>

#include "ditops/fp8_reciprocal.h"
#include "ditops/op_function.h"
#include "ditops/registry.h"
#include "ditops/tensor.h"

namespace ditops {

struct Fp8StaticQuantOptions {
  Fp8Reciprocal fp8_reciprocal = Fp8Reciprocal::ieee;
  bool use_pdl = true;  // programmatic dependent launch where the device has it
  DispatchOptions dispatch;
};

// The call as every implementation sees it: the tensors in call order, the options, and what
// matching derives from them.
struct Fp8StaticQuantCall {
  TensorView x, scale, out;
  Fp8StaticQuantOptions options;
  int64_t rows = 0;   // M
  int64_t width = 0;  // K
  // K % 16 == 0 and x, out 16-byte aligned: the 16-byte path applies.
  bool aligned16 = false;
  Stream stream = nullptr;
};

// fp8_static_quant(x, scale, out, options = {}, stream = nullptr): validates every argument
// (throws Error naming the tensor, dimension, expected and actual value, before anything is
// written), selects an implementation and runs it on `stream`. Returns the name of the
// implementation that ran.
extern const OpFunction<std::string, Fp8StaticQuantCall> fp8_static_quant;

// match_fp8_static_quant(x, scale, out, options = {}, stream = nullptr): validation alone
// (shapes, dtypes, devices, overlap; not the scale's value).
extern const OpFunction<Fp8StaticQuantCall, Fp8StaticQuantCall> match_fp8_static_quant;

DispatchReport explain_fp8_static_quant(const Fp8StaticQuantCall& call);

// The CPU reference: token_cat_fp8_reference over the one input (inv = 1.0f / scale, IEEE, in
// both modes; see there).
void fp8_static_quant_reference(const Fp8StaticQuantCall& call);

}  // namespace ditops
