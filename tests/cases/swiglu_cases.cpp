// swiglu's cases: FLUX.2's sites (H = 18432: the feed-forward's linear_out input for image and
// text tokens; the single block's mlp columns of to_qkv_mlp_proj's output written into the
// columns [D, D + N) of the cat buffer), scaled down for the CPU; f16 and f32; odd widths (the
// scalar path); rows of their own stride, [B, S, 2N] views with a [B, S, N] or [M, N] out; special
// values and SwiGLU's edges; empty calls; refusals. The reference takes exp in double rounded to
// fp32 where CUDA's expf is within 2 ulp of it: a silu value may be one ulp of the dtype away, the
// product two (f32: a few ulps).
//
// The oracle (below): testing_oracle::swiglu, the fp32 steps in double, each rounded (exp in double
// rounded to fp32), silu rounded to the dtype, the product rounded to the dtype: the reference's
// value exactly.
#include <string>
#include <vector>

#include "op_test_driver.h"
#include "rounding_oracle.h"

namespace ditops::optest {
namespace {

struct Sg {
  std::vector<int64_t> lead = {33};  // x's leading dims
  int64_t N = 18432;
  DType dtype = DType::bf16;
  int64_t x_row = 0, x_offset = 0;      // x's row stride (0: 2N) and its first column in its buffer
  int64_t out_row = 0, out_offset = 0;  // the same for out (0: N, contiguous [M, N] or [..., N])
  bool out_like_x = false;              // out [..., N] with x's leading dims
};

OpCase sg_case(const Sg& s, CaseKind kind, uint32_t seed) {
  OpCase c{.op = "swiglu", .kind = kind, .seed = seed};
  std::string lead;
  for (int64_t e : s.lead) lead += (lead.empty() ? "" : "x") + std::to_string(e);
  c.name = std::string(dtype_name(s.dtype)) + "_" + lead + "_N" + std::to_string(s.N) +
           (s.x_row ? "_xrow" + std::to_string(s.x_row) + "@" + std::to_string(s.x_offset) : "") +
           (s.out_row ? "_outrow" + std::to_string(s.out_row) + "@" + std::to_string(s.out_offset) : "") +
           (s.out_like_x ? "_out_like_x" : "");
  std::vector<int64_t> xs = s.lead;
  xs.push_back(2 * s.N);
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
  // f32 keeps expf's ulps where bf16/f16 round most of them away: on an H100, 11.6 % and 11.9 % of
  // two f32 cases' elements differed from the reference, all within 4 ulp
  c.tolerance = {s.dtype == DType::f32 ? 4.0 : 2.0, 0.0, s.dtype == DType::f32 ? 0.2 : 0.05, 64};
  c.large = numel(s.lead) * 2 * s.N > (int64_t{1} << 22);
  return c;
}

OpCase bits_case(const std::string& name, DType dtype, int64_t rows, int64_t N, std::vector<uint64_t> bits,
                 uint32_t seed) {
  Sg s;
  s.lead = {rows};
  s.N = N;
  s.dtype = dtype;
  OpCase c = sg_case(s, CaseKind::odd, seed);
  c.name = std::string(dtype_name(dtype)) + "_" + name;
  c.tensors[0].fill = Fill::bits(std::move(bits));
  return c;
}

std::vector<OpCase> make() {
  std::vector<OpCase> out;
  uint32_t seed = 1;
  auto add = [&](const Sg& s, CaseKind kind) { out.push_back(sg_case(s, kind, seed++)); };
  // FLUX.2-dev (D = 6144, H = 18432): the feed-forward's act on image and text tokens, at full size
  // (large: where a device compares them) and at 33 rows.
  for (const std::vector<int64_t>& lead : {std::vector<int64_t>{1, 4608}, {1, 512}, {33}}) {
    Sg s;
    s.lead = lead;
    s.out_like_x = lead.size() > 1;
    add(s, CaseKind::model);
  }
  // The single block: x the mlp columns [3D, 3D + 2H) of to_qkv_mlp_proj's [M, 3D + 2H] output, out
  // the columns [D, D + H) of the [M, D + H] cat buffer (the attention output's columns left as they are).
  for (int64_t M : {int64_t{4608 + 512}, int64_t{9}}) {
    Sg s;
    s.lead = {M};
    s.x_row = 3 * 6144 + 2 * 18432;
    s.x_offset = 3 * 6144;
    s.out_row = 6144 + 18432;
    s.out_offset = 6144;
    OpCase c = sg_case(s, CaseKind::view, seed++);
    c.name += "_single_block_cat";
    out.push_back(c);
  }
  // f16 and f32 at FLUX.2-klein-like widths (a [B, S, 2N] activation).
  for (DType dt : {DType::f16, DType::f32}) {
    Sg s;
    s.lead = {2, 9};
    s.N = 9216;
    s.dtype = dt;
    s.out_like_x = true;
    add(s, CaseKind::model);
  }
  // Odd widths: the scalar path (N not a multiple of 16 bytes), and N = 8 / 4: one vector a row.
  for (DType dt : {DType::bf16, DType::f16, DType::f32})
    for (int64_t N : {int64_t{1}, int64_t{3}, int64_t{17}, int64_t{100}, int64_t{3071}, int64_t{8}, int64_t{4}}) {
      Sg s;
      s.lead = {3, 5};
      s.N = N;
      s.dtype = dt;
      s.out_like_x = true;
      add(s, CaseKind::odd);
    }
  // Rows of their own stride: padded x rows, padded out rows, both, an odd pad (the scalar path).
  for (const auto& [x_pad, out_pad] : std::vector<std::pair<int64_t, int64_t>>{{8, 0}, {0, 24}, {3, 5}, {64, 8}}) {
    Sg s;
    s.lead = {2, 7};
    s.N = 128;
    s.x_row = x_pad ? 256 + x_pad : 0;
    s.out_row = out_pad ? 128 + out_pad : 0;
    s.out_like_x = s.out_row != 0;
    add(s, CaseKind::strided);
  }
  // One row: a [2N] x and a [N] out.
  {
    Sg s;
    s.lead = {};
    s.N = 100;
    s.out_like_x = true;
    add(s, CaseKind::odd);
  }
  // SwiGLU's edges (gate | up, the patterns cycling across both halves): silu of +-Inf (Inf, NaN),
  // of -100 (exp overflows: -0), Inf * 0 (NaN), products past the largest finite value (Inf),
  // subnormal gates and ups; then every third element special.
  out.push_back(bits_case("inf_nan", DType::bf16, 2, 16, {0x7F80, 0x0000, 0xFF80, 0x3F80, 0xC2C8, 0x7F80, 0x4120}, seed++));
  out.push_back(bits_case("finite_edges", DType::bf16, 3, 16,
                          {0x42C8, 0xC2C8, 0x4120, 0xC120, 0x3F80, 0xBF80, 0x0000, 0x8000, 0x0001, 0x7F7F, 0x80FF},
                          seed++));
  out.push_back(bits_case("finite_edges", DType::f16, 3, 16,
                          {0x5640, 0xD640, 0x4900, 0xC900, 0x3C00, 0xBC00, 0x0000, 0x8000, 0x0001, 0x7BFF, 0x83FF},
                          seed++));
  out.push_back(bits_case("finite_edges", DType::f32, 3, 8,
                          {0x42C80000, 0xC2C80000, 0x41200000, 0xC1200000, 0x3F800000, 0x00000000, 0x80000000,
                           0x00000001, 0x7F7FFFFF, 0x7F800000, 0xFFC00000},
                          seed++));
  for (DType dt : {DType::bf16, DType::f16, DType::f32}) {
    Sg s;
    s.lead = {4, 6};
    s.N = 64;
    s.dtype = dt;
    OpCase c = sg_case(s, CaseKind::odd, seed++);
    c.name += "_special";
    c.tensors[0].fill = Fill::special(3.0, 3);
    out.push_back(c);
  }
  // Empty calls: no rows, no columns.
  {
    Sg s;
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
  Sg small;
  small.lead = {2, 4};
  small.N = 32;
  small.out_like_x = true;
  auto invalid = [&](const std::string& name, std::vector<std::string> fragments, auto edit) {
    OpCase c = sg_case(small, CaseKind::invalid, seed++);
    c.name = name;
    edit(c);
    c.invalid = std::move(fragments);
    out.push_back(c);
  };
  invalid("odd_last_dim", {"x.shape[2] must be even", "but is 63"}, [](OpCase& c) { c.tensors[0].shape = {2, 4, 63}; });
  invalid("out_width_wrong", {"out.shape[2] must equal N=32 (x.shape[2]=64 / 2) but is 64"},
          [](OpCase& c) { c.tensors[1].shape = {2, 4, 64}; });
  invalid("out_2d_width_wrong", {"out.shape[1] must equal N=32", "but is 31"},
          [](OpCase& c) { c.tensors[1].shape = {8, 31}; });
  invalid("out_rows_wrong", {"out must be [2, 4, 32] (x's leading dims) or [M, N] = [8, 32] but is"},
          [](OpCase& c) { c.tensors[1].shape = {2, 5, 32}; });
  invalid("out_dtype_differs", {"out.dtype must be bf16", "f16"}, [](OpCase& c) { c.tensors[1].dtype = DType::f16; });
  invalid("x_f8", {"x.dtype must be", "f8e4m3fn"}, [](OpCase& c) { c.tensors[0].dtype = DType::f8e4m3fn; });
  invalid("x_last_stride_2", {"x.stride(2) must be 1 but is 2"}, [](OpCase& c) { c.tensors[0].strides = {512, 128, 2}; });
  invalid("x_rows_not_collapsing", {"x.stride(0) must be 256", "but is 1000"},
          [](OpCase& c) { c.tensors[0].strides = {1000, 64, 1}; });
  invalid("out_rows_overlap", {"out's row stride must be >= N=32 (rows may not overlap) but is 16"},
          [](OpCase& c) { c.tensors[1].strides = {64, 16, 1}; });
  {
    OpCase c = sg_case(small, CaseKind::aliased, seed++);
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

const CaseSet kCases("swiglu", make);

// SwiGLU in double (testing_oracle::swiglu): the reference's value exactly.
void swiglu_oracle(OracleIo& io) {
  const int x = io.id("x"), out = io.id("out");
  const DType dtype = io.dtype(x);
  const int64_t K = io.shape(x).back(), N = K / 2, rows = K ? io.numel(x) / K : 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < N; ++j)
      io.expect(out, r * N + j, testing_oracle::swiglu(io.in(x, r * K + j), io.in(x, r * K + N + j), dtype));
}

const Oracle kSwiglu{.name = "SwiGLU in double, each fp32 step rounded as the reference's",
                     .expect = swiglu_oracle};
const OracleSet kOracles("swiglu", kSwiglu);

}  // namespace
}  // namespace ditops::optest
