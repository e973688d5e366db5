// fp8_linear's cases. On the CPU: the whitelisted K at every listed M over a slice of N columns
// (the reference's time stays small), e4m3 / bf16 / f16 x, both reciprocals, bias, odd N and K
// tails, M beyond the kernels, misaligned pointers, an empty call and invalid inputs. Every
// whitelisted (K, N) at full size is `large`: run where a device compares it.
//
// Tolerance against the reference: both accumulate exact products in fp32 in different orders
// (the kernels' K split and MMA order, cuBLASLt's own), so a bf16 output may differ by one ulp
// (cuBLASLt: see tolerance_for_impl); outputs below 1.0 (cancellation) are compared at 1.0's ulp.
// The contract's own bound against an fp64 oracle is checked in tests/test_fp8_linear.cpp,
// cuBLASLt's byte equality with torch._scaled_mm in bench/fp8_linear_torch.py.
#include <string>
#include <vector>

#include "ditops/fp8_linear.h"
#include "op_test_driver.h"

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
  return out;
}

const CaseSet kCases("fp8_linear", make);

}  // namespace
}  // namespace ditops::optest
