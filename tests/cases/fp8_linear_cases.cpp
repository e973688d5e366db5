// fp8_linear's cases. On the CPU: the whitelisted K at every listed M over a slice of N columns
// (the reference's time stays small), e4m3 / bf16 / f16 x, both reciprocals, bias, odd N and K
// tails, M beyond the kernels, misaligned pointers, an empty call and invalid inputs. Every
// whitelisted (K, N) at full size is `large`: run where a device compares it.
//
// Tolerance against the reference: both accumulate exact products in fp32 in different orders
// (the kernels' K split and MMA order, cuBLASLt's own), so a bf16 output may differ by one ulp
// (cuBLASLt: see tolerance_for_impl); outputs below 1.0 (cancellation) are compared at 1.0's ulp.
// The contract's own bound against an fp64 oracle (below) holds for the reference and, on a device,
// for every implementation; cuBLASLt's byte equality with torch._scaled_mm is checked by
// tests/python/test_ops_eager.py and bench/fp8_linear_torch.py.
#include <cmath>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "case_table.h"
#include "ditops/fp8_linear.h"
#include "op_test_driver.h"
#include "rounding_oracle.h"

namespace ditops::optest {
namespace {

using Dims = std::vector<std::pair<std::string, int64_t>>;

Dims mnk(int64_t M, int64_t N, int64_t K) { return {{"M", M}, {"N", N}, {"K", K}}; }

// bf16 x / 0.025 spreads over the e4m3 range (|x| > 11.2 saturates); an e4m3 x is drawn as
// quantized values.
Row e4m3_x(Row r) {
  r.dtype = DType::f8e4m3fn;
  r.tensors.push_back({.name = "x", .fill = Fill::normal(40.0)});
  return r;
}

const RowTensor kBias{.name = "bias", .fill = Fill::normal(4.0)};

std::vector<OpCase> make() {
  const Row table{.options = {{"fp8_reciprocal", "ieee"}},
                  .tensors = {{.name = "x", .fill = Fill::normal(1.0)},
                              {.name = "x_scale", .fill = Fill::constant(0.025)},
                              {.name = "w", .fill = Fill::normal(32.0)},  // SGLang's test weights: randn * 32 in e4m3
                              {.name = "w_scale", .fill = Fill::constant(0.02)}},
                  .tolerance = Tolerance{1, 1.0, 1.0, 0}};
  std::vector<Row> rows;
  // The decode K at every listed M over 128 columns; the adaLN K with bias at M 1 and 2.
  for (int64_t M : {1, 2, 3, 4, 8, 9, 16}) rows.push_back({.dims = mnk(M, 128, 5120)});
  for (int64_t K : {3072, 6144})
    for (int64_t M : {1, 2}) rows.push_back({.dims = mnk(M, 384, K), .tensors = {kBias}});
  for (int64_t M : {1, 9}) rows.push_back(e4m3_x({.dims = mnk(M, 128, 4096)}));
  for (int64_t M : {1, 9}) rows.push_back({.dims = mnk(M, 128, 4096), .dtype = DType::f16});
  for (int64_t M : {1, 4}) rows.push_back({.dims = mnk(M, 128, 5120), .options = {{"fp8_reciprocal", "div_full"}}});
  // Other scales (one not a power of two).
  rows.push_back({.dims = mnk(3, 128, 1024),
                  .tensors = {{.name = "x_scale", .fill = Fill::constant(0.4754464328289032)},
                              {.name = "w_scale", .fill = Fill::constant(0.0037)}}});
  // Every whitelisted (K, N) at full size: where a device compares (the reference alone is slow).
  // Each kernel's path once per shape (the GEMV at M = 1, two MMA atoms at M = 16; M = 2 with the
  // adaLN bias); the other M run above at a smaller N.
  for (const Fp8LinearShape& w : fp8_linear_whitelist())
    for (int64_t M : w.bias ? std::vector<int64_t>{2} : std::vector<int64_t>{1, 16})
      rows.push_back({.dims = mnk(M, w.n, w.k), .tensors = w.bias ? std::vector<RowTensor>{kBias}
                                                                  : std::vector<RowTensor>{},
                      .large = true});
  // The quantization's boundaries with x_scale 0.025 through a one-hot weight: out[n] is x[n]
  // quantized times 0.025, so every decision shows: +-448, +-11.25 and 32 (saturate), +-11 (440 to
  // 448), +-0.013 (0.52 to 0.5), 11.2 (bf16 11.1875: 447.5 to 448), +-0, 1, 0.5.
  std::vector<uint64_t> one_hot(17, 0);  // rows of 16 in a period of 17: w[n][k] = 1 where k == n
  one_hot[0] = 0x38;
  rows.push_back({.dims = mnk(1, 16, 16), .kind = CaseKind::odd,
                  .tensors = {{.name = "x", .fill = Fill::bits({0x43E0, 0xC3E0, 0x4134, 0xC134, 0x4130, 0xC130, 0x3C55,
                                                                0xBC55, 0x4200, 0xC200, 0x4133, 0xC133, 0x0000, 0x8000,
                                                                0x3F80, 0x3F00})},
                              {.name = "w", .fill = Fill::bits(one_hot)},
                              {.name = "w_scale", .fill = Fill::constant(1.0)}},
                  .name = "quantization_boundaries"});
  // M past the kernels: the reference and cuBLASLt take it. N tails (rows past N in the last
  // block; N % 16 != 0, which cuBLASLt refuses), short and ragged K (a partial 64-wide chunk), M past
  // the kernels (cuBLASLt only), odd M.
  const std::pair<std::string, std::string> n_tail{"fp8_linear.cublaslt", "not a multiple of 16"};
  rows.push_back({.dims = mnk(20, 32, 64), .kind = CaseKind::odd});
  rows.push_back({.dims = mnk(5, 37, 80), .kind = CaseKind::odd, .unsupported = {n_tail}});
  rows.push_back({.dims = mnk(1, 19, 16), .kind = CaseKind::odd, .unsupported = {n_tail}});
  // K = 8192 + 48: GEMV stages two chunks, the MMA's last chunk is partial.
  for (int64_t M : {7, 12}) rows.push_back({.dims = mnk(M, 48, 8240), .kind = CaseKind::odd});
  rows.push_back({.dims = mnk(17, 64, 256), .kind = CaseKind::odd,
                  .unsupported = {{"fp8_linear.skinny_mma", "outside the specialized kernels' 1..16"}}});
  rows.push_back(e4m3_x({.dims = mnk(33, 32, 128), .kind = CaseKind::odd}));
  // x off 16 bytes: the kernels refuse (16-byte loads); a 16-bit x reaches cuBLASLt through the
  // aligned scratch, an e4m3 x does not.
  rows.push_back({.dims = mnk(2, 64, 256), .kind = CaseKind::misaligned, .tensors = {{.name = "x", .offset = 1}},
                  .unsupported = {{"fp8_linear.skinny_mma", "not 16-byte aligned"}}});
  rows.push_back(e4m3_x({.dims = mnk(1, 64, 256), .kind = CaseKind::misaligned, .tensors = {{.name = "w", .offset = 8}},
                         .unsupported = {{"fp8_linear.gemv", "not 16-byte aligned"},
                                         {"fp8_linear.cublaslt", "16-byte aligned"}}}));
  rows.push_back({.dims = mnk(0, 64, 128), .kind = CaseKind::empty});
  // Refused before anything is written: each names the tensor, the expected and the actual value.
  const Dims small = mnk(2, 32, 64);
  rows.push_back({.dims = small, .kind = CaseKind::aliased, .tensors = {{.name = "out", .storage = "x"}},
                  .name = "out_overlaps_x", .invalid = {"x overlaps out in memory"}});
  for (const auto& [name, tensors, invalid] :
       std::vector<std::tuple<std::string, std::vector<RowTensor>, std::vector<std::string>>>{
           {"w_bf16", {{.name = "w", .dtype = DType::bf16}}, {"w.dtype must be f8e4m3fn", "bf16"}},
           {"w_transposed_view", {{.name = "w", .shape = {{64, 32}}, .strides = {1, 64}}},
            {"w must be the [N, K] row-major weight", "transposed view"}},
           {"w_k_differs", {{.name = "w", .shape = {{32, 80}}}}, {"w.shape[1] must equal K=64", "80"}},
           {"x_scale_two_elements", {{.name = "x_scale", .shape = {{2}}}}, {"x_scale must have exactly 1 element", "2"}},
           {"w_scale_f16", {{.name = "w_scale", .dtype = DType::f16}}, {"w_scale.dtype must be f32", "f16"}},
           {"w_scale_two_elements", {{.name = "w_scale", .shape = {{2}}}}, {"w_scale must have exactly 1 element", "2"}},
           {"k_not_multiple_of_16", {{.name = "x", .shape = {{2, 72}}}, {.name = "w", .shape = {{32, 72}}}},
            {"must be a multiple of 16", "72"}},
           {"bias_f32", {{.name = "bias", .dtype = DType::f32}}, {"bias.dtype must be bf16", "f32"}},
           {"bias_length", {{.name = "bias", .shape = {{31}}}}, {"bias.shape[0] must equal N=32", "31"}},
           {"x_f32", {{.name = "x", .dtype = DType::f32}}, {"x.dtype must be", "f32"}},
           {"out_shape", {{.name = "out", .shape = {{2, 33}}}}, {"out.shape[1] must equal N=32", "33"}}})
    rows.push_back({.dims = small, .kind = CaseKind::invalid, .tensors = tensors, .name = name, .invalid = invalid});
  uint32_t seed = 1;
  std::vector<OpCase> out = table_cases("fp8_linear", table, rows, seed);

  // Every whitelisted K (with its bias) at every M listed with it over 16 columns, and the GPU
  // contract's shapes at the M over a slice of N, three seeds each (the contract's bound
  // checks each output, so a slice of N suffices: the whitelisted N, which would repeat these
  // calls, are in the large cases above): every implementation within the fp64 bound and run to
  // run identical.
  std::map<std::pair<int64_t, bool>, uint32_t> m_masks;  // (K, bias) -> the M listed
  for (const Fp8LinearShape& w : fp8_linear_whitelist()) m_masks[{w.k, w.bias}] |= w.m_mask;
  std::vector<std::tuple<Dims, bool, uint32_t>> slices;  // (dims, bias, first seed)
  for (const auto& [k_bias, m_mask] : m_masks)
    for (int64_t M = 1; M <= 16; ++M)
      if (m_mask >> M & 1u) slices.emplace_back(mnk(M, 16, k_bias.first), k_bias.second, 1000);
  for (const auto& [K, N, bias] : {std::tuple<int64_t, int64_t, bool>{5120, 128, false}, {3072, 144, true}})
    for (int64_t M : {1, 2, 3, 9, 16}) slices.emplace_back(mnk(M, N, K), bias, 2000);
  for (uint32_t s : {0u, 1u, 7u}) {
    std::vector<Row> seeded;
    for (const auto& [dims, bias, first] : slices)
      seeded.push_back({.dims = dims, .tensors = bias ? std::vector<RowTensor>{kBias} : std::vector<RowTensor>{},
                        .seed = first + s});
    for (OpCase& c : table_cases("fp8_linear", table, seeded, seed)) {
      c.name += "_seed" + std::to_string(s);
      out.push_back(std::move(c));
    }
  }
  for (OpCase& c : out) {
    // cuBLASLt's own fp32 order (split-K among them): both sides are within the contract's K bound
    // of the fp64 product, which at these K spans several ulps (4 at most seen on the H200, at M = 2,
    // N = 30720, K = 5120 with bias). A sanity check of layout, scales and bias: the contract itself
    // (byte equality with torch._scaled_mm, the K bound) is checked by tests/python/test_ops_eager.py,
    // bench/fp8_linear_torch.py and Fp8LinearGpu.
    c.tolerance_for_impl = {{"fp8_linear.cublaslt", Tolerance{8, 1.0, 1.0, 0}}};
    const auto& x = c.tensors[0].shape;
    const auto& w = c.tensors[2].shape;
    if (x.size() == 2 && w.size() == 2) c.large = c.large || x[0] * w[0] * x[1] > (int64_t{1} << 25);
  }
  // The base model cases again with x an element off its alignment: the kernels refuse it (16-byte
  // loads), the reference and cuBLASLt (through its aligned scratch, for a 16-bit x) take it.
  Variants off;
  off.misalign = {"x"};
  off.of = [](const OpCase& c) {
    return c.kind == CaseKind::model && !c.large && c.name.find("_seed") == std::string::npos;
  };
  add_variants(out, off);
  return out;
}

const CaseSet kCases("fp8_linear", make);

// The fp64 oracle: xq decoded from e4m3 codes rounded here (x * fl32(1 / x_scale) to fp32, clamped,
// on the 4-bit grid) or given, every product xq * w exact in double, the sum in double (its error
// far below the bound), times x_scale * w_scale, plus the bias. The bound: one bf16 ulp of the
// result plus (K * per_k + fixed) of the sum of |products| (times the scales).
void fl_oracle(OracleIo& io, double per_k, double fixed) {
  const int x = io.id("x"), w = io.id("w"), out = io.id("out"), bias = io.id("bias");
  const int64_t M = io.shape(x)[0], K = io.shape(x)[1], N = io.shape(w)[0];
  const double xs = io.in(io.id("x_scale"), 0), ws = io.in(io.id("w_scale"), 0);
  const bool quantized = io.dtype(x) == DType::f8e4m3fn;
  const double inv = testing_oracle::ieee_inverse(xs);
  const double relative = static_cast<double>(K) * per_k + fixed;
  std::vector<double> xq(static_cast<size_t>(M * K)), wv(static_cast<size_t>(K));
  for (int64_t i = 0; i < M * K; ++i)
    xq[i] = quantized ? io.in(x, i) : testing_oracle::round_e4m3_saturated(testing_oracle::round_f32(io.in(x, i) * inv));
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t k = 0; k < K; ++k) wv[k] = io.in(w, n * K + k);
    for (int64_t m = 0; m < M; ++m) {
      double sum = 0, magnitude = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double p = xq[m * K + k] * wv[k];
        sum += p;
        magnitude += std::fabs(p);
      }
      const double y = sum * xs * ws + (bias >= 0 ? io.in(bias, n) : 0.0);
      int e = 0;
      std::frexp(y == 0 || !std::isfinite(y) ? 0x1p-126 : y, &e);
      const double ulp = std::ldexp(1.0, std::max(e - 1, -126) - 7);
      io.expect(out, m * N + n, y, ulp + relative * magnitude * xs * ws);
    }
  }
}

