// token_cat_fp8 beyond its driver cases (tests/cases/token_cat_fp8_cases.cpp: the shapes, odd
// widths, scales, misaligned pointers, special values, overlaps and invalid inputs against the
// float64 oracle and the reference, on a device every CUDA implementation): what a case cannot
// express. On the CPU: scales the contract excludes (refused on the CPU only: CUDA does not read
// the scale on the host), tensors on two devices, the vector path's alignment rule, the op's
// description. On a GPU (skipped without one): the token counts whose CPU reference is too slow for
// the driver, and scales outside the contract, with the reciprocal the kernels compute on the
// device (a probe kernel), the facade's choice of implementation per mode and no byte written past
// out. Byte-equality with eager PyTorch is checked by bench/token_cat_fp8_torch.py.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "ditops/op.h"
#include "ditops/registry.h"
#include "ditops/token_cat_fp8.h"
#include "jit/cuda_driver.h"
#include "jit/jit.h"
#include "kernels/token_cat_fp8.cuh"
#include "reference/half.h"
#include "rounding_oracle.h"
#include "test_util.h"

namespace {

using namespace ditops;

const Device kCpu{DeviceKind::cpu, 0};

using ditops::testing_oracle::ieee_inverse;

using test_util::HostTensor;
constexpr auto scale_tensor = HostTensor::scalar;

// ---- bad input: an Error naming the fragments, nothing written ----
struct Bad {
  std::string what;
  std::vector<std::string> fragments;
};

// `watched`: the buffer out_view lies in, which must keep its bytes.
void expect_refused(const TensorView& attn, const TensorView& mlp, const TensorView& scale, HostTensor& watched,
                    const TensorView& out_view, const Bad& bad) {
  SCOPED_TRACE(bad.what);
  std::fill(watched.bytes.begin(), watched.bytes.end(), 0xAB);
  try {
    token_cat_fp8(attn, mlp, scale, out_view);
    ADD_FAILURE() << "expected an Error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("token_cat_fp8: "), std::string::npos) << msg;
    for (const auto& f : bad.fragments) EXPECT_NE(msg.find(f), std::string::npos) << "missing '" << f << "' in: " << msg;
  }
  for (uint8_t b : watched.bytes) ASSERT_EQ(b, 0xAB) << "out was written";
}

// Refusals a driver case cannot express: scales the contract excludes (the CPU reads the scale on
// the host; CUDA does not, so the driver's "every implementation refuses" does not hold), and
// tensors on two devices.
TEST(TokenCatFp8Matching, ScalesOutsideTheContractAndMixedDevicesAreRefused) {
  HostTensor attn(DType::bf16, {2, 4, 32}), mlp(DType::bf16, {2, 4, 48}), out(DType::f8e4m3fn, {2, 4, 80});
  const HostTensor one = scale_tensor(1.0f);
  auto refuse = [&](const TensorView& a, const TensorView& m, const TensorView& s, const TensorView& o, Bad bad) {
    expect_refused(a, m, s, out, o, bad);
  };
  for (float bad : {0.0f, -0.0f, -1.0f, INFINITY, -INFINITY, NAN}) {
    const HostTensor s = scale_tensor(bad);
    refuse(attn.view, mlp.view, s.view, out.view,
           {"scale " + std::to_string(bad), {"input_scale must be finite and > 0 but is"}});
  }
  // Mixed devices (never dereferenced: the match refuses first).
  alignas(16) static uint8_t fake[4096];
  const Device gpu{DeviceKind::cuda, 0};
  TensorView mlp_gpu = TensorView::contiguous(fake, DType::bf16, gpu, {2, 4, 48});
  refuse(attn.view, mlp_gpu, one.view, out.view, {"mlp on cuda", {"mlp.device must be cpu"}});
  TensorView scale_gpu = TensorView::contiguous(fake, DType::f32, gpu, {1});
  refuse(attn.view, mlp.view, scale_gpu, out.view, {"scale on cuda", {"input_scale.device must be cpu"}});
  TensorView out_gpu = TensorView::contiguous(fake, DType::f8e4m3fn, gpu, {2, 4, 80});
  refuse(attn.view, mlp.view, one.view, out_gpu, {"out on cuda", {"out.device must be cpu"}});
}

// The matcher's alignment rule for the vector path (16-byte pointers, widths of 16 bytes).
TEST(TokenCatFp8Matching, TheVectorPathNeedsAlignment) {
  const HostTensor one = scale_tensor(1.0f);
  HostTensor a(DType::bf16, {1, 2, 32}), m(DType::bf16, {1, 2, 48}), o(DType::f8e4m3fn, {1, 2, 80});
  EXPECT_TRUE(match_token_cat_fp8(a.view, m.view, one.view, o.view).aligned16);
  HostTensor a_off(DType::bf16, {1, 2, 32}, 2);
  EXPECT_FALSE(match_token_cat_fp8(a_off.view, m.view, one.view, o.view).aligned16);
  HostTensor o_off(DType::f8e4m3fn, {1, 2, 80}, 1);
  EXPECT_FALSE(match_token_cat_fp8(a.view, m.view, one.view, o_off.view).aligned16);
  HostTensor a_odd(DType::bf16, {1, 2, 24}), o_odd(DType::f8e4m3fn, {1, 2, 72});
  EXPECT_FALSE(match_token_cat_fp8(a_odd.view, m.view, one.view, o_odd.view).aligned16);
}

TEST(TokenCatFp8Description, SlotsOptionsAndAllocRule) {
  const OpDescription& d = op("token_cat_fp8");
  ASSERT_EQ(d.tensors.size(), 4u);
  EXPECT_EQ(d.tensors[3].name, "out");
  EXPECT_EQ(d.tensors[3].alloc_dtype, "f8e4m3fn");
  const int r = d.option_index("fp8_reciprocal");
  ASSERT_GE(r, 0);
  EXPECT_EQ(d.options[r].default_text, "ieee");
  EXPECT_EQ(d.options[r].choices, (std::vector<std::string>{"ieee", "div_full"}));
  HostTensor attn(DType::bf16, {2, 3, 32}), mlp(DType::bf16, {2, 3, 48});
  const HostTensor one = scale_tensor(1.0f);
  GenericCall c = generic_call(d);
  c.tensors[0] = attn.view;
  c.given[0] = true;
  c.tensors[1] = mlp.view;
  c.given[1] = true;
  c.tensors[2] = one.view;
  c.given[2] = true;
  EXPECT_EQ(alloc_shape(d, d.tensors[3], c), (std::vector<int64_t>{2, 3, 80}));
  // The generic call runs the reference and honours the option by name.
  HostTensor out(DType::f8e4m3fn, {2, 3, 80});
  c.tensors[3] = out.view;
  c.given[3] = true;
  c.options[r] = std::string("div_full");
  EXPECT_EQ(call("token_cat_fp8", c), "token_cat_fp8.reference");
  c.options[r] = std::string("neither");
  EXPECT_THROW(call("token_cat_fp8", c), Error);
  // Two jit implementations (one per reciprocal) and the reference are registered.
  std::vector<std::string> names;
  for (const KernelSpec* s : Registry::global().list("token_cat_fp8")) names.push_back(s->name);
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"token_cat_fp8.jit", "token_cat_fp8.jit_div_full", "token_cat_fp8.reference"}));
}

