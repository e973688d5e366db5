#include "ops/common/rows.h"

namespace ditops {

int64_t collapsed_row_stride(const Matcher& m, const TensorView& t, const std::string& name) {
  const auto num = [](int64_t v) { return std::to_string(v); };
  const int r = t.rank;
  m.require_nonnegative_strides(t, name);
  if (t.numel() == 0) return 0;  // an empty view's strides are arbitrary
  if (t.shape[r - 1] > 1 && t.strides[r - 1] != 1)
    m.fail(name + ".stride(" + num(r - 1) + ") must be 1 but is " + num(t.strides[r - 1]));
  int64_t stride = -1, next = 0;
  for (int d = r - 2; d >= 0; --d) {
    if (t.shape[d] == 1) continue;
    if (stride < 0) {
      stride = t.strides[d];
      next = stride * t.shape[d];
    } else if (t.strides[d] != next) {
      m.fail(name + ".stride(" + num(d) + ") must be " + num(next) +
             " (the leading dims collapse into one row stride) but is " + num(t.strides[d]));
    } else {
      next *= t.shape[d];
    }
  }
  return stride < 0 ? t.shape[r - 1] : stride;
}

}  // namespace ditops
