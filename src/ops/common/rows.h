// What the row-wise ops share on the host (fp8_rowwise_quant, swiglu, gelu_tanh): a [..., W] view
// taken as rows of one stride.
#pragma once

#include <cstdint>
#include <string>

#include "core/matcher.h"

namespace ditops {

// The stride between the rows of t ([..., W], last stride 1): its leading dims must collapse into
// one row index (extent-1 dims take any stride); fails naming the dim otherwise. W for one row.
int64_t collapsed_row_stride(const Matcher& m, const TensorView& t, const std::string& name);

// The rows of an activation written into the caller's out (swiglu, gelu_tanh): x [..., K], an
// optional prefix [..., Kp] and out [..., Kp + N] (x's leading dims) or [M, Kp + N], each of one row
// stride, out's >= Kp + N (a column slice of a cat buffer). N is the op's (K / 2 for swiglu); n_rule
// says where it comes from in out's width error.
struct ActRows {
  int64_t rows = 0;          // M: the product of x's leading dims
  int64_t prefix_width = 0;  // Kp (0 without a prefix)
  int64_t x_row_stride = 0, out_row_stride = 0, prefix_row_stride = 0;
  bool aligned16 = false;  // N and Kp multiples of 16 bytes of elements, pointers and row strides 16-byte aligned
};
ActRows match_act_rows(const Matcher& m, const TensorView& x, const TensorView& out, const TensorView& prefix,
                       int64_t width, const std::string& n_rule);

}  // namespace ditops