// ---------------------------------------------------------------- GPU
using jit::check_cu;

bool have_gpu() {
  const jit::CudaDriver* d = jit::cuda_driver();
  return d && d->device_count > 0;
}

struct DeviceBuffer {
  CUdeviceptr ptr = 0;
  size_t offset = 0;
  explicit DeviceBuffer(size_t n, size_t offset_bytes = 0) : offset(offset_bytes) {
    check_cu(jit::require_cuda_driver().cuMemAlloc(&ptr, n + offset_bytes + 16), "alloc");
  }
  ~DeviceBuffer() { jit::require_cuda_driver().cuMemFree(ptr); }
  void* get() const { return reinterpret_cast<void*>(ptr + offset); }
  void put(const void* src, size_t n) { check_cu(jit::require_cuda_driver().cuMemcpyHtoD(ptr + offset, src, n), "h2d"); }
  void take(void* dst, size_t n) const { check_cu(jit::require_cuda_driver().cuMemcpyDtoH(dst, ptr + offset, n), "d2h"); }
};

class TokenCatFp8Gpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device: the GPU implementations are checked on the device run";
    jit::bind_primary_context(0);
  }
};

// The reciprocal the kernels of one mode compute on this device (kernels/token_cat_fp8.cuh probe).
float device_inverse(float scale, bool div_full) {
  DeviceBuffer s(4), o(4);
  s.put(&scale, 4);
  KernelRequest r;
  r.header = "token_cat_fp8.cuh";
  r.function = "ditops::token_cat_fp8_inverse_probe";
  r.template_args = jit::kernel_bool(div_full);
  r.params_type = "ditops::TokenCatFp8Params";
  r.max_threads = 32;
  r.template_key = std::string("token_cat_fp8:probe,") + (div_full ? "div_full" : "ieee");
  const jit::LoadedKernel& k = jit::jit_kernel(r, 0);
  TokenCatFp8Params p{};
  p.input_scale = reinterpret_cast<const float*>(s.get());
  p.out = o.get();
  jit::launch(k, 1, 32, &p, sizeof p, nullptr, false);
  check_cu(jit::require_cuda_driver().cuCtxSynchronize(), "sync");
  float inv = 0;
  o.take(&inv, 4);
  return inv;
}

