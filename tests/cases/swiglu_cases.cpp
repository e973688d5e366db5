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

#include "act_rows_cases.h"
#include "op_test_driver.h"
#include "rounding_oracle.h"

namespace ditops::optest {
namespace {

using act_rows::bits_case;
using act_rows::make_case;
using act_rows::Shape;

// f32 keeps expf's ulps where bf16/f16 round most of them away: on an H100, 11.6 % and 11.9 % of
// two f32 cases' elements differed from the reference, all within 4 ulp.
Tolerance tolerance(DType dtype) {
  return {dtype == DType::f32 ? 4.0 : 2.0, 0.0, dtype == DType::f32 ? 0.2 : 0.05, 64};
}

const act_rows::Op kOp{.name = "swiglu", .x_columns = 2, .tolerance = tolerance};

std::vector<OpCase> make() {
  std::vector<OpCase> out;
  uint32_t seed = 1;
  // FLUX.2-dev (D = 6144, H = 18432): the feed-forward's act on image and text tokens.
  act_rows::add_feed_forward_cases(out, kOp, 18432, seed);
  // The single block: x the mlp columns [3D, 3D + 2H) of to_qkv_mlp_proj's [M, 3D + 2H] output, out
  // the columns [D, D + H) of the [M, D + H] cat buffer (the attention output's columns left as they are).
  for (int64_t M : {int64_t{4608 + 512}, int64_t{9}}) {
    Shape s;
    s.lead = {M};
    s.N = 18432;
    s.x_row = 3 * 6144 + 2 * 18432;
    s.x_offset = 3 * 6144;
    s.out_row = 6144 + 18432;
    s.out_offset = 6144;
    OpCase c = make_case(kOp, s, CaseKind::view, seed++);
    c.name += "_single_block_cat";
    out.push_back(c);
    // the whole cat buffer: the attention output as the prefix, out [M, D + H] contiguous
    s.out_row = s.out_offset = 0;
    s.prefix = 6144;
    c = make_case(kOp, s, CaseKind::view, seed++);
    c.name += "_whole_cat";
    out.push_back(c);
  }
  act_rows::add_shape_cases(out, kOp, seed);
  // SwiGLU's edges (gate | up, the patterns cycling across both halves): silu of +-Inf (Inf, NaN),
  // of -100 (exp overflows: -0), Inf * 0 (NaN), products past the largest finite value (Inf),
  // subnormal gates and ups; then every third element special.
  out.push_back(bits_case(kOp, "inf_nan", DType::bf16, 2, 16, {0x7F80, 0x0000, 0xFF80, 0x3F80, 0xC2C8, 0x7F80, 0x4120}, seed++));
  out.push_back(bits_case(kOp, "finite_edges", DType::bf16, 3, 16,
                          {0x42C8, 0xC2C8, 0x4120, 0xC120, 0x3F80, 0xBF80, 0x0000, 0x8000, 0x0001, 0x7F7F, 0x80FF},
                          seed++));
  out.push_back(bits_case(kOp, "finite_edges", DType::f16, 3, 16,
                          {0x5640, 0xD640, 0x4900, 0xC900, 0x3C00, 0xBC00, 0x0000, 0x8000, 0x0001, 0x7BFF, 0x83FF},
                          seed++));
  out.push_back(bits_case(kOp, "finite_edges", DType::f32, 3, 8,
                          {0x42C80000, 0xC2C80000, 0x41200000, 0xC1200000, 0x3F800000, 0x00000000, 0x80000000,
                           0x00000001, 0x7F7FFFFF, 0x7F800000, 0xFFC00000},
                          seed++));
  act_rows::add_refusal(out, kOp, seed, "odd_last_dim", {"x.shape[2] must be even", "but is 63"},
                        [](OpCase& c) { c.tensors[0].shape = {2, 4, 63}; });
  act_rows::add_refusal(out, kOp, seed, "out_width_wrong", {"out.shape[2] must equal N=32 (x.shape[2]=64 / 2) but is 64"},
                        [](OpCase& c) { c.tensors[1].shape = {2, 4, 64}; });
  act_rows::add_closing_cases(out, kOp, seed);
  return out;
}

const CaseSet kCases("swiglu", make);

// SwiGLU in double (testing_oracle::swiglu): the reference's value exactly; a prefix's columns copied.
void swiglu_oracle(OracleIo& io) {
  const int x = io.id("x");
  const DType dtype = io.dtype(x);
  const int64_t N = io.shape(x).back() / 2;
  act_rows::expect_rows(io, 2, [&](int64_t row, int64_t j) {
    return testing_oracle::swiglu(io.in(x, row + j), io.in(x, row + N + j), dtype);
  });
}

const Oracle kSwiglu{.name = "SwiGLU in double, each fp32 step rounded as the reference's",
                     .expect = swiglu_oracle};
const OracleSet kOracles("swiglu", kSwiglu);

}  // namespace
}  // namespace ditops::optest