const std::string kCublasLt = "fp8_linear.cublaslt";

// The contract of the reference and the kernels: fp32 accumulation in any order, K * 2^-24.
const OracleSet kOracle("fp8_linear", {.name = "fp64 product within the contract's bound",
                                       .expect = [](OracleIo& io) { fl_oracle(io, 0x1p-24, 0); },
                                       .bounds_implementations = true,
                                       .bounds_implementation = [](const std::string& i) { return i != kCublasLt; }});

// cuBLASLt's on sm_90: its FP8 tensor cores add the products of one MMA with an accumulator of
// about 14 bits before the fp32 promotion (DeepSeek-V3 report, 3.3.2), so 2^-12 of the sum of
// |products| on top of the fp32 term (H200: up to 2^-14.8 of it, at K = 256, M = 17, where the fp32
// bound alone failed 1 to 3 elements of ~1000). Its exact contract is byte
// equality with torch._scaled_mm (tests/python/test_ops_eager.py, bench/fp8_linear_torch.py).
const OracleSet kOracleCublasLt("fp8_linear", {.name = "fp64 product within cuBLASLt's sm_90 accumulator bound",
                                               .expect = [](OracleIo& io) { fl_oracle(io, 0x1p-24, 0x1p-12); },
                                               .bounds_implementations = true,
                                               .bounds_implementation = [](const std::string& i) { return i == kCublasLt; }});

}  // namespace
}  // namespace ditops::optest
