// GELU(tanh) of the rows of x (the activation of FLUX.1's and HunyuanVideo's single blocks and
// feed-forwards, "gelu-approximate"), written where the caller says:
//
//   out = F.gelu(x, approximate="tanh")
//
// as eager PyTorch computes it on CUDA: ATen's GeluCUDAKernelImpl in fp32 (nvcc's fma of
// x + 0.044715 x^3), CUDA's tanhf, rounded to the dtype. docs/gelu_tanh.md states the contract.
// The single blocks' torch.cat([attn, gelu(mlp)], -1) before proj_out takes one pass over the mlp
// columns instead of two when the op writes them straight into the cat buffer.
//
//   x    [..., N] bf16, f16 or f32, last stride 1, its leading dims collapsing into one row stride
//        (a [M, N] view with any row stride, a [B, S, N] activation)
//   out  x's dtype, [..., N] with x's leading dims or [M, N] (M: the rows of x), last stride 1, its
//        leading dims collapsing into one row stride >= N (a column slice of a wider buffer: the
//        columns [D, D + N) of a [M, D + N] cat buffer); overlapping no byte of x. The caller's
//        tensor, written in place (never read): the op allocates nothing
//   prefix  optional: x's dtype, [..., Kp] with x's leading dims or [M, Kp], its own row stride;
//        then out is [..., Kp + N] = cat([prefix, gelu(x)], -1) (the single block's whole cat
//        buffer: the attention output's columns copied in the same pass)
// Errors (ditops::Error naming the tensor, the dimension, the expected and the actual value,
// before anything is written): out's width != N, out's leading dims not x's, out's dtype not x's,
// rows that do not collapse into one stride or that overlap, out overlapping x. M == 0 or N == 0
// is a no-op.
#pragma once

#include <cstdint>
#include <string>

#include "ditops/op_function.h"
#include "ditops/registry.h"
#include "ditops/tensor.h"

namespace ditops {

struct GeluTanhOptions {
  bool use_pdl = true;  // programmatic dependent launch where the device has it
  DispatchOptions dispatch;
};

// The call as every implementation sees it: the tensors in call order, the options, and what
// matching derives from them.
struct GeluTanhCall {
  TensorView x, out, prefix;  // prefix: an empty TensorView when absent
  GeluTanhOptions options;
  int64_t rows = 0;   // M: the product of x's leading dims
  int64_t width = 0;  // N: the columns of x and of out
  int64_t prefix_width = 0;  // Kp: out's leading columns copied from prefix (0 without)
  int64_t x_row_stride = 0, out_row_stride = 0, prefix_row_stride = 0;  // elements between rows
  // N and Kp multiples of 16 bytes of elements, x, out (and prefix) 16-byte aligned, row strides multiples of 16 bytes.
  bool aligned16 = false;
  Stream stream = nullptr;
};

// gelu_tanh(x, out, options = {}, stream = nullptr): validates every argument (throws Error before
// anything is written), selects an implementation and runs it on `stream`. Returns the name of
// the implementation that ran.
extern const OpFunction<std::string, GeluTanhCall> gelu_tanh;

// match_gelu_tanh(the same arguments): validation alone: the call every implementation would receive.
extern const OpFunction<GeluTanhCall, GeluTanhCall> match_gelu_tanh;

// The dispatch reasoning for one call, without running it.
DispatchReport explain_gelu_tanh(const GeluTanhCall& call);

// The CPU reference (the portable oracle): runs on CPU views of a matched call. tanh in double
// rounded to fp32, where CUDA's tanhf is within 2 ulp of it.
void gelu_tanh_reference(const GeluTanhCall& call);

}  // namespace ditops
