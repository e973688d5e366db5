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

#include "ditops/fp8_linear.h"
#include "op_test_driver.h"
#include "rounding_oracle.h"

namespace ditops::optest {
namespace {

struct Fl {
  int64_t M = 2, N = 128, K = 5120;
  DType x_dtype = DType::bf16;
  const char* reciprocal = "ieee";
  bool bias = false;
  double x_scale = 0.025, w_scale = 0.02;
  int64_t x_off = 0, w_off = 0;
};

OpCase fl_case(const Fl& s, CaseKind kind, uint32_t seed) {
  OpCase c;
  c.op = "fp8_linear";
  c.kind = kind;
  c.seed = seed;
  c.name = std::string(dtype_name(s.x_dtype)) + "_M" + std::to_string(s.M) + "_N" + std::to_string(s.N) + "_K" +
           std::to_string(s.K) + (s.x_dtype != DType::f8e4m3fn ? std::string("_") + s.reciprocal : "") +
           (s.bias ? "_bias" : "") +
           (s.x_off || s.w_off ? "_off" + std::to_string(s.x_off) + "_" + std::to_string(s.w_off) : "");
  TensorCase x{"x", s.x_dtype, {s.M, s.K}};
  // bf16 x / 0.025 spreads over the e4m3 range (|x| > 11.2 saturates); an e4m3 x is drawn as
  // quantized values.
  x.fill = Fill::normal(s.x_dtype == DType::f8e4m3fn ? 40.0 : 1.0);
  x.offset = s.x_off;
  TensorCase xs{"x_scale", DType::f32, {1}};
  xs.fill = Fill::constant(s.x_scale);
  TensorCase w{"w", DType::f8e4m3fn, {s.N, s.K}};
  w.fill = Fill::normal(32.0);  // SGLang's test weights: randn * 32 in e4m3
  w.offset = s.w_off;
  TensorCase ws{"w_scale", DType::f32, {1}};
  ws.fill = Fill::constant(s.w_scale);
  c.tensors = {x, xs, w, ws};
  if (s.bias) {
    TensorCase b{"bias", DType::bf16, {s.N}};
    b.fill = Fill::normal(4.0);
    c.tensors.push_back(b);
  }
  c.options = {{"fp8_reciprocal", s.reciprocal}};
  c.tolerance = {1, 1.0, 1.0, 0};
  // cuBLASLt's own fp32 order (split-K among them): both sides are within the contract's K bound of
  // the fp64 product, which at these K spans several ulps (4 at most seen on the H200, at M = 2,
  // N = 30720, K = 5120 with bias). A sanity check of layout, scales and bias: the contract itself
  // (byte equality with torch._scaled_mm, the K bound) is checked by tests/python/test_ops_eager.py,
  // bench/fp8_linear_torch.py and Fp8LinearGpu.
  c.tolerance_for_impl = {{"fp8_linear.cublaslt", Tolerance{8, 1.0, 1.0, 0}}};
  c.large = s.M * s.N * s.K > (int64_t{1} << 25);
  return c;
}

std::vector<OpCase> make() {
  std::vector<OpCase> out;
  uint32_t seed = 1;
  auto add = [&](const Fl& s, CaseKind kind) { out.push_back(fl_case(s, kind, seed++)); };

  // The decode K at every listed M over 128 columns; the adaLN K with bias at M 1 and 2.
  for (int64_t M : {1, 2, 3, 4, 8, 9, 16}) {
    Fl s;
    s.M = M;
    add(s, CaseKind::model);
  }
  for (int64_t K : {int64_t{3072}, int64_t{6144}})
    for (int64_t M : {1, 2}) {
      Fl s;
      s.M = M;
      s.K = K;
      s.N = 384;
      s.bias = true;
      add(s, CaseKind::model);
    }
  for (DType dt : {DType::f8e4m3fn, DType::f16})
    for (int64_t M : {1, 9}) {
      Fl s;
      s.M = M;
      s.x_dtype = dt;
      s.K = 4096;
      add(s, CaseKind::model);
    }
  for (int64_t M : {1, 4}) {
    Fl s;
    s.M = M;
    s.reciprocal = "div_full";
    add(s, CaseKind::model);
  }
  // Other scales (one not a power of two).
  {
    Fl s;
    s.M = 3;
    s.K = 1024;
    s.x_scale = 0.4754464328289032;
    s.w_scale = 0.0037;
    add(s, CaseKind::model);
  }

  // Every whitelisted (K, N) at full size: where a device compares (the reference alone is slow).
  // Each kernel's path once per shape (the GEMV at M = 1, two MMA atoms at M = 16; M = 2 with the
  // adaLN bias); the other M run above at a smaller N.
  for (const Fp8LinearShape& w : fp8_linear_whitelist())
    for (int64_t M : w.bias ? std::vector<int64_t>{2} : std::vector<int64_t>{1, 16}) {
      Fl s;
      s.M = M;
      s.N = w.n;
      s.K = w.k;
      s.bias = w.bias;
      OpCase c = fl_case(s, CaseKind::model, seed++);
      c.large = true;
      out.push_back(c);
    }

  // Every whitelisted K (with its bias) at every M listed with it over 16 columns, three seeds each
  // (the contract's bound checks each output, so a slice of N suffices: the whitelisted N, which
  // would repeat these calls, are in the large cases above).
  std::map<std::pair<int64_t, bool>, uint32_t> m_masks;  // (K, bias) -> the M listed
  for (const Fp8LinearShape& w : fp8_linear_whitelist()) m_masks[{w.k, w.bias}] |= w.m_mask;
  for (const auto& [k_bias, m_mask] : m_masks)
    for (int64_t M = 1; M <= 16; ++M) {
      if (!(m_mask >> M & 1u)) continue;
      for (uint32_t s_seed : {0u, 1u, 7u}) {
        Fl s;
        s.M = M;
        s.N = 16;
        s.K = k_bias.first;
        s.bias = k_bias.second;
        OpCase c = fl_case(s, CaseKind::model, 1000 + s_seed);
        c.name += "_seed" + std::to_string(s_seed);
        out.push_back(c);
      }
    }
  // The GPU contract's shapes at the M over a slice of N, three seeds: every implementation
  // within the fp64 bound and run to run identical.
  for (const auto& [K, N, bias] : {std::tuple<int64_t, int64_t, bool>{5120, 128, false}, {3072, 144, true}})
    for (int64_t M : {1, 2, 3, 9, 16})
      for (uint32_t s_seed : {0u, 1u, 7u}) {
        Fl s;
        s.M = M;
        s.N = N;
        s.K = K;
        s.bias = bias;
        OpCase c = fl_case(s, CaseKind::model, 2000 + s_seed);
        c.name += "_seed" + std::to_string(s_seed);
        out.push_back(c);
      }
  // The quantization's boundaries with x_scale 0.025 through a one-hot weight: out[n] is x[n]
  // quantized times 0.025, so every decision shows: +-448, +-11.25 and 32 (saturate), +-11 (440 to
  // 448), +-0.013 (0.52 to 0.5), 11.2 (bf16 11.1875: 447.5 to 448), +-0, 1, 0.5.
  {
    Fl s;
    s.M = 1;
    s.N = 16;
    s.K = 16;
    OpCase c = fl_case(s, CaseKind::odd, seed++);
    c.name = "quantization_boundaries";
    c.tensors[0].fill = Fill::bits({0x43E0, 0xC3E0, 0x4134, 0xC134, 0x4130, 0xC130, 0x3C55, 0xBC55, 0x4200, 0xC200,
                                    0x4133, 0xC133, 0x0000, 0x8000, 0x3F80, 0x3F00});
    std::vector<uint64_t> one_hot(17, 0);  // rows of 16 in a period of 17: w[n][k] = 1 where k == n
    one_hot[0] = 0x38;
    c.tensors[2].fill = Fill::bits(one_hot);
    c.tensors[3].fill = Fill::constant(1.0);
    out.push_back(c);
  }
  // M past the kernels: the reference and cuBLASLt take it.
  {
    Fl s;
    s.M = 20;
    s.N = 32;
    s.K = 64;
    add(s, CaseKind::odd);
  }

  // N tails (rows past N in the last block; N % 16 != 0, which cuBLASLt refuses), short and
  // ragged K (a partial 64-wide chunk), M past the kernels (cuBLASLt only), odd M.
  {
    Fl s;
    s.M = 5;
    s.N = 37;
    s.K = 80;
    OpCase c = fl_case(s, CaseKind::odd, seed++);
    c.unsupported = {{"fp8_linear.cublaslt", "not a multiple of 16"}};
    out.push_back(c);
  }
  {
    Fl s;
    s.M = 1;
    s.N = 19;
    s.K = 16;
    OpCase c = fl_case(s, CaseKind::odd, seed++);
    c.unsupported = {{"fp8_linear.cublaslt", "not a multiple of 16"}};
    out.push_back(c);
  }
  for (int64_t M : {7, 12}) {
    Fl s;
    s.M = M;
    s.N = 48;
    s.K = 8240;  // 8192 + 48: GEMV stages two chunks, the MMA's last chunk is partial
    add(s, CaseKind::odd);
  }
  {
    Fl s;
    s.M = 17;
    s.N = 64;
    s.K = 256;
    OpCase c = fl_case(s, CaseKind::odd, seed++);
    c.unsupported = {{"fp8_linear.skinny_mma", "outside the specialized kernels' 1..16"}};
    out.push_back(c);
  }
  {
    Fl s;
    s.M = 33;
    s.N = 32;
    s.K = 128;
    s.x_dtype = DType::f8e4m3fn;
    add(s, CaseKind::odd);
  }
  // x off 16 bytes: the kernels refuse (16-byte loads); a 16-bit x reaches cuBLASLt through the
  // aligned scratch, an e4m3 x does not.
  {
    Fl s;
    s.M = 2;
    s.N = 64;
    s.K = 256;
    s.x_off = 1;
    OpCase c = fl_case(s, CaseKind::misaligned, seed++);
    c.unsupported = {{"fp8_linear.skinny_mma", "not 16-byte aligned"}};
    out.push_back(c);
  }
  {
    Fl s;
    s.M = 1;
    s.N = 64;
    s.K = 256;
    s.x_dtype = DType::f8e4m3fn;
    s.w_off = 8;
    OpCase c = fl_case(s, CaseKind::misaligned, seed++);
    c.unsupported = {{"fp8_linear.gemv", "not 16-byte aligned"}, {"fp8_linear.cublaslt", "16-byte aligned"}};
    out.push_back(c);
  }
  {
    Fl s;
    s.M = 0;
    s.N = 64;
    s.K = 128;
    add(s, CaseKind::empty);
  }
  {
    Fl s;
    s.M = 2;
    s.N = 32;
    s.K = 64;
    OpCase c = fl_case(s, CaseKind::aliased, seed++);
    c.name = "out_overlaps_x";
    c.tensors.push_back({"out", DType::bf16, {2, 32}});
    c.tensors.back().storage = "x";
    c.invalid = {"x overlaps out in memory"};
    out.push_back(c);
  }

  // Invalid inputs: each names the tensor, the expected and the actual value.
  Fl small;
  small.M = 2;
  small.N = 32;
  small.K = 64;
  auto invalid = [&](const char* name, auto edit, std::vector<std::string> fragments) {
    OpCase c = fl_case(small, CaseKind::invalid, seed++);
    c.name = name;
    edit(c);
    c.invalid = std::move(fragments);
    out.push_back(c);
  };
  invalid("w_bf16", [](OpCase& c) { c.tensors[2].dtype = DType::bf16; }, {"w.dtype must be f8e4m3fn", "bf16"});
  invalid("w_transposed_view",
          [](OpCase& c) {
            c.tensors[2].shape = {64, 32};
            c.tensors[2].strides = {1, 64};
          },
          {"w must be the [N, K] row-major weight", "transposed view"});
  invalid("w_k_differs", [](OpCase& c) { c.tensors[2].shape = {32, 80}; }, {"w.shape[1] must equal K=64", "80"});
  invalid("x_scale_two_elements", [](OpCase& c) { c.tensors[1].shape = {2}; },
          {"x_scale must have exactly 1 element", "2"});
  invalid("w_scale_f16", [](OpCase& c) { c.tensors[3].dtype = DType::f16; }, {"w_scale.dtype must be f32", "f16"});
  invalid("w_scale_two_elements", [](OpCase& c) { c.tensors[3].shape = {2}; },
          {"w_scale must have exactly 1 element", "2"});
  invalid("k_not_multiple_of_16",
          [](OpCase& c) {
            c.tensors[0].shape = {2, 72};
            c.tensors[2].shape = {32, 72};
          },
          {"must be a multiple of 16", "72"});
  invalid("bias_f32", [](OpCase& c) { c.tensors.push_back({"bias", DType::f32, {32}}); },
          {"bias.dtype must be bf16", "f32"});
  invalid("bias_length", [](OpCase& c) { c.tensors.push_back({"bias", DType::bf16, {31}}); },
          {"bias.shape[0] must equal N=32", "31"});
  invalid("x_f32", [](OpCase& c) { c.tensors[0].dtype = DType::f32; }, {"x.dtype must be", "f32"});
  invalid("out_shape", [](OpCase& c) { c.tensors.push_back({"out", DType::bf16, {2, 33}}); },
          {"out.shape[1] must equal N=32", "33"});
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
// far below the bound), times x_scale * w_scale, plus the bias. The contract's bound: one bf16 ulp
// of the result plus K * 2^-24 of the sum of |products| (fp32 accumulation in any order).
void fl_oracle(OracleIo& io) {
  const int x = io.id("x"), w = io.id("w"), out = io.id("out"), bias = io.id("bias");
  const int64_t M = io.shape(x)[0], K = io.shape(x)[1], N = io.shape(w)[0];
  const double xs = io.in(io.id("x_scale"), 0), ws = io.in(io.id("w_scale"), 0);
  const bool quantized = io.dtype(x) == DType::f8e4m3fn;
  const double inv = testing_oracle::ieee_inverse(xs);
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
      io.expect(out, m * N + n, y, ulp + static_cast<double>(K) * 0x1p-24 * magnitude * xs * ws);
    }
  }
}

const OracleSet kOracle("fp8_linear", {.name = "fp64 product within the contract's bound",
                                       .expect = fl_oracle,
                                       .bounds_implementations = true});

}  // namespace
}  // namespace ditops::optest
