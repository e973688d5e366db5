// The layernorm_modulate family on the GPU, what a driver case cannot express: the primitives the
// kernels fold in, checked on the device (rcp4(n) is 1.0f / n for every count up to 2^24;
// rsqrt.approx.f32 equals its explicit subnormal form and stays within 2 ulp of a correctly
// rounded rsqrt). Every CUDA implementation against the reference, the mappings giving the same
// bytes, the statistics (mean exact, rstd within 2 ulp), the outputs and fp8 bytes following
// exactly from the device's own statistics, in place and the qk-head op are the driver's
// (tests/cases/layernorm_modulate_cases.cpp). Skipped without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "ditops/layernorm_modulate.h"
#include "jit/cuda_driver.h"
#include "jit/jit.h"
#include "kernels/layernorm_modulate.cuh"
#include "ops/layernorm_modulate/layernorm_modulate_kernels.h"
#include "reference/aten_layer_norm.h"
#include "reference/half.h"

namespace ditops {

namespace {

using jit::check_cu;

struct Buffer {
  CUdeviceptr ptr = 0;
  explicit Buffer(size_t n) { check_cu(jit::require_cuda_driver().cuMemAlloc(&ptr, n ? n : 16), "alloc"); }
  ~Buffer() { jit::require_cuda_driver().cuMemFree(ptr); }
  void* get() const { return reinterpret_cast<void*>(ptr); }
  template <typename T>
  void put(const std::vector<T>& v) { check_cu(jit::require_cuda_driver().cuMemcpyHtoD(ptr, v.data(), v.size() * sizeof(T)), "h2d"); }
  template <typename T>
  void get_to(std::vector<T>& v) { check_cu(jit::require_cuda_driver().cuMemcpyDtoH(v.data(), ptr, v.size() * sizeof(T)), "d2h"); }
};

bool have_gpu() {
  const jit::CudaDriver* d = jit::cuda_driver();
  return d && d->device_count > 0;
}

uint32_t bits(float v) {
  uint32_t b;
  std::memcpy(&b, &v, 4);
  return b;
}

int ulp_distance(float a, float b) {
  const int32_t ia = static_cast<int32_t>(bits(a)), ib = static_cast<int32_t>(bits(b));
  return std::abs(ia - ib);
}

class LayerNormModulateGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device: the GPU implementations are checked on the device run";
    jit::bind_primary_context(0);  // the buffers below are allocated before any op call binds it
  }
};

TEST_F(LayerNormModulateGpu, PrimitivesRcp4IsTheIeeeReciprocalAndRsqrtHasTheSubnormalPath) {
  const int count = 1 << 24;
  std::vector<float> rsqrt_in;
  for (int e = -149; e < -120; ++e) rsqrt_in.push_back(std::ldexp(1.0f, e));
  for (int e = -149; e < -120; ++e) rsqrt_in.push_back(std::ldexp(1.37f, e));
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> ex(-30.0f, 30.0f);
  for (int i = 0; i < 4096; ++i) rsqrt_in.push_back(std::exp2(ex(rng)));
  Buffer rcp(static_cast<size_t>(count) * 4), rin(rsqrt_in.size() * 4), rout(rsqrt_in.size() * 8);
  rin.put(rsqrt_in);
  AtenLnSelfcheckParams p{static_cast<float*>(rcp.get()), static_cast<const float*>(rin.get()),
                          static_cast<float*>(rout.get()), count, static_cast<int>(rsqrt_in.size())};
  const jit::LoadedKernel& k = jit::jit_kernel(aten_ln_selfcheck_request(), 0);
  jit::bind_primary_context(0);
  jit::launch(k, static_cast<unsigned>(count / 256), 256, &p, sizeof p, nullptr, false);
  check_cu(jit::require_cuda_driver().cuCtxSynchronize(), "sync");
  std::vector<float> r(static_cast<size_t>(count)), out(rsqrt_in.size() * 2);
  rcp.get_to(r);
  rout.get_to(out);
  for (int n = 1; n <= count; ++n) ASSERT_EQ(bits(r[static_cast<size_t>(n - 1)]), bits(1.0f / static_cast<float>(n))) << n;
  int rsqrt_off = 0;
  for (size_t i = 0; i < rsqrt_in.size(); ++i) {
    EXPECT_EQ(bits(out[2 * i]), bits(out[2 * i + 1])) << rsqrt_in[i];
    rsqrt_off = std::max(rsqrt_off, ulp_distance(out[2 * i], ref::aten_rsqrtf(rsqrt_in[i])));
  }
  std::printf("rsqrt.approx.f32 vs correctly rounded: max %d ulp\n", rsqrt_off);
  EXPECT_LE(rsqrt_off, 2);
}

}  // namespace
}  // namespace ditops