// Fast deterministic 16-bit inputs (the large shapes have 10^8 elements): normal-ish values of a
// few units, so a scale of 0.013 puts them across the whole e4m3 range and beyond 448.
void fill_fast(std::vector<uint16_t>& v, DType dtype, uint64_t seed, float amplitude) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < v.size(); ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    const float u = static_cast<float>((x >> 11) & 0xFFFFF) / 1048576.0f + static_cast<float>((x >> 33) & 0xFFFFF) / 1048576.0f +
                    static_cast<float>((x >> 43) & 0xFFFFF) / 1048576.0f - 1.5f;  // ~ bell on [-1.5, 1.5]
    const float f = amplitude * 2.0f * u;
    v[i] = dtype == DType::bf16 ? ref::float_to_bf16_rne(f) : ref::float_to_fp16_rne(f);
  }
}

struct GpuCase {
  DType dtype = DType::bf16;
  int64_t B = 1, S = 1, Da = 6144, Dm = 18432;
  size_t attn_off = 0, mlp_off = 0, out_off = 0;  // bytes off the allocation (16-byte aligned)
  float scale = 0.013f;
  bool use_pdl = true;
  std::vector<std::pair<int64_t, uint16_t>> specials;  // (flat attn index, bits)
  std::string describe() const {
    return std::string(dtype_name(dtype)) + " [" + std::to_string(B) + ", " + std::to_string(S) + "] Da=" +
           std::to_string(Da) + " Dm=" + std::to_string(Dm) + " offsets " + std::to_string(attn_off) + "/" +
           std::to_string(mlp_off) + "/" + std::to_string(out_off) + " scale " + std::to_string(scale) +
           (use_pdl ? "" : " nopdl");
  }
};

