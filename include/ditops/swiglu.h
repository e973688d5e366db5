// SwiGLU of the rows of x = [gate | up] (FLUX.2's Flux2SwiGLU, the feed-forward's and the single
// blocks' activation):
//
//   out = F.silu(x[..., :N]) * x[..., N:]
//
// as eager PyTorch computes it on CUDA: silu in fp32 as ATen's CUDA kernel, x / (1 + expf(-x)),
// rounded to the dtype, then the product in fp32 rounded to the dtype (f32: no rounding in
// between). docs/swiglu.md states the contract.
//
//   x    [..., 2N] bf16, f16 or f32, last stride 1, its leading dims collapsing into one row
//        stride (a [M, 2N] view with any row stride: the mlp columns of a wider projection output,
//        a [B, S, 2N] activation)
//   out  x's dtype, [..., N] with x's leading dims or [M, N] (M: the rows of x), last stride 1, its
//        leading dims collapsing into one row stride >= N (a column slice of a wider buffer: the
//        columns [D, D + N) of a [M, D + N] cat buffer); overlapping no byte of x. The caller's
//        tensor, written in place (never read): the op allocates nothing
//   prefix  optional: x's dtype, [..., Kp] with x's leading dims or [M, Kp], its own row stride;
//        then out is [..., Kp + N] = cat([prefix, act(x)], -1) (the single block's whole cat
//        buffer: the attention output's columns copied in the same pass)
// Errors (ditops::Error naming the tensor, the dimension, the expected and the actual value,
// before anything is written): an odd last dim of x, out's width != N, out's leading dims not x's,
// out's dtype not x's, rows that do not collapse or overlap, out overlapping x. M == 0 or N == 0
// is a no-op.
#pragma once

#include <cstdint>
#include <string>

#include "ditops/op_function.h"
#include "ditops/registry.h"
#include "ditops/tensor.h"

namespace ditops {

struct SwigluOptions {
  bool use_pdl = true;  // programmatic dependent launch where the device has it
  DispatchOptions dispatch;
};

// The call as every implementation sees it: the tensors in call order, the options, and what
// matching derives from them.
struct SwigluCall {
  TensorView x, out, prefix;  // prefix: an empty TensorView when absent
  SwigluOptions options;
  int64_t rows = 0;   // M: the product of x's leading dims
  int64_t width = 0;  // N: out's columns (x has 2N)
  int64_t prefix_width = 0;  // Kp: out's leading columns copied from prefix (0 without)
  int64_t x_row_stride = 0, out_row_stride = 0, prefix_row_stride = 0;  // elements between rows
  // N and Kp multiples of 16 bytes of elements, x, out (and prefix) 16-byte aligned, row strides multiples of 16 bytes.
  bool aligned16 = false;
  Stream stream = nullptr;
};

// swiglu(x, out, options = {}, stream = nullptr): validates every argument (throws Error before
// anything is written), selects an implementation and runs it on `stream`. Returns the name of
// the implementation that ran.
extern const OpFunction<std::string, SwigluCall> swiglu;

// match_swiglu(the same arguments): validation alone: the call every implementation would receive.
extern const OpFunction<SwigluCall, SwigluCall> match_swiglu;

// The dispatch reasoning for one call, without running it.
DispatchReport explain_swiglu(const SwigluCall& call);

// The CPU reference (the portable oracle): runs on CPU views of a matched call. exp in double
// rounded to fp32, where CUDA's expf is within 2 ulp of it.
void swiglu_reference(const SwigluCall& call);

}  // namespace ditops
