// qknorm_rope on the GPU, what the op test driver does not cover: a CPU tensor sent to an
// explicit CUDA backend. Every CUDA implementation (aot, jit; both rounding modes; both norm
// orders) against the reference over the grid, empty calls included, is the driver's job now
// (tests/cases/qknorm_rope_cases.cpp, `ctest -R ops`); an aot implementation without a prebuilt
// key is reported ineligible by explain there, and an error of an eligible one is a failure.
// Also checked mode (DITOPS_CHECK=1): CUDA positions bounds-checked on the device.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "ditops/qknorm_rope.h"
#include "ditops/registry.h"
#include "jit/cuda_driver.h"
#include "jit/index_check.h"
#include "test_util.h"

namespace ditops {
namespace {

TEST(QkNormRopeGpu, CpuTensorToExplicitCudaBackendIsRefused) {
  std::vector<uint16_t> q(8 * 128), w(128);
  std::vector<float> cache(16 * 128);
  std::vector<int64_t> pos(1);
  const Device cpu{DeviceKind::cpu, 0};
  auto vq = TensorView::contiguous(q.data(), DType::bf16, cpu, {1, 4, 128});
  auto vk = TensorView::contiguous(q.data() + 512, DType::bf16, cpu, {1, 4, 128});
  QkNormRopeOptions opt;
  opt.dispatch.backend = Provenance::jit;
  EXPECT_THROW(qknorm_rope(vq, vk, TensorView::contiguous(w.data(), DType::bf16, cpu, {128}),
                           TensorView::contiguous(w.data(), DType::bf16, cpu, {128}),
                           TensorView::contiguous(cache.data(), DType::f32, cpu, {16, 128}),
                           TensorView::contiguous(pos.data(), DType::i64, cpu, {1}), opt),
               Error);
}

using jit::check_cu;

struct DeviceBytes {
  CUdeviceptr ptr = 0;
  size_t bytes;
  template <typename T>
  explicit DeviceBytes(const std::vector<T>& host) : bytes(host.size() * sizeof(T)) {
    check_cu(jit::require_cuda_driver().cuMemAlloc(&ptr, bytes), "alloc");
    check_cu(jit::require_cuda_driver().cuMemcpyHtoD(ptr, host.data(), bytes), "upload");
  }
  ~DeviceBytes() { jit::require_cuda_driver().cuMemFree(ptr); }
  std::vector<uint8_t> download() const {
    std::vector<uint8_t> out(bytes);
    check_cu(jit::require_cuda_driver().cuMemcpyDtoH(out.data(), ptr, bytes), "download");
    return out;
  }
  void* data() const { return reinterpret_cast<void*>(ptr); }
};

using test_util::error_of;
using test_util::ScopedEnv;

// A position outside the cache is refused with the first bad index and its value, q and k keep
// their bytes; good positions give the bytes of the unchecked call; a capturing stream is refused
// (the check synchronizes). Not run yet: written without a device (bench/results/README.md).
TEST(QkNormRopeGpu, CheckedModeRefusesPositionsOutsideTheCacheAndWritesNothing) {
  if (!jit::cuda_driver()) GTEST_SKIP() << "no CUDA driver";
  jit::bind_primary_context(0);
  const auto& d = jit::require_cuda_driver();
  const Device gpu{DeviceKind::cuda, 0};
  constexpr int64_t T = 4, H = 2, D = 128, P = 8;
  std::vector<uint16_t> act(T * H * D);
  for (size_t i = 0; i < act.size(); ++i) act[i] = static_cast<uint16_t>(0x3F80 + (i % 64));  // bf16 1.0 .. 1.5
  std::vector<uint16_t> weight(D, 0x3F80);
  std::vector<float> cache(P * D);
  for (size_t i = 0; i < cache.size(); ++i) cache[i] = static_cast<float>(i % 7) * 0.125f;
  DeviceBytes q(act), k(act), w(weight), c(cache);
  auto call = [&](const DeviceBytes& q_, const DeviceBytes& k_, const DeviceBytes& pos, DType pos_dtype,
                  Stream stream = nullptr) {
    return qknorm_rope(TensorView::contiguous(q_.data(), DType::bf16, gpu, {T, H, D}),
                       TensorView::contiguous(k_.data(), DType::bf16, gpu, {T, H, D}),
                       TensorView::contiguous(w.data(), DType::bf16, gpu, {D}),
                       TensorView::contiguous(w.data(), DType::bf16, gpu, {D}),
                       TensorView::contiguous(c.data(), DType::f32, gpu, {P, D}),
                       TensorView::contiguous(pos.data(), pos_dtype, gpu, {T}), {}, stream);
  };
  ScopedEnv checked("DITOPS_CHECK", "1");
  {
    DeviceBytes bad(std::vector<int64_t>{0, 3, 9, 2});
    EXPECT_EQ(error_of([&] { call(q, k, bad, DType::i64); }),
              "qknorm_rope: positions[2] = 9 is outside [0, 8) (the rows of cos_sin_cache); found by DITOPS_CHECK=1");
    DeviceBytes negative(std::vector<int32_t>{-1, 3, 1, 2});
    EXPECT_EQ(error_of([&] { call(q, k, negative, DType::i32); }),
              "qknorm_rope: positions[0] = -1 is outside [0, 8) (the rows of cos_sin_cache); found by DITOPS_CHECK=1");
    EXPECT_EQ(std::memcmp(q.download().data(), act.data(), q.bytes), 0) << "q was written";
    EXPECT_EQ(std::memcmp(k.download().data(), act.data(), k.bytes), 0) << "k was written";
  }
  DeviceBytes good(std::vector<int64_t>{0, 3, 7, 2});
  call(q, k, good, DType::i64);
  checked.set(nullptr);
  DeviceBytes q2(act), k2(act);
  call(q2, k2, good, DType::i64);
  check_cu(d.cuCtxSynchronize(), "sync");
  EXPECT_EQ(q.download(), q2.download());
  EXPECT_EQ(k.download(), k2.download());
  checked.set("1");

  CUstream stream;
  check_cu(d.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), "stream");
  check_cu(d.cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL), "begin capture");
  const std::string captured = error_of([&] { call(q, k, good, DType::i64, stream); });
  CUgraph graph = nullptr;
  d.cuStreamEndCapture(stream, &graph);
  if (graph) d.cuGraphDestroy(graph);
  d.cuStreamDestroy(stream);
  EXPECT_NE(captured.find("CUDA-graph capture forbids"), std::string::npos) << captured;
}

}  // namespace
}  // namespace ditops
