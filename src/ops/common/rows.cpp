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

ActRows match_act_rows(const Matcher& m, const TensorView& x, const TensorView& out, const TensorView& prefix,
                       int64_t width, const std::string& n_rule) {
  const auto num = [](int64_t v) { return std::to_string(v); };
  const int r = x.rank;
  ActRows a;
  a.rows = 1;
  for (int d = 0; d + 1 < r; ++d) a.rows *= x.shape[d];
  a.x_row_stride = collapsed_row_stride(m, x, "x");
  // A tensor of x's rows: x's leading dims or [M, columns].
  const bool has_prefix = !(prefix.rank == 0 && prefix.data == nullptr);
  const auto rows_like_x = [&](const TensorView& t, const std::string& name, int64_t columns) {
    std::string expected = "[";
    for (int d = 0; d + 1 < r; ++d) expected += num(x.shape[d]) + ", ";
    expected += num(columns) + "]";
    bool same_lead = t.rank == r;
    for (int d = 0; same_lead && d + 1 < r; ++d) same_lead = t.shape[d] == x.shape[d];
    const bool two_d = t.rank == 2 && t.shape[0] == a.rows;
    if (!same_lead && !two_d)
      m.fail(name + " must be " + expected + " (x's leading dims) or [M, " +
             (name != "out" ? "Kp" : has_prefix ? "Kp + N" : "N") + "] = [" + num(a.rows) + ", " + num(columns) +
             "] but is " + t.describe());
  };
  if (has_prefix) {
    if (prefix.rank < 1) m.fail("prefix must have rank >= 1 ([..., Kp]) but has rank 0");
    a.prefix_width = prefix.shape[prefix.rank - 1];
    rows_like_x(prefix, "prefix", a.prefix_width);
    a.prefix_row_stride = collapsed_row_stride(m, prefix, "prefix");
  }
  const int64_t out_width = a.prefix_width + width;
  rows_like_x(out, "out", out_width);
  if (out.shape[out.rank - 1] != out_width)
    m.fail("out.shape[" + num(out.rank - 1) + "] must equal " + (has_prefix ? "Kp + N=" : "N=") + num(out_width) +
           " (" + (has_prefix ? "prefix's " + num(a.prefix_width) + " + " : "") + n_rule + ") but is " +
           num(out.shape[out.rank - 1]));
  a.out_row_stride = collapsed_row_stride(m, out, "out");
  if (a.rows > 1 && out_width > 0 && a.out_row_stride < out_width)
    m.fail("out's row stride must be >= " + std::string(has_prefix ? "Kp + N=" : "N=") + num(out_width) +
           " (rows may not overlap) but is " + num(a.out_row_stride));
  const int64_t elems = 16 / static_cast<int64_t>(dtype_size(x.dtype));
  const auto rows_aligned = [&](const TensorView& t, int64_t stride) {
    return is_aligned(t.data, 16) && (a.rows <= 1 || stride % elems == 0);
  };
  a.aligned16 = width % elems == 0 && a.prefix_width % elems == 0 && rows_aligned(x, a.x_row_stride) &&
                rows_aligned(out, a.out_row_stride) && (!has_prefix || rows_aligned(prefix, a.prefix_row_stride));
  return a;
}

}  // namespace ditops
