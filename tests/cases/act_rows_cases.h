// The case form the activation ops share (swiglu, gelu_tanh: out = act(x) row by row into the
// caller's out): x [..., C N] (C input columns per output column: swiglu's [gate | up] 2, gelu_tanh 1)
// and out [..., N] (x's leading dims) or [M, N], each with rows of its own stride and a first column
// in its buffer; and the rows every such op has: f16 and f32, odd widths (the scalar path), padded
// rows, one row, special fills, empty calls, the refusals of the shared row rules
// (src/ops/common/rows: match_act_rows), and the variants (misaligned, padded, no PDL).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "op_test_driver.h"

namespace ditops::optest::act_rows {

struct Shape {
  std::vector<int64_t> lead = {33};  // x's leading dims
  int64_t N = 0;                     // out's columns
  DType dtype = DType::bf16;
  int64_t x_row = 0, x_offset = 0;      // x's row stride (0: C N) and its first column in its buffer
  int64_t out_row = 0, out_offset = 0;  // the same for out (0: Kp + N, contiguous [M, ...] or [..., ...])
  bool out_like_x = false;              // out [..., Kp + N] with x's leading dims
  int64_t prefix = 0;                   // Kp: a prefix [M, Kp] (0: none), row stride prefix_row (0: Kp)
  int64_t prefix_row = 0;
};

struct Op {
  std::string name;
  int64_t x_columns = 1;         // C
  Tolerance (*tolerance)(DType);  // the reference against a device, per dtype
};

inline OpCase make_case(const Op& op, const Shape& s, CaseKind kind, uint32_t seed) {
  OpCase c{.op = op.name, .kind = kind, .seed = seed};
  std::string lead;
  for (int64_t e : s.lead) lead += (lead.empty() ? "" : "x") + std::to_string(e);
  c.name = std::string(dtype_name(s.dtype)) + "_" + lead + "_N" + std::to_string(s.N) +
           (s.x_row ? "_xrow" + std::to_string(s.x_row) + "@" + std::to_string(s.x_offset) : "") +
           (s.out_row ? "_outrow" + std::to_string(s.out_row) + "@" + std::to_string(s.out_offset) : "") +
           (s.out_like_x ? "_out_like_x" : "") + (s.prefix ? "_prefix" + std::to_string(s.prefix) : "") +
           (s.prefix_row ? "@row" + std::to_string(s.prefix_row) : "");
  std::vector<int64_t> xs = s.lead;
  xs.push_back(op.x_columns * s.N);
  TensorCase x{"x", s.dtype, xs, s.x_row ? row_strides(s.lead, s.x_row) : std::vector<int64_t>{}};
  x.offset = s.x_offset;
  x.fill = Fill::normal(3.0);
  c.tensors = {x};
  std::vector<int64_t> os = s.out_like_x ? s.lead : std::vector<int64_t>{numel(s.lead)};
  os.push_back(s.prefix + s.N);
  const std::vector<int64_t> lead_of_out(os.begin(), os.end() - 1);
  TensorCase out{"out", s.dtype, os, s.out_row ? row_strides(lead_of_out, s.out_row) : std::vector<int64_t>{}};
  out.offset = s.out_offset;
  c.tensors.push_back(out);
  if (s.prefix) {
    const std::vector<int64_t> lead_of_prefix = {numel(s.lead)};
    TensorCase prefix{"prefix", s.dtype, {numel(s.lead), s.prefix},
                      s.prefix_row ? row_strides(lead_of_prefix, s.prefix_row) : std::vector<int64_t>{}};
    prefix.fill = Fill::special(2.0, 5);  // a copy: every value, special ones included, moves as it is
    c.tensors.push_back(prefix);
  }
  c.tolerance = op.tolerance(s.dtype);
  c.large = numel(s.lead) * op.x_columns * s.N > (int64_t{1} << 22);
  return c;
}

// x's values from a cycle of bit patterns (an op's edges).
inline OpCase bits_case(const Op& op, const std::string& name, DType dtype, int64_t rows, int64_t N,
                        std::vector<uint64_t> bits, uint32_t seed) {
  Shape s;
  s.lead = {rows};
  s.N = N;
  s.dtype = dtype;
  OpCase c = make_case(op, s, CaseKind::odd, seed);
  c.name = std::string(dtype_name(dtype)) + "_" + name;
  c.tensors[0].fill = Fill::bits(std::move(bits));
  return c;
}

// A feed-forward's act of width N on 4608 image and 512 text tokens ([1, S, K] x, [1, S, N] out), at
// full size (large: where a device compares them), and on 33 rows.
inline void add_feed_forward_cases(std::vector<OpCase>& out, const Op& op, int64_t N, uint32_t& seed) {
  for (const std::vector<int64_t>& lead : {std::vector<int64_t>{1, 4608}, {1, 512}, {33}}) {
    Shape s;
    s.lead = lead;
    s.N = N;
    s.out_like_x = lead.size() > 1;
    out.push_back(make_case(op, s, CaseKind::model, seed++));
  }
}

// After the op's model cases: f16 and f32 at a smaller width (a [B, S, C N] activation), odd widths
// (the scalar path: N not a multiple of 16 bytes; N = 8 / 4: one vector a row), rows of their own
// stride (padded x rows, padded out rows, both, an odd pad), one row (a [C N] x and a [N] out).
inline void add_shape_cases(std::vector<OpCase>& out, const Op& op, uint32_t& seed) {
  auto add = [&](const Shape& s, CaseKind kind) { out.push_back(make_case(op, s, kind, seed++)); };
  for (DType dt : {DType::f16, DType::f32}) {
    Shape s;
    s.lead = {2, 9};
    s.N = 9216;
    s.dtype = dt;
    s.out_like_x = true;
    add(s, CaseKind::model);
  }
  for (DType dt : {DType::bf16, DType::f16, DType::f32})
    for (int64_t N : {int64_t{1}, int64_t{3}, int64_t{17}, int64_t{100}, int64_t{3071}, int64_t{8}, int64_t{4}}) {
      Shape s;
      s.lead = {3, 5};
      s.N = N;
      s.dtype = dt;
      s.out_like_x = true;
      add(s, CaseKind::odd);
    }
  for (const auto& [x_pad, out_pad] : std::vector<std::pair<int64_t, int64_t>>{{8, 0}, {0, 24}, {3, 5}, {64, 8}}) {
    Shape s;
    s.lead = {2, 7};
    s.N = 128;
    s.x_row = x_pad ? op.x_columns * 128 + x_pad : 0;
    s.out_row = out_pad ? 128 + out_pad : 0;
    s.out_like_x = s.out_row != 0;
    add(s, CaseKind::strided);
  }
  Shape one;
  one.lead = {};
  one.N = 100;
  one.out_like_x = true;
  add(one, CaseKind::odd);
  // A prefix (the single block's attention output, out the whole cat buffer): aligned widths, an odd
  // one (the scalar path), a prefix of its own row stride, one row.
  for (const auto& [Kp, prefix_row] : std::vector<std::pair<int64_t, int64_t>>{{64, 0}, {3, 0}, {32, 48}}) {
    Shape s;
    s.lead = {5};
    s.N = 128;
    s.prefix = Kp;
    s.prefix_row = prefix_row;
    add(s, prefix_row ? CaseKind::strided : CaseKind::odd);
  }
}

// The refusal shape of the shared rules: x [2, 4, 32 C], out [2, 4, 32].
inline Shape refusal_shape() {
  Shape s;
  s.lead = {2, 4};
  s.N = 32;
  s.out_like_x = true;
  return s;
}

// A refusal: the case at refusal_shape(), edited, failing with every fragment, writing nothing.
template <typename Edit>
void add_refusal(std::vector<OpCase>& out, const Op& op, uint32_t& seed, const std::string& name,
                 std::vector<std::string> fragments, Edit edit) {
  OpCase c = make_case(op, refusal_shape(), CaseKind::invalid, seed++);
  c.name = name;
  edit(c);
  c.invalid = std::move(fragments);
  out.push_back(c);
}

// After the op's edges: every third element special in each dtype, empty calls (no rows, no
// columns), the refusals of the shared row rules, then every model case again with each buffer an
// element off its alignment (the scalar path), with longer rows, and without PDL.
inline void add_closing_cases(std::vector<OpCase>& out, const Op& op, uint32_t& seed) {
  for (DType dt : {DType::bf16, DType::f16, DType::f32}) {
    Shape s;
    s.lead = {4, 6};
    s.N = 64;
    s.dtype = dt;
    OpCase c = make_case(op, s, CaseKind::odd, seed++);
    c.name += "_special";
    c.tensors[0].fill = Fill::special(3.0, 3);
    out.push_back(c);
  }
  Shape empty;
  empty.lead = {0};
  empty.N = 64;
  out.push_back(make_case(op, empty, CaseKind::empty, seed++));
  empty.lead = {2, 0};
  empty.out_like_x = true;
  out.push_back(make_case(op, empty, CaseKind::empty, seed++));
  empty.lead = {3};
  empty.N = 0;
  out.push_back(make_case(op, empty, CaseKind::empty, seed++));
  const int64_t K = 32 * op.x_columns;
  const auto n = [](int64_t v) { return std::to_string(v); };
  add_refusal(out, op, seed, "out_2d_width_wrong", {"out.shape[1] must equal N=32", "but is 31"},
              [](OpCase& c) { c.tensors[1].shape = {8, 31}; });
  add_refusal(out, op, seed, "out_rows_wrong", {"out must be [2, 4, 32] (x's leading dims) or [M, N] = [8, 32] but is"},
              [](OpCase& c) { c.tensors[1].shape = {2, 5, 32}; });
  add_refusal(out, op, seed, "out_dtype_differs", {"out.dtype must be bf16", "f16"},
              [](OpCase& c) { c.tensors[1].dtype = DType::f16; });
  add_refusal(out, op, seed, "x_f8", {"x.dtype must be", "f8e4m3fn"},
              [](OpCase& c) { c.tensors[0].dtype = DType::f8e4m3fn; });
  add_refusal(out, op, seed, "x_last_stride_2", {"x.stride(2) must be 1 but is 2"},
              [K](OpCase& c) { c.tensors[0].strides = {8 * K, 2 * K, 2}; });
  add_refusal(out, op, seed, "x_rows_not_collapsing", {"x.stride(0) must be " + n(4 * K), "but is 1000"},
              [K](OpCase& c) { c.tensors[0].strides = {1000, K, 1}; });
  add_refusal(out, op, seed, "out_rows_overlap", {"out's row stride must be >= N=32 (rows may not overlap) but is 16"},
              [](OpCase& c) { c.tensors[1].strides = {64, 16, 1}; });
  Shape with_prefix = refusal_shape();
  with_prefix.prefix = 16;
  const auto add_prefix_refusal = [&](const std::string& name, std::vector<std::string> fragments, auto edit) {
    OpCase c = make_case(op, with_prefix, CaseKind::invalid, seed++);
    c.name = name;
    edit(c);
    c.invalid = std::move(fragments);
    out.push_back(c);
  };
  add_prefix_refusal("prefix_rows_wrong", {"prefix must be [2, 4, 16] (x's leading dims) or [M, Kp] = [8, 16] but is"},
                     [](OpCase& c) { c.tensors[2].shape = {9, 16}; });
  add_prefix_refusal("out_without_prefix_columns", {"must equal Kp + N=48 (prefix's 16 + ", "but is 32"},
                     [](OpCase& c) { c.tensors[1].shape = {2, 4, 32}; });
  add_prefix_refusal("prefix_dtype_differs", {"prefix.dtype must be bf16", "f16"},
                     [](OpCase& c) { c.tensors[2].dtype = DType::f16; });
  OpCase over = make_case(op, refusal_shape(), CaseKind::aliased, seed++);
  over.name = "out_over_x";
  over.tensors[1].storage = "x";
  over.invalid = {"x overlaps out in memory"};
  out.push_back(over);
  Variants v;
  v.misalign = {"x", "out", "prefix"};
  v.pad_rows = {"x", "out"};
  v.options = {{{{"use_pdl", "false"}}, "nopdl"}};
  add_variants(out, v);
}

// The oracles' walk: out's prefix columns the prefix's bits exactly, then act(x row's first index,
// column j) for each of the N act columns.
template <typename Act>
void expect_rows(OracleIo& io, int64_t x_columns, Act act) {
  const int x = io.id("x"), out = io.id("out"), prefix = io.id("prefix");
  const int64_t K = io.shape(x).back(), N = K / x_columns, rows = K ? io.numel(x) / K : 0;
  const int64_t Kp = prefix >= 0 ? io.shape(prefix).back() : 0, W = Kp + N;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < Kp; ++j) io.expect_bits(out, r * W + j, io.bits(prefix, r * Kp + j));
    for (int64_t j = 0; j < N; ++j) io.expect(out, r * W + Kp + j, act(r * K, j));
  }
}

}  // namespace ditops::optest::act_rows
