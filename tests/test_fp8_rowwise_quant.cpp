// What fp8_rowwise_quant's driver cases (tests/cases/fp8_rowwise_quant_cases.cpp) cannot express:
// the proof behind the kernels' division (kernels/common/fp8_rowwise.cuh fp8_rowwise_divide: the
// fma correction of y * (1 / s) equals the IEEE quotient y / s for every value a row can hold, on
// rows where fp8_rowwise_fast(s)), checked exhaustively over significands on the host, whose fp32
// operations are the device's (IEEE, round to nearest, no flush); the description's alloc rule with
// and without prefix; the 16-byte path's classification; the GELU table (kernels/common/gelu_table.cuh)
// against the evaluated GELU for every bf16 value, on a GPU (its check kernel compiled for every target
// arch wherever NVRTC loads).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <vector>

#include "ditops/fp8_rowwise_quant.h"
#include "ditops/op.h"
#include "core/device.h"
#include "jit/cuda_driver.h"
#include "jit/jit.h"
#include "kernels/fp8_rowwise_quant.cuh"
#include "reference/fp8_fp4.h"
#include "test_util.h"

namespace ditops {
namespace {

uint32_t bits_of(float v) {
  uint32_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
}
float from_bits(uint32_t b) {
  float v;
  std::memcpy(&v, &b, sizeof v);
  return v;
}

// The device's fast quotient, operation by operation (std::fma is the single-rounding fma).
float fast_divide(float y, float s, float r) {
  const float q0 = y * r;
  const float q = std::fma(std::fma(-s, q0, y), r, q0);
  return from_bits((bits_of(q) & 0x7FFFFFFFu) | (bits_of(y) & 0x80000000u));
}

// Every pair of 11-bit significands (f16's; bf16's 8-bit ones are among them) with the quotient's
// exponent from 2^-32 to 2^8 (a row's |y| <= amax ~ 448 s; below 2^-11 every e4m3 byte is a
// signed zero), at the ends and the middle of the fast range of s (normal, >= 2^-64): the result
// for s * 2^k and y * 2^k is the same while the remainder y - s q0 stays exact (its quantum,
// ~2^(e_y - 46), at or above fp32's 2^-149: y >= 2^-103, which every y with an e4m3-relevant
// quotient >= 2^-12 s >= 2^-76 is), so these cover every such s. The quotients' bits are equal;
// for zeros, subnormal and tiny y (quotients far below e4m3's 2^-10) the e4m3 bytes are.
TEST(Fp8RowwiseDivision, TheFmaCorrectionEqualsTheIeeeQuotientForEveryRowValue) {
  int64_t checked = 0, differ = 0;
  for (int s_exp : {-64, 0, 119})
    for (uint32_t sm = 0; sm < 1024; ++sm) {
      const float s = std::ldexp(1.0f + static_cast<float>(sm) / 1024.0f, s_exp);
      const float r = 1.0f / s;
      for (int offset = -31; offset <= 8; ++offset)
        for (uint32_t ym = 0; ym < 1024; ++ym)
          for (float sign : {1.0f, -1.0f}) {
            const float y = sign * std::ldexp(1.0f + static_cast<float>(ym) / 1024.0f, s_exp + offset);
            differ += bits_of(fast_divide(y, s, r)) != bits_of(y / s);
            ++checked;
          }
      for (float y : {0.0f, -0.0f, 0x1p-149f, -0x1p-149f, 0x1.ffcp-127f, -0x1.8p-130f, 0x1.4p-110f, -0x1.2p-104f}) {
        differ += ref::float_to_e4m3_satfinite(fast_divide(y, s, r)) != ref::float_to_e4m3_satfinite(y / s);
        ++checked;
      }
    }
  EXPECT_EQ(differ, 0) << "of " << checked;
  EXPECT_GT(checked, int64_t{240} << 20);
}

GenericCall call_of(const OpDescription& op, const std::vector<std::pair<std::string, TensorView>>& tensors) {
  GenericCall c = generic_call(op);
  for (const auto& [name, t] : tensors) {
    c.tensors[op.tensor_index(name)] = t;
    c.given[op.tensor_index(name)] = true;
  }
  return c;
}

TEST(Fp8RowwiseQuantDescription, AllocRulesTakeThePrefixWidthWhereThereIsOne) {
  const OpDescription& op = ditops::op("fp8_rowwise_quant");
  std::vector<uint16_t> x(2 * 3 * 40), p(2 * 3 * 24);
  const TensorView xv = TensorView::contiguous(x.data(), DType::bf16, {DeviceKind::cpu, 0}, {2, 3, 40});
  const TensorView pv = TensorView::contiguous(p.data(), DType::bf16, {DeviceKind::cpu, 0}, {2, 3, 24});
  const TensorSlot& out = op.tensors[op.tensor_index("out")];
  const TensorSlot& scale = op.tensors[op.tensor_index("out_scale")];
  EXPECT_EQ(alloc_shape(op, out, call_of(op, {{"x", xv}})), (std::vector<int64_t>{6, 40}));
  EXPECT_EQ(alloc_shape(op, out, call_of(op, {{"x", xv}, {"prefix", pv}})), (std::vector<int64_t>{6, 64}));
  EXPECT_EQ(alloc_shape(op, scale, call_of(op, {{"x", xv}})), (std::vector<int64_t>{6, 1}));
  // act=swiglu: x's 40 columns give 20 (is(act,swiglu) in the rule); the other choices keep 40.
  const int act = op.option_index("act");
  for (const auto& [choice, width] : std::vector<std::pair<std::string, int64_t>>{{"swiglu", 20}, {"gelu_tanh", 40}}) {
    GenericCall c = call_of(op, {{"x", xv}});
    c.options[act] = choice;
    EXPECT_EQ(alloc_shape(op, out, c), (std::vector<int64_t>{6, width})) << choice;
    c = call_of(op, {{"x", xv}, {"prefix", pv}});
    c.options[act] = choice;
    EXPECT_EQ(alloc_shape(op, out, c), (std::vector<int64_t>{6, width + 24})) << choice;
  }
}

TEST(Fp8RowwiseQuantMatching, TheVectorPathNeedsWholeUnitsAndAlignedRows) {
  alignas(16) static uint16_t x[8 * 200], p[8 * 200];
  alignas(16) static uint8_t out[8 * 400];
  alignas(16) static float scale[8];
  const Device cpu{DeviceKind::cpu, 0};
  auto rows = [&](void* data, int64_t width, int64_t stride) {
    TensorView v = TensorView::contiguous(data, DType::bf16, cpu, {8, width});
    v.strides[0] = stride;
    return v;
  };
  auto match = [&](int64_t K, int64_t Kp, int64_t x_stride, int x_off) {
    const TensorView xv = rows(x + x_off, K, x_stride);
    const TensorView pv = Kp ? rows(p, Kp, Kp) : TensorView{};
    const TensorView ov = TensorView::contiguous(out, DType::f8e4m3fn, cpu, {8, K + Kp});
    const TensorView sv = TensorView::contiguous(scale, DType::f32, cpu, {8, 1});
    return match_fp8_rowwise_quant(xv, pv, ov, sv);
  };
  EXPECT_TRUE(match(128, 64, 128, 0).aligned16);
  EXPECT_TRUE(match(128, 0, 136, 0).aligned16);   // rows of 136 elements: 272 bytes apart
  EXPECT_FALSE(match(128, 0, 132, 0).aligned16);  // 264 bytes apart
  EXPECT_FALSE(match(120, 0, 128, 0).aligned16);  // K not a multiple of 16
  EXPECT_FALSE(match(128, 24, 128, 0).aligned16);
  EXPECT_FALSE(match(128, 0, 128, 1).aligned16);  // x 2 bytes off
  EXPECT_EQ(match(128, 0, 136, 0).x_row_stride, 136);
  // act=swiglu: the output's N = K / 2 columns of x must be whole units (the up half starts N on).
  auto swiglu = [&](int64_t K, int64_t Kp) {
    const TensorView xv = rows(x, K, K);
    const TensorView pv = Kp ? rows(p, Kp, Kp) : TensorView{};
    const TensorView ov = TensorView::contiguous(out, DType::f8e4m3fn, cpu, {8, K / 2 + Kp});
    const TensorView sv = TensorView::contiguous(scale, DType::f32, cpu, {8, 1});
    Fp8RowwiseQuantOptions o;
    o.act = Fp8RowwiseAct::swiglu;
    return match_fp8_rowwise_quant(xv, pv, ov, sv, o);
  };
  EXPECT_TRUE(swiglu(64, 16).aligned16);
  EXPECT_EQ(swiglu(64, 16).act_width, 32);
  EXPECT_FALSE(swiglu(48, 16).aligned16);  // N = 24
  EXPECT_FALSE(swiglu(64, 8).aligned16);
}

// Which calls take the GELU table (the key's ",table"): bf16 GELU rows on the vector path with rows
// enough for 4 CTAs per SM to take 4 each (2112 on 132 SMs) where DITOPS_GELU_TABLE=1 opts in (read
// when a device's info is made); never f16, act none, SwiGLU, few rows or the scalar path.
TEST(Fp8RowwiseGeluTable, TakenByBf16GeluCallsOfManyRowsWhereOptedIn) {
  auto device_with = [](const char* gelu) {
    test_util::ScopedEnv env("DITOPS_GELU_TABLE", gelu);
    return simulated_device_info({DeviceKind::cuda, 0}, 90, 132);
  };
  const DeviceInfo plain = device_with(nullptr);
  const DeviceInfo sm90 = device_with("1");
  EXPECT_FALSE(plain.features & kFeatureGeluTable);
  ASSERT_TRUE(sm90.features & kFeatureGeluTable);
  const OpDescription& op = ditops::op("fp8_rowwise_quant");
  const int act = op.option_index("act");
  const Device gpu{DeviceKind::cuda, 0};
  auto key = [&](int64_t rows, int64_t K, DType dtype, const std::string& choice, const DeviceInfo& device) {
    auto at = [](uintptr_t gib) { return reinterpret_cast<void*>(gib << 30); };  // aligned, disjoint, never read
    const int64_t N = choice == "swiglu" ? K / 2 : K;
    GenericCall c = call_of(op, {{"x", TensorView::contiguous(at(1), dtype, gpu, {rows, K})},
                                 {"out", TensorView::contiguous(at(2), DType::f8e4m3fn, gpu, {rows, N})},
                                 {"out_scale", TensorView::contiguous(at(3), DType::f32, gpu, {rows, 1})}});
    c.options[act] = choice;
    return explain("fp8_rowwise_quant", c, device).template_key;
  };
  auto tabled = [](const std::string& k) { return k.find(",table") != std::string::npos; };
  EXPECT_TRUE(tabled(key(4608, 12288, DType::bf16, "gelu_tanh", sm90))) << key(4608, 12288, DType::bf16, "gelu_tanh", sm90);
  EXPECT_TRUE(tabled(key(2112, 512, DType::bf16, "gelu_tanh", sm90)));
  EXPECT_FALSE(tabled(key(2111, 512, DType::bf16, "gelu_tanh", sm90)));
  EXPECT_FALSE(tabled(key(512, 12288, DType::bf16, "gelu_tanh", sm90)));  // FLUX.1's text rows
  EXPECT_FALSE(tabled(key(4608, 12288, DType::f16, "gelu_tanh", sm90)));
  EXPECT_FALSE(tabled(key(4608, 12288, DType::bf16, "none", sm90)));
  EXPECT_FALSE(tabled(key(4608, 120, DType::bf16, "gelu_tanh", sm90)));  // the scalar path
  EXPECT_FALSE(tabled(key(4608, 12288, DType::bf16, "gelu_tanh", plain)));
  // SwiGLU (FLUX.2's FF-down input) is evaluated: 3 slots of up to 512 threads, not the table's 256
  const std::string swiglu = key(4608, 36864, DType::bf16, "swiglu", sm90);
  EXPECT_FALSE(tabled(swiglu)) << swiglu;
  EXPECT_NE(swiglu.find("slots=3"), std::string::npos) << swiglu;
}

// The GELU table's check kernel (kernels/fp8_rowwise_quant.cuh): not an op's, so the JIT compile
// test of every registered variant does not see it.
KernelRequest gelu_table_check_request() {
  KernelRequest r;
  r.header = "fp8_rowwise_quant.cuh";
  r.function = "ditops::fp8_rowwise_gelu_table_check_body";
  r.template_args = jit::kernel_type_name(DType::bf16);
  r.params_type = "ditops::GeluTableCheckParams";
  r.max_threads = 256;
  r.template_key = "fp8_rowwise_gelu_table_check:bf16";
  return r;
}

TEST(Fp8RowwiseGeluTable, CheckKernelCompilesForEveryTargetArch) {
  if (jit::nvrtc_version() <= 0) GTEST_SKIP() << "NVRTC not loadable here";
  for (const char* arch : {"sm_90a", "sm_100a", "sm_120a"}) {
    std::vector<uint8_t> cubin;
    ASSERT_NO_THROW(cubin = jit::nvrtc_compile(jit::wrapper_source(gelu_table_check_request(), "ditops_entry"),
                                               "ditops_jit_entry.cu", arch, jit::embedded_sources()))
        << arch;
    EXPECT_GT(cubin.size(), 1000u) << arch;
  }
}

// Every bf16 value (the table's and the others', which take the evaluated path) through the unit path
// with the table equals the evaluated word's (gelu_tanh_word): the table path is the evaluated GELU,
// bit for bit, the rule past the table included.
TEST(Fp8RowwiseGeluTable, EveryBf16ValueEqualsTheEvaluatedGeluOnTheGpu) {
  const jit::CudaDriver* d = jit::cuda_driver();
  if (!d || d->device_count == 0) GTEST_SKIP() << "no CUDA device: checked on the device run";
  jit::bind_primary_context(0);
  CUdeviceptr counter = 0;
  jit::check_cu(d->cuMemAlloc(&counter, sizeof(unsigned)), "cuMemAlloc");
  jit::check_cu(d->cuMemsetD8(counter, 0, sizeof(unsigned)), "cuMemsetD8");
  GeluTableCheckParams p{reinterpret_cast<unsigned*>(counter)};
  const jit::LoadedKernel& kernel = jit::jit_kernel(gelu_table_check_request(), 0);
  jit::launch(kernel, 4, 256, &p, sizeof p, nullptr, false);  // 4 CTAs: each builds its own table
  unsigned mismatches = ~0u;
  jit::check_cu(d->cuMemcpyDtoH(&mismatches, counter, sizeof mismatches), "cuMemcpyDtoH");
  d->cuMemFree(counter);
  EXPECT_EQ(mismatches, 0u) << "words where the GELU table differs from the evaluated GELU";
}

}  // namespace
}  // namespace ditops
