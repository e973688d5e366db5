// What the row-wise ops share on the host (fp8_rowwise_quant, swiglu): a [..., W] view taken as
// rows of one stride.
#pragma once

#include <cstdint>
#include <string>

#include "core/matcher.h"

namespace ditops {

// The stride between the rows of t ([..., W], last stride 1): its leading dims must collapse into
// one row index (extent-1 dims take any stride); fails naming the dim otherwise. W for one row.
int64_t collapsed_row_stride(const Matcher& m, const TensorView& t, const std::string& name);

}  // namespace ditops
