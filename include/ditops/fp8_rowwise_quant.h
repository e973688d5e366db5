// Per-token (rowwise) dynamic FP8 e4m3 quantization of the rows of cat([prefix, act(x)], -1): the
// FP8 producer of the attention output (act none), of FF-down's input gelu(FF-up output) (act
// gelu_tanh), of the FLUX single blocks' proj_out input cat(attn, gelu(mlp)) (prefix = attn) and
// of FLUX.2's SwiGLU (act swiglu: linear_out's input, and the single blocks' cat(attn, swiglu(mlp))):
//
//   y          = cat([prefix, act(x)], -1) as rows of Kp + N values of x's dtype (N = K, or K / 2
//                for swiglu)
//   amax       = y.abs().amax(-1)
//   out_scale  = float(T(amax * fp32(1 / 448))), 1 where that is 0 (our zero-row rule)
//   out        = e4m3(clamp(float(y) / out_scale, -448, 448))
//
// torchao 0.18's float8 dynamic rowwise recipe (Float8DynamicActivationFloat8WeightConfig with
// PerRow(), its torch path) as eager PyTorch computes it on CUDA, except for rows whose scale is 0,
// which torchao turns into NaN bytes (docs/fp8_rowwise_quant.md).
//
//   x          [..., K] bf16 or f16, last stride 1, the leading dims collapsing into one row stride
//              (a [M, K] view with any row stride, a [B, S, K] activation, a column slice of a
//              wider tensor)
//   prefix     optional, x's leading dims and dtype, [..., Kp], its own row stride (same rule)
//   out        [M, Kp + N] float8_e4m3fn, contiguous, M = the rows of x; overlapping no input
//   out_scale  [M, 1] fp32, contiguous
//   act        none; gelu_tanh: F.gelu(x, approximate="tanh") rounded to x's dtype, as ATen's CUDA
//              kernel computes it (x + 0.044715 x^3 as one fma: nvcc's contraction in PyTorch's build);
//              swiglu (K even, N = K / 2): F.silu(x[..., :N]) * x[..., N:] as eager computes it on
//              16-bit tensors: silu in fp32 as ATen's CUDA kernel, x / (1 + expf(-x)), rounded to
//              the dtype, then the product in fp32 rounded to the dtype (FLUX.2's Flux2SwiGLU)
// Kp + N >= 1. M == 0 is a no-op. The CUDA kernel holds a row in registers: Kp + N <= 32768
// (wider rows are refused on CUDA with that reason; the CPU reference takes any width).
#pragma once

#include <cstdint>
#include <string>

#include "ditops/op_function.h"
#include "ditops/registry.h"
#include "ditops/tensor.h"

namespace ditops {

enum class Fp8RowwiseAct : uint8_t { none, gelu_tanh, swiglu };

struct Fp8RowwiseQuantOptions {
  Fp8RowwiseAct act = Fp8RowwiseAct::none;
  bool use_pdl = true;  // programmatic dependent launch where the device has it
  DispatchOptions dispatch;
};

// The call as every implementation sees it: the tensors in call order, the options, and what
// matching derives from them.
struct Fp8RowwiseQuantCall {
  TensorView x, prefix, out, out_scale;  // prefix: an empty TensorView when absent
  Fp8RowwiseQuantOptions options;
  int64_t rows = 0;          // M: the product of x's leading dims
  int64_t width = 0;         // K: x's columns
  int64_t act_width = 0;     // N: the output columns act(x) gives (K, or K / 2 for swiglu)
  int64_t prefix_width = 0;  // Kp (0 without prefix)
  int64_t x_row_stride = 0, prefix_row_stride = 0;  // elements between rows
  // Kp, N multiples of 16, x, prefix and out 16-byte aligned, row strides multiples of 8 elements.
  bool aligned16 = false;
  Stream stream = nullptr;
};

// fp8_rowwise_quant(x, prefix, out, out_scale, options = {}, stream = nullptr): validates every
// argument (throws Error naming the tensor, dimension, expected and actual value, before anything
// is written), selects an implementation and runs it on `stream`. Returns the name of the
// implementation that ran. `prefix` may be an empty TensorView.
extern const OpFunction<std::string, Fp8RowwiseQuantCall> fp8_rowwise_quant;

// match_fp8_rowwise_quant(the same arguments): validation alone: the call every implementation
// would receive.
extern const OpFunction<Fp8RowwiseQuantCall, Fp8RowwiseQuantCall> match_fp8_rowwise_quant;

// The dispatch reasoning for one call, without running it.
DispatchReport explain_fp8_rowwise_quant(const Fp8RowwiseQuantCall& call);

// The CPU reference (the portable oracle): runs on CPU views of a matched call. act=gelu_tanh
// takes tanh in double rounded to fp32, where CUDA's tanhf is within 2 ulp of it; act=swiglu exp
// in double rounded to fp32, where CUDA's expf is within 2 ulp of it.
void fp8_rowwise_quant_reference(const Fp8RowwiseQuantCall& call);

}  // namespace ditops
