// qknorm_rope on the GPU, what the op test driver does not cover: a CPU tensor sent to an
// explicit CUDA backend. Every CUDA implementation (aot, jit; both rounding modes; both norm
// orders) against the reference over the grid, empty calls included, is the driver's job now
// (tests/cases/qknorm_rope_cases.cpp, `ctest -R ops`); an aot implementation without a prebuilt
// key is reported ineligible by explain there, and an error of an eligible one is a failure.
#include <gtest/gtest.h>

#include "ditops/qknorm_rope.h"

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

}  // namespace
}  // namespace ditops
