// gelu_tanh's cases: FLUX.1's and HunyuanVideo's sites (N = 12288: the feed-forward's act on image
// and text tokens; the single block's proj_mlp output written into the columns [D, D + N) of the
// cat buffer before proj_out), scaled down for the CPU; f16 and f32; odd widths (the scalar path);
// rows of their own stride, [B, S, N] views with a [B, S, N] or [M, N] out; special values and
// GELU's edges; empty calls; refusals. The reference takes tanh in double rounded to fp32 where
// CUDA's tanhf is within 2 ulp of it: a 16-bit value may be one ulp away; an f32 value a few ulps
// of 1 where 1 + tanh cancels (x below about -3).
//
// The oracle (below): testing_oracle::gelu_tanh with the fma, the fp32 steps in double, each
// rounded (tanh in double rounded to fp32), then the dtype: the reference's value exactly.
#include <string>
#include <vector>

#include "op_test_driver.h"
#include "rounding_oracle.h"

namespace ditops::optest {
namespace {

struct Gt {
  std::vector<int64_t> lead = {33};  // x's leading dims
  int64_t N = 12288;
  DType dtype = DType::bf16;
  int64_t x_row = 0, x_offset = 0;      // x's row stride (0: N) and its first column in its buffer
  int64_t out_row = 0, out_offset = 0;  // the same for out (0: N, contiguous [M, N] or [..., N])
  bool out_like_x = false;              // out [..., N] with x's leading dims
};

OpCase gt_case(const Gt& s, CaseKind kind, uint32_t seed) {
  OpCase c{.op = "gelu_tanh", .kind = kind, .seed = seed};
  std::string lead;
  for (int64_t e : s.lead) lead += (lead.empty() ? "" : "x") + std::to_string(e);
  c.name = std::string(dtype_name(s.dtype)) + "_" + lead + "_N" + std::to_string(s.N) +
           (s.x_row ? "_xrow" + std::to_string(s.x_row) + "@" + std::to_string(s.x_offset) : "") +
           (s.out_row ? "_outrow" + std::to_string(s.out_row) + "@" + std::to_string(s.out_offset) : "") +
           (s.out_like_x ? "_out_like_x" : "");
  std::vector<int64_t> xs = s.lead;
  xs.push_back(s.N);
  TensorCase x{"x", s.dtype, xs, s.x_row ? row_strides(s.lead, s.x_row) : std::vector<int64_t>{}};
  x.offset = s.x_offset;
  x.fill = Fill::normal(3.0);
  c.tensors = {x};
  {
    std::vector<int64_t> os = s.out_like_x ? s.lead : std::vector<int64_t>{numel(s.lead)};
    os.push_back(s.N);
    const std::vector<int64_t> lead_of_out(os.begin(), os.end() - 1);
    TensorCase out{"out", s.dtype, os, s.out_row ? row_strides(lead_of_out, s.out_row) : std::vector<int64_t>{}};
    out.offset = s.out_offset;
    c.tensors.push_back(out);
  }
  // tanhf's 2 ulps: one ulp of a 16-bit value; in f32, where 1 + tanh cancels (x near -5: 0.5 x
  // times 2 ulp of 1), about 5 ulps of 1 (the floor)
  c.tolerance = s.dtype == DType::f32 ? Tolerance{8.0, 1.0, 0.2, 64} : Tolerance{1.0, 0.0, 0.05, 64};
  c.large = numel(s.lead) * s.N > (int64_t{1} << 22);
  return c;
}

OpCase bits_case(const std::string& name, DType dtype, int64_t rows, int64_t N, std::vector<uint64_t> bits,
                 uint32_t seed) {
  Gt s;
  s.lead = {rows};
  s.N = N;
  s.dtype = dtype;
  OpCase c = gt_case(s, CaseKind::odd, seed);
  c.name = std::string(dtype_name(dtype)) + "_" + name;
  c.tensors[0].fill = Fill::bits(std::move(bits));
  return c;
}

std::vector<OpCase> make() {
  std::vector<OpCase> out;
  uint32_t seed = 1;
  auto add = [&](const Gt& s, CaseKind kind) { out.push_back(gt_case(s, kind, seed++)); };
  // FLUX.1-dev and HunyuanVideo (D = 3072, N = 12288): the feed-forward's act on image and text
  // tokens, at full size (large: where a device compares them) and at 33 rows.
  for (const std::vector<int64_t>& lead : {std::vector<int64_t>{1, 4608}, {1, 512}, {33}}) {
    Gt s;
    s.lead = lead;
    s.out_like_x = lead.size() > 1;
    add(s, CaseKind::model);
  }
  // The single block: x proj_mlp's [M, N] output, out the columns [D, D + N) of the [M, D + N] cat
  // buffer (the attention output's columns left as they are); and x the mlp columns of a wider
  // projection (a row stride of 3D + N, as a fused QKV + mlp projection's).
  for (int64_t M : {int64_t{4608 + 512}, int64_t{9}}) {
    Gt s;
    s.lead = {M};
    s.out_row = 3072 + 12288;
    s.out_offset = 3072;
    OpCase c = gt_case(s, CaseKind::view, seed++);
    c.name += "_single_block_cat";
    out.push_back(c);
    s.x_row = 3 * 3072 + 12288;
    s.x_offset = 3 * 3072;
    c = gt_case(s, CaseKind::view, seed++);
    c.name += "_fused_projection";
    out.push_back(c);
  }
  // f16 and f32 at a smaller width (a [B, S, N] activation).
  for (DType dt : {DType::f16, DType::f32}) {
    Gt s;
    s.lead = {2, 9};
    s.N = 9216;
    s.dtype = dt;
    s.out_like_x = true;
    add(s, CaseKind::model);
  }
  // Odd widths: the scalar path (N not a multiple of 16 bytes), and N = 8 / 4: one vector a row.
  for (DType dt : {DType::bf16, DType::f16, DType::f32})
    for (int64_t N : {int64_t{1}, int64_t{3}, int64_t{17}, int64_t{100}, int64_t{3071}, int64_t{8}, int64_t{4}}) {
      Gt s;
      s.lead = {3, 5};
      s.N = N;
      s.dtype = dt;
      s.out_like_x = true;
      add(s, CaseKind::odd);
    }
  // Rows of their own stride: padded x rows, padded out rows, both, an odd pad (the scalar path).
  for (const auto& [x_pad, out_pad] : std::vector<std::pair<int64_t, int64_t>>{{8, 0}, {0, 24}, {3, 5}, {64, 8}}) {
    Gt s;
    s.lead = {2, 7};
    s.N = 128;
    s.x_row = x_pad ? 128 + x_pad : 0;
    s.out_row = out_pad ? 128 + out_pad : 0;
    s.out_like_x = s.out_row != 0;
    add(s, CaseKind::strided);
  }
  // One row: a [N] x and a [N] out.
  {
    Gt s;
    s.lead = {};
    s.N = 100;
    s.out_like_x = true;
    add(s, CaseKind::odd);
  }
  // GELU's edges: +-Inf (Inf, NaN from -Inf * 0), NaN, large magnitudes (the cube overflows to Inf:
  // tanh(Inf) = 1; x -> -large: 0.5 x * (1 + -1) = -0), tanh's cancellation near -5, zeros, subnormals,
  // the largest finite values; then every third element special.
  out.push_back(bits_case("inf_nan", DType::bf16, 2, 16, {0x7F80, 0xFF80, 0x7FC0, 0x0000, 0x8000, 0x3F80, 0xBF80}, seed++));
  out.push_back(bits_case("finite_edges", DType::bf16, 3, 16,
                          {0x42C8, 0xC2C8, 0x40A0, 0xC0A0, 0xC080, 0xC0C0, 0xC120, 0x0001, 0x8001, 0x7F7F, 0xFF7F},
                          seed++));
  out.push_back(bits_case("finite_edges", DType::f16, 3, 16,
                          {0x5640, 0xD640, 0x4500, 0xC500, 0xC400, 0xC600, 0xC900, 0x0001, 0x8001, 0x7BFF, 0xFBFF},
                          seed++));
  out.push_back(bits_case("finite_edges", DType::f32, 3, 8,
                          {0x42C80000, 0xC2C80000, 0x40A00000, 0xC0A00000, 0xC0800000, 0x00000000, 0x80000000,
                           0x00000001, 0x7F7FFFFF, 0xFF7FFFFF, 0x7F800000, 0xFFC00000},
                          seed++));
  for (DType dt : {DType::bf16, DType::f16, DType::f32}) {
    Gt s;
    s.lead = {4, 6};
    s.N = 64;
    s.dtype = dt;
    OpCase c = gt_case(s, CaseKind::odd, seed++);
    c.name += "_special";
    c.tensors[0].fill = Fill::special(3.0, 3);
    out.push_back(c);
  }
  // Empty calls: no rows, no columns.
  {
    Gt s;
    s.lead = {0};
    s.N = 64;
    add(s, CaseKind::empty);
    s.lead = {2, 0};
    s.out_like_x = true;
    add(s, CaseKind::empty);
    s.lead = {3};
    s.N = 0;
    add(s, CaseKind::empty);
  }
  // Refusals: nothing written.
  Gt small;
  small.lead = {2, 4};
  small.N = 32;
  small.out_like_x = true;
  auto invalid = [&](const std::string& name, std::vector<std::string> fragments, auto edit) {
    OpCase c = gt_case(small, CaseKind::invalid, seed++);
    c.name = name;
    edit(c);
    c.invalid = std::move(fragments);
    out.push_back(c);
  };
  invalid("out_width_wrong", {"out.shape[2] must equal N=32 (x.shape[2]) but is 64"},
          [](OpCase& c) { c.tensors[1].shape = {2, 4, 64}; });
  invalid("out_2d_width_wrong", {"out.shape[1] must equal N=32", "but is 31"},
          [](OpCase& c) { c.tensors[1].shape = {8, 31}; });
  invalid("out_rows_wrong", {"out must be [2, 4, 32] (x's leading dims) or [M, N] = [8, 32] but is"},
          [](OpCase& c) { c.tensors[1].shape = {2, 5, 32}; });
  invalid("out_dtype_differs", {"out.dtype must be bf16", "f16"}, [](OpCase& c) { c.tensors[1].dtype = DType::f16; });
  invalid("x_f8", {"x.dtype must be", "f8e4m3fn"}, [](OpCase& c) { c.tensors[0].dtype = DType::f8e4m3fn; });
  invalid("x_last_stride_2", {"x.stride(2) must be 1 but is 2"}, [](OpCase& c) { c.tensors[0].strides = {256, 64, 2}; });
  invalid("x_rows_not_collapsing", {"x.stride(0) must be 128", "but is 1000"},
          [](OpCase& c) { c.tensors[0].strides = {1000, 32, 1}; });
  invalid("out_rows_overlap", {"out's row stride must be >= N=32 (rows may not overlap) but is 16"},
          [](OpCase& c) { c.tensors[1].strides = {64, 16, 1}; });
  {
    OpCase c = gt_case(small, CaseKind::aliased, seed++);
    c.name = "out_over_x";
    c.tensors[1].storage = "x";
    c.invalid = {"x overlaps out in memory"};
    out.push_back(c);
  }
  // Every model case again with each buffer an element off its alignment (the scalar path), with
  // longer rows, and without PDL.
  Variants v;
  v.misalign = {"x", "out"};
  v.pad_rows = {"x", "out"};
  v.options = {{{{"use_pdl", "false"}}, "nopdl"}};
  add_variants(out, v);
  return out;
}

const CaseSet kCases("gelu_tanh", make);

// GELU(tanh) in double with nvcc's fma (testing_oracle::gelu_tanh): the reference's value exactly.
void gelu_tanh_oracle(OracleIo& io) {
  const int x = io.id("x"), out = io.id("out");
  const DType dtype = io.dtype(x);
  const int64_t N = io.shape(x).back(), rows = N ? io.numel(x) / N : 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < N; ++j)
      io.expect(out, r * N + j, testing_oracle::gelu_tanh(io.in(x, r * N + j), dtype, true));
}

const Oracle kGeluTanh{.name = "GELU(tanh) in double with the fma, each fp32 step rounded as the reference's",
                       .expect = gelu_tanh_oracle};
const OracleSet kOracles("gelu_tanh", kGeluTanh);

}  // namespace
}  // namespace ditops::optest