void run_gpu_case(const GpuCase& c, uint64_t seed) {
  SCOPED_TRACE(c.describe());
  const int64_t rows = c.B * c.S, D = c.Da + c.Dm;
  std::vector<uint16_t> a(static_cast<size_t>(rows * c.Da)), m(static_cast<size_t>(rows * c.Dm));
  fill_fast(a, c.dtype, seed, 3.0f);
  fill_fast(m, c.dtype, seed + 7, 1.5f);
  for (auto [i, b] : c.specials)
    if (i < static_cast<int64_t>(a.size())) a[static_cast<size_t>(i)] = b;
  const Device gpu{DeviceKind::cuda, 0};
  DeviceBuffer da(a.size() * 2, c.attn_off), dm(m.size() * 2, c.mlp_off), ds(4), dout(static_cast<size_t>(rows * D), c.out_off);
  da.put(a.data(), a.size() * 2);
  dm.put(m.data(), m.size() * 2);
  ds.put(&c.scale, 4);
  const TensorView ga = TensorView::contiguous(da.get(), c.dtype, gpu, {c.B, c.S, c.Da});
  const TensorView gm = TensorView::contiguous(dm.get(), c.dtype, gpu, {c.B, c.S, c.Dm});
  const TensorView gs = TensorView::contiguous(ds.get(), DType::f32, gpu, {1});
  const TensorView go = TensorView::contiguous(dout.get(), DType::f8e4m3fn, gpu, {c.B, c.S, D});
  // The reference's call on the host copies (matched with a valid scale: the device one may be
  // any value, the reference is given the reciprocal).
  std::vector<uint8_t> want(static_cast<size_t>(rows * D)), got(want.size());
  const float one = 1.0f;
  const TokenCatFp8Call host = match_token_cat_fp8(
      TensorView::contiguous(a.data(), c.dtype, kCpu, {c.B, c.S, c.Da}),
      TensorView::contiguous(m.data(), c.dtype, kCpu, {c.B, c.S, c.Dm}),
      TensorView::contiguous(const_cast<float*>(&one), DType::f32, kCpu, {1}),
      TensorView::contiguous(want.data(), DType::f8e4m3fn, kCpu, {c.B, c.S, D}));
  int ran = 0;
  for (const Fp8Reciprocal mode : {Fp8Reciprocal::ieee, Fp8Reciprocal::div_full}) {
    const bool div_full = mode == Fp8Reciprocal::div_full;
    const float inv = device_inverse(c.scale, div_full);
    const float ieee = ieee_inverse(c.scale);
    if (!div_full)
      EXPECT_TRUE(std::memcmp(&inv, &ieee, 4) == 0 || (std::isnan(inv) && std::isnan(ieee)))
          << "IEEE 1/scale on the device: " << inv << " against " << ieee;
    token_cat_fp8_reference_with_inverse(host, inv);
    TokenCatFp8Options o;
    o.fp8_reciprocal = mode;
    o.use_pdl = c.use_pdl;
    const TokenCatFp8Call call = match_token_cat_fp8(ga, gm, gs, go, o);
    EXPECT_EQ(call.aligned16, c.Da % 16 == 0 && c.Dm % 16 == 0 && c.attn_off % 16 == 0 && c.mlp_off % 16 == 0 &&
                                  c.out_off % 16 == 0);
    // Each mode has one CUDA implementation: the facade, held to the jit backend, picks and runs it.
    o.dispatch.backend = Provenance::jit;
    {
      check_cu(jit::require_cuda_driver().cuMemsetD8(dout.ptr, 0xAB, static_cast<size_t>(rows * D) + c.out_off + 16), "memset");
      EXPECT_EQ(token_cat_fp8(ga, gm, gs, go, o), div_full ? "token_cat_fp8.jit_div_full" : "token_cat_fp8.jit");
      check_cu(jit::require_cuda_driver().cuCtxSynchronize(), "sync");
      dout.take(got.data(), got.size());
      int64_t differ = 0, first = -1;
      for (size_t i = 0; i < got.size(); ++i)
        if (got[i] != want[i] && differ++ == 0) first = static_cast<int64_t>(i);
      EXPECT_EQ(differ, 0) << "first at " << first << ": got 0x" << std::hex << int(got[first < 0 ? 0 : first])
                           << " want 0x" << int(want[first < 0 ? 0 : first]);
      // Nothing written past the end.
      std::vector<uint8_t> tail(16);
      check_cu(jit::require_cuda_driver().cuMemcpyDtoH(tail.data(), dout.ptr + c.out_off + got.size(), 16), "d2h");
      for (uint8_t b : tail) EXPECT_EQ(b, 0xAB) << "written past the end";
      ++ran;
    }
  }
  EXPECT_EQ(ran, 2) << "one CUDA implementation per reciprocal mode";
}

TEST_F(TokenCatFp8Gpu, IssueShapesEveryImplementationByteEqualToTheReference) {
  uint64_t seed = 1;
  // The token counts the driver's cases leave out (their CPU reference under the driver's repeated
  // runs is too slow for it); the others are driver cases.
  for (auto [Da, Dm, tokens] : {std::tuple<int64_t, int64_t, int64_t>{6144, 18432, 4096}, {6144, 18432, 16384},
                                {3072, 9216, 4608}, {3072, 9216, 16384}}) {
    GpuCase c;
    c.S = tokens;
    c.Da = Da;
    c.Dm = Dm;
    run_gpu_case(c, seed++);
  }
}

TEST_F(TokenCatFp8Gpu, SpecialValuesAndScalesOutsideTheContract) {
  // The special bf16 values of the driver's case in attn, on both paths, at scales the contract
  // excludes (0, negative, inf, NaN, subnormal), which CUDA does not check: the kernel's bytes are
  // the reference's formula with the device's reciprocal (eager's, for ieee). The scales inside
  // the contract are the driver's cases.
  const uint16_t specials[] = {0x0000, 0x8000, 0x0001, 0x8001, 0x3F88, 0x3F98, 0xBF98, 0x3A80, 0xBA80,
                               0x3AC0, 0x3B40, 0x3C70, 0x43E0, 0xC3E0, 0x43E8, 0x43F0, 0x7149, 0xF149, 0x7F80,
                               0xFF80, 0x7FC0, 0xFFC0, 0x4348, 0x4378};
  for (float scale : {0.0f, -0.5f, INFINITY, NAN, 0x1p-140f})
    for (int64_t Da : {64, 63}) {
      GpuCase c;
      c.S = 5;
      c.Da = Da;
      c.Dm = 128;
      c.scale = scale;
      for (size_t i = 0; i < sizeof specials / sizeof specials[0]; ++i)
        c.specials.push_back({static_cast<int64_t>(3 * i), specials[i]});
      run_gpu_case(c, 7);
    }
}

}  // namespace
