// FP8 linear with per-tensor static scales for decode-sized token counts (SGLang's sm120_fp8 decode GEMMs, DiT adaLN linears):
//
//   out[m, n] = bf16(sum_k xq[m, k] * w[n, k] * (x_scale * w_scale) (+ bias[n]))
//
//   x        [M, K] row-major: e4m3 (already quantized with x_scale), or bf16/f16, quantized
//            inside exactly as fp8_static_quant(x, x_scale) does (Fp8Reciprocal)
//   x_scale  fp32, one element, on x's device, read on the device
//   w        [N, K] e4m3 row-major, as checkpoints store it (not the transposed [K, N] view)
//   w_scale  fp32, one element, read on the device
//   bias     optional [N] bf16
//   out      [M, N] bf16 row-major, overlapping no input
// K % 16 == 0. Every M >= 0 is valid input: the specialized kernels take M = 1..16, the vendor
// implementation (cuBLASLt) any M, M == 0 is a no-op. The scales are applied as their fp32
// product, then the bias, then one RNE rounding to bf16.
//
// No implementation is bit-exact against an oracle (cuBLASLt's summation order is not
// specified): every one is `close` (docs/fp8_linear.md), so the op runs at quality high or above;
// at the default quality only the CPU reference takes a call.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ditops/fp8_reciprocal.h"
#include "ditops/op_function.h"
#include "ditops/registry.h"
#include "ditops/tensor.h"

namespace ditops {

struct Fp8LinearOptions {
  Fp8Reciprocal fp8_reciprocal = Fp8Reciprocal::ieee;  // quantization of a bf16/f16 x
  bool use_pdl = true;  // programmatic dependent launch where the device has it
  DispatchOptions dispatch;
};

struct Fp8LinearCall {
  TensorView x, x_scale, w, w_scale, bias, out;  // bias.data == nullptr when absent
  Fp8LinearOptions options;
  int64_t m = 0, n = 0, k = 0;
  bool has_bias = false;
  bool aligned16 = false;  // x and w 16-byte aligned: the kernels' 16-byte loads apply
  Stream stream = nullptr;
};

// fp8_linear(the tensors above, in order, options = {}, stream = nullptr): Validates (Error naming
// the tensor, dimension, expected and actual value, before anything is written), selects an
// implementation and runs it. Returns the implementation's name.
extern const OpFunction<std::string, Fp8LinearCall> fp8_linear;

// match_fp8_linear(the same arguments):
extern const OpFunction<Fp8LinearCall, Fp8LinearCall> match_fp8_linear;

DispatchReport explain_fp8_linear(const Fp8LinearCall& call);

// The CPU reference: x quantized by fp8_static_quant_reference (IEEE reciprocal in both modes)
// when 16-bit; per output, acc = 0.0f, then acc += float(xq[m, k]) * float(w[n, k]) for k = 0, 1,
// ..., K-1 in fp32 (every product exact), then the epilogue above. No FP contraction.
void fp8_linear_reference(const Fp8LinearCall& call);

// The shape whitelist (K, N, M): where the specialized kernels are to be chosen over cuBLASLt.
// An entry is taken by dispatch only once `measured` names the benchmark record that shows the
// kernel faster than cuBLASLt on an H200; until then explain says "not measured", dispatch
// leaves the shape to the vendor implementation, and only an explicit backend=jit runs the
// kernels (tests, benchmarks).
struct Fp8LinearShape {
  int64_t k = 0, n = 0;
  uint32_t m_mask = 0;            // bit m set: M = m listed
  bool bias = false;              // the model's layer has a bias (the adaLN modulation linears)
  const char* source = "";        // the model and layer
  const char* measured = nullptr; // the benchmark record, or nullptr: not measured
};
const std::vector<Fp8LinearShape>& fp8_linear_whitelist();
// The entry listing (k, n) at m, or nullptr.
const Fp8LinearShape* fp8_linear_whitelisted(int64_t k, int64_t n, int64_t m);

}  // namespace ditops
