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

#include "act_rows_cases.h"
#include "op_test_driver.h"
#include "rounding_oracle.h"

namespace ditops::optest {
namespace {

using act_rows::bits_case;
using act_rows::make_case;
using act_rows::Shape;

// tanhf's 2 ulps: one ulp of a 16-bit value; in f32, where 1 + tanh cancels (x near -5: 0.5 x times
// 2 ulp of 1), about 5 ulps of 1 (the floor).
Tolerance tolerance(DType dtype) {
  return dtype == DType::f32 ? Tolerance{8.0, 1.0, 0.2, 64} : Tolerance{1.0, 0.0, 0.05, 64};
}

const act_rows::Op kOp{.name = "gelu_tanh", .x_columns = 1, .tolerance = tolerance};

std::vector<OpCase> make() {
  std::vector<OpCase> out;
  uint32_t seed = 1;
  // FLUX.1-dev and HunyuanVideo (D = 3072, N = 12288): the feed-forward's act on image and text tokens.
  act_rows::add_feed_forward_cases(out, kOp, 12288, seed);
  // The single block: x proj_mlp's [M, N] output, out the columns [D, D + N) of the [M, D + N] cat
  // buffer (the attention output's columns left as they are); and x the mlp columns of a wider
  // projection (a row stride of 3D + N, as a fused QKV + mlp projection's).
  for (int64_t M : {int64_t{4608 + 512}, int64_t{9}}) {
    Shape s;
    s.lead = {M};
    s.N = 12288;
    s.out_row = 3072 + 12288;
    s.out_offset = 3072;
    OpCase c = make_case(kOp, s, CaseKind::view, seed++);
    c.name += "_single_block_cat";
    out.push_back(c);
    s.x_row = 3 * 3072 + 12288;
    s.x_offset = 3 * 3072;
    c = make_case(kOp, s, CaseKind::view, seed++);
    c.name += "_fused_projection";
    out.push_back(c);
    // the whole cat buffer: the attention output as the prefix, out [M, D + N] contiguous
    Shape whole;
    whole.lead = {M};
    whole.N = 12288;
    whole.prefix = 3072;
    c = make_case(kOp, whole, CaseKind::model, seed++);
    c.name += "_single_block_cat";
    out.push_back(c);
  }
  act_rows::add_shape_cases(out, kOp, seed);
  // GELU's edges: +-Inf (Inf, NaN from -Inf * 0), NaN, large magnitudes (the cube overflows to Inf:
  // tanh(Inf) = 1; x -> -large: 0.5 x * (1 + -1) = -0), tanh's cancellation near -5, zeros, subnormals,
  // the largest finite values; then every third element special.
  out.push_back(bits_case(kOp, "inf_nan", DType::bf16, 2, 16, {0x7F80, 0xFF80, 0x7FC0, 0x0000, 0x8000, 0x3F80, 0xBF80}, seed++));
  out.push_back(bits_case(kOp, "finite_edges", DType::bf16, 3, 16,
                          {0x42C8, 0xC2C8, 0x40A0, 0xC0A0, 0xC080, 0xC0C0, 0xC120, 0x0001, 0x8001, 0x7F7F, 0xFF7F},
                          seed++));
  out.push_back(bits_case(kOp, "finite_edges", DType::f16, 3, 16,
                          {0x5640, 0xD640, 0x4500, 0xC500, 0xC400, 0xC600, 0xC900, 0x0001, 0x8001, 0x7BFF, 0xFBFF},
                          seed++));
  out.push_back(bits_case(kOp, "finite_edges", DType::f32, 3, 8,
                          {0x42C80000, 0xC2C80000, 0x40A00000, 0xC0A00000, 0xC0800000, 0x00000000, 0x80000000,
                           0x00000001, 0x7F7FFFFF, 0xFF7FFFFF, 0x7F800000, 0xFFC00000},
                          seed++));
  act_rows::add_refusal(out, kOp, seed, "out_width_wrong", {"out.shape[2] must equal N=32 (x.shape[2]) but is 64"},
                        [](OpCase& c) { c.tensors[1].shape = {2, 4, 64}; });
  act_rows::add_closing_cases(out, kOp, seed);
  return out;
}

const CaseSet kCases("gelu_tanh", make);

// GELU(tanh) in double with nvcc's fma (testing_oracle::gelu_tanh): the reference's value exactly; a
// prefix's columns copied.
void gelu_tanh_oracle(OracleIo& io) {
  const int x = io.id("x");
  const DType dtype = io.dtype(x);
  act_rows::expect_rows(io, 1, [&](int64_t row, int64_t j) { return testing_oracle::gelu_tanh(io.in(x, row + j), dtype); });
}

const Oracle kGeluTanh{.name = "GELU(tanh) in double with the fma, each fp32 step rounded as the reference's",
                       .expect = gelu_tanh_oracle};
const OracleSet kOracles("gelu_tanh", kGeluTanh);

}  // namespace
}  // namespace ditops::optest
