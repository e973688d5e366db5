// fp8_linear and fp8_static_quant beyond their driver cases (tests/cases/fp8_linear_cases.cpp and
// fp8_static_quant_cases.cpp: every whitelisted K and M, the quantization's boundaries, special
// values, odd sizes and invalid inputs against the fp64 oracle, which bounds every implementation
// on a device, and the reference): what a case cannot express. A bf16 x and its quantized bytes
// give the same product (two ops, one relation), a weight on another device, the whitelist and
// the dispatch reasons on a simulated sm_90, the op's description, and the cuBLASLt loader.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "core/device.h"
#include "ditops/fp8_linear.h"
#include "ditops/fp8_static_quant.h"
#include "ditops/op.h"
#include "jit/kernel_request.h"
#include "reference/fp8_fp4.h"
#include "reference/half.h"
#include "test_util.h"
#include "vendor/cublaslt.h"

namespace {

using namespace ditops;

using test_util::HostTensor;
constexpr auto scalar = HostTensor::scalar;

// Deterministic bell-shaped values of standard deviation about sigma (a sum of four uniforms from
// a xorshift generator: std::normal_distribution took most of the test's time).
struct Rng {
  uint64_t state;
  explicit Rng(uint32_t seed) : state(seed * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull) {}
  float next(float sigma) {
    float sum = 0.0f;
    for (int i = 0; i < 4; ++i) {
      state ^= state << 13;
      state ^= state >> 7;
      state ^= state << 17;
      sum += static_cast<float>(state >> 40) * 0x1p-24f;
    }
    return (sum - 2.0f) * 1.7320508f * sigma;  // variance of the sum: 4 / 12
  }
};

void fill_bf16(HostTensor& t, Rng& rng, float sigma) {
  for (int64_t i = 0; i < t.view.numel(); ++i) t.u16()[i] = ref::float_to_bf16_rne(rng.next(sigma));
}
// Random e4m3 codes: the value rounded to bf16 first, then looked up (a table of all 2^16 bf16
// patterns), which keeps the generation cheap; the distribution is all that matters here.
void fill_e4m3(HostTensor& t, Rng& rng, float sigma) {
  static const std::vector<uint8_t> code = [] {
    std::vector<uint8_t> c(65536);
    for (uint32_t b = 0; b < 65536; ++b) c[b] = ref::float_to_e4m3_satfinite(ref::bf16_to_float(static_cast<uint16_t>(b)));
    return c;
  }();
  for (int64_t i = 0; i < t.view.numel(); ++i) t.u8()[i] = code[ref::float_to_bf16_rne(rng.next(sigma))];
}

// ---- the CPU reference ----

TEST(Fp8LinearReference, QuantizedAndBf16InputsAgreeAndBothReciprocalsRun) {
  Rng rng(7);
  const int64_t M = 9, N = 48, K = 1024;
  HostTensor x(DType::bf16, {M, K}), w(DType::f8e4m3fn, {N, K}), xq(DType::f8e4m3fn, {M, K});
  fill_bf16(x, rng, 1.0f);
  fill_e4m3(w, rng, 32.0f);
  const HostTensor xs = scalar(0.025f), ws = scalar(0.02f);
  EXPECT_EQ(fp8_static_quant(x.view, xs.view, xq.view), "fp8_static_quant.reference");
  HostTensor a(DType::bf16, {M, N}), b(DType::bf16, {M, N});
  fp8_linear(x.view, xs.view, w.view, ws.view, TensorView{}, a.view);
  fp8_linear(xq.view, xs.view, w.view, ws.view, TensorView{}, b.view);
  EXPECT_EQ(a.bytes, b.bytes) << "a bf16 x and its fp8_static_quant bytes give the same product";
  Fp8LinearOptions o;
  o.fp8_reciprocal = Fp8Reciprocal::div_full;  // the reference's reciprocal is IEEE in both modes
  HostTensor c(DType::bf16, {M, N});
  fp8_linear(x.view, xs.view, w.view, ws.view, TensorView{}, c.view, o);
  EXPECT_EQ(a.bytes, c.bytes);
}

// ---- matching ----

void expect_error(const std::function<void()>& f, const std::vector<std::string>& fragments) {
  try {
    f();
    ADD_FAILURE() << "expected an Error holding " << fragments.front();
  } catch (const Error& e) {
    for (const std::string& s : fragments) EXPECT_NE(std::string(e.what()).find(s), std::string::npos) << e.what();
  }
}

// Tensors on two devices (the driver's cases hold every other refusal).
TEST(Fp8LinearMatching, AWeightOnAnotherDeviceIsRefusedBeforeAnythingIsWritten) {
  HostTensor x(DType::bf16, {2, 64}), w(DType::f8e4m3fn, {32, 64}), out(DType::bf16, {2, 32});
  const HostTensor xs = scalar(0.025f), ws = scalar(0.02f);
  std::fill(out.bytes.begin(), out.bytes.end(), 0xAB);
  const std::vector<uint8_t> before = out.bytes;
  TensorView w_gpu = w.view;
  w_gpu.device = {DeviceKind::cuda, 0};
  expect_error([&] { fp8_linear(x.view, xs.view, w_gpu, ws.view, TensorView{}, out.view); },
               {"w.device must be cpu", "cuda:0"});
  EXPECT_EQ(out.bytes, before);
}

// ---- dispatch on a simulated sm_90 (no GPU needed: nothing runs) ----

GenericCall cuda_call(int64_t M, int64_t N, int64_t K, bool bias, DType x_dtype = DType::bf16) {
  const OpDescription& d = op("fp8_linear");
  GenericCall c = generic_call(d);
  const Device dev{DeviceKind::cuda, 0};
  uintptr_t next = uintptr_t{1} << 40;
  auto view = [&](DType dt, std::vector<int64_t> shape) {
    TensorView v = TensorView::contiguous(reinterpret_cast<void*>(next), dt, dev, shape);
    next += (static_cast<uintptr_t>(std::max<int64_t>(v.span_bytes(), 1)) + 4095) / 4096 * 4096;
    return v;
  };
  auto set = [&](const char* name, const TensorView& v) {
    const int i = d.tensor_index(name);
    c.tensors[i] = v;
    c.given[i] = true;
  };
  set("x", view(x_dtype, {M, K}));
  set("x_scale", view(DType::f32, {1}));
  set("w", view(DType::f8e4m3fn, {N, K}));
  set("w_scale", view(DType::f32, {1}));
  if (bias) set("bias", view(DType::bf16, {N}));
  set("out", view(DType::bf16, {M, N}));
  return c;
}

const CandidateReport& candidate(const DispatchReport& r, const std::string& name) {
  for (const CandidateReport& c : r.candidates)
    if (c.name == name) return c;
  throw Error("no candidate " + name);
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(Fp8LinearDispatch, ExplainSaysWhichPathAShapeTakesAndWhy) {
  const DeviceInfo sm90 = simulated_device_info({DeviceKind::cuda, 0}, 90, 132);
  std::string lt_why;
  const bool have_lt = vendor::cublaslt(&lt_why) != nullptr;

  // Default quality: only the vendor path is bit-exact (byte-equal to torch._scaled_mm); the
  // kernels are close.
  GenericCall c = cuda_call(2, 8192, 5120, false);
  c.dispatch.quality = Quality::exact;
  DispatchReport r = explain("fp8_linear", c, sm90);
  EXPECT_TRUE(contains(candidate(r, "fp8_linear.skinny_mma").reason, "contract is close")) << r.format();
  if (have_lt) {
    ASSERT_NE(r.chosen, nullptr) << r.format();
    EXPECT_EQ(r.chosen->name, "fp8_linear.cublaslt") << r.format();
  } else {
    EXPECT_EQ(r.chosen, nullptr) << r.format();
  }

  // Quality high, a whitelisted shape: not measured, so the vendor implementation takes it.
  c.dispatch.quality = Quality::high;
  r = explain("fp8_linear", c, sm90);
  EXPECT_TRUE(contains(candidate(r, "fp8_linear.skinny_mma").reason, "whitelisted")) << r.format();
  EXPECT_TRUE(contains(candidate(r, "fp8_linear.skinny_mma").reason, "not measured")) << r.format();
  EXPECT_TRUE(contains(candidate(r, "fp8_linear.gemv").reason, "M = 1 only")) << r.format();
  if (have_lt) {
    EXPECT_TRUE(candidate(r, "fp8_linear.cublaslt").chosen) << r.format();
  } else {
    EXPECT_TRUE(contains(candidate(r, "fp8_linear.cublaslt").reason, "cuBLASLt unavailable")) << r.format();
  }

  GenericCall one = cuda_call(1, 18432, 3072, true);
  one.dispatch.quality = Quality::high;
  r = explain("fp8_linear", one, sm90);
  EXPECT_TRUE(contains(candidate(r, "fp8_linear.gemv").reason, "FLUX.1")) << r.format();

  GenericCall off = cuda_call(3, 1024, 1024, false);
  off.dispatch.quality = Quality::high;
  r = explain("fp8_linear", off, sm90);
  EXPECT_TRUE(contains(candidate(r, "fp8_linear.skinny_mma").reason, "not in the whitelist")) << r.format();

  GenericCall big = cuda_call(20, 8192, 5120, false);
  big.dispatch.quality = Quality::high;
  r = explain("fp8_linear", big, sm90);
  EXPECT_TRUE(contains(candidate(r, "fp8_linear.skinny_mma").reason, "outside the specialized kernels' 1..16"))
      << r.format();

  // An explicit backend=jit runs the kernels whatever the whitelist says.
  off.dispatch.backend = Provenance::jit;
  r = explain("fp8_linear", off, sm90);
  ASSERT_NE(r.chosen, nullptr) << r.format();
  EXPECT_EQ(r.chosen->name, "fp8_linear.skinny_mma");
  EXPECT_TRUE(contains(r.template_key, "mma,bf16,ieee,a1,nobias")) << r.template_key;
  GenericCall m1 = cuda_call(1, 8192, 5120, false, DType::f8e4m3fn);
  m1.dispatch.quality = Quality::high;
  m1.dispatch.backend = Provenance::jit;
  r = explain("fp8_linear", m1, sm90);
  ASSERT_NE(r.chosen, nullptr) << r.format();
  EXPECT_EQ(r.chosen->name, "fp8_linear.gemv");
  EXPECT_TRUE(contains(r.template_key, "gemv,f8e4m3fn,r2,nobias")) << r.template_key;
}

TEST(Fp8LinearWhitelist, CoversTheIssueShapesAndNothingIsMeasuredYet) {
  for (const auto& [k, n] : {std::pair<int64_t, int64_t>{5120, 8192}, {5120, 5120}, {5120, 7168}, {5120, 16384},
                             {5120, 34816}, {6144, 5120}, {4096, 4096}, {4096, 5376}, {5376, 4096}})
    for (int64_t m : {1, 2, 3, 4, 8, 9, 16}) EXPECT_NE(fp8_linear_whitelisted(k, n, m), nullptr) << k << " " << n << " " << m;
  for (const auto& [k, n] : {std::pair<int64_t, int64_t>{3072, 18432}, {3072, 9216}, {6144, 36864}, {6144, 18432},
                             {5120, 30720}})
    for (int64_t m : {1, 2}) {
      const Fp8LinearShape* s = fp8_linear_whitelisted(k, n, m);
      ASSERT_NE(s, nullptr) << k << " " << n;
      EXPECT_TRUE(s->bias);
    }
  EXPECT_EQ(fp8_linear_whitelisted(5120, 8192, 5), nullptr);
  // Dispatch chooses a kernel only for a measured entry; none is measured until the H200 run.
  for (const Fp8LinearShape& s : fp8_linear_whitelist()) {
    EXPECT_EQ(s.measured, nullptr) << s.source;
    EXPECT_EQ(s.k % 16, 0);
    EXPECT_EQ(s.m_mask & ~0x1FFFEu, 0u) << "M within 1..16";
  }
}

TEST(Fp8LinearDescription, SlotsAndAllocRule) {
  const OpDescription& d = op("fp8_linear");
  std::vector<std::string> names;
  for (const TensorSlot& t : d.tensors) names.push_back(t.name);
  EXPECT_EQ(names, (std::vector<std::string>{"x", "x_scale", "w", "w_scale", "bias", "out"}));
  const TensorSlot& out = d.tensors[d.tensor_index("out")];
  EXPECT_EQ(out.alloc, "dim(x,0),dim(w,0)");
  EXPECT_EQ(out.alloc_dtype, "bf16");
  EXPECT_TRUE(d.tensors[d.tensor_index("bias")].optional);
  // Both kernels are among the variants the compile test builds for every target arch.
  int gemv = 0, mma = 0;
  for (const KernelSpec* s : Registry::global().list("fp8_linear"))
    if (s->variants)
      for (const auto& r : s->variants()) {
        gemv += contains(r.template_key, "fp8_linear:gemv");
        mma += contains(r.template_key, "fp8_linear:mma");
      }
  EXPECT_GT(gemv, 0);
  EXPECT_GT(mma, 0);
}

// ---- the cuBLASLt loader ----

TEST(CublasLtLoader, LoadsHereOrSaysWhy) {
  std::string why;
  const vendor::CublasLt* lt = vendor::cublaslt(&why);
  struct stat st;
  if (stat("/usr/local/cuda/lib64/libcublasLt.so.13", &st) != 0 && !lt)
    GTEST_SKIP() << "no cuBLASLt on this machine: " << why;
  ASSERT_NE(lt, nullptr) << why;
  EXPECT_GE(lt->version, 130000u) << lt->library;
  EXPECT_NE(lt->cublasLtMatmul, nullptr);
  EXPECT_EQ(vendor::cublaslt(), lt) << "loaded once";
}

TEST(CublasLtLoader, AMissingLibraryGivesAClearReason) {
  vendor::CublasLt api;
  std::string why;
  EXPECT_FALSE(vendor::load_cublaslt({"libcublasLt_bogus.so.99", "libcublasLt_bogus.so"}, &api, &why));
  EXPECT_TRUE(contains(why, "libcublasLt_bogus.so.99 not found: ")) << why;
  EXPECT_TRUE(contains(why, "libcublasLt_bogus.so not found: ")) << why;
  try {
    vendor::check_cublaslt(CUBLAS_STATUS_NOT_SUPPORTED, "cublasLtMatmul");
    ADD_FAILURE() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "cublasLtMatmul: ")) << e.what();
  }
  EXPECT_EQ(vendor::workspace_bytes(90), size_t{32} << 20);
  EXPECT_EQ(vendor::workspace_bytes(89), size_t{4} << 20);
}

}  // namespace
