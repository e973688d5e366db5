// Tuning experiment for the QK norm + RoPE kernel (not part of the library): times variants of
// kernels/qknorm_rope.cuh on model shapes, cold L2, against a device copy of the same bytes.
// Built and run by scripts/device_run.sh --tune; the variants are compile-time:
//   -DQK_TUNE_CHUNK=N      head iterations per warp unit (the library's kQkChunkHeadIterations)
// (The earlier one-work-per-lane kernel it was compared with is `git show a68ceb2:kernels/qknorm_rope.cuh`.)
// and, inside one binary, the minimum resident blocks of __launch_bounds__ (1 = ptxas' choice).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

// The unit length is a plain constant of the library (kQkChunkHeadIterations, kernels/qknorm_rope.cuh),
// whose default this experiment overrides before including the kernel.
#ifndef QK_TUNE_CHUNK
#define QK_TUNE_CHUNK 4
#endif
#define DITOPS_QK_CHUNK_HEAD_ITERATIONS QK_TUNE_CHUNK
#include "qknorm_rope.cuh"
#include "tune_common.cuh"

using ditops::QkNormRopeParams;
using bf16 = ditops::kernel::bf16;

template <int MinBlocks, bool kNeox>
__global__ void __launch_bounds__(256, MinBlocks) qk_variant(const __grid_constant__ QkNormRopeParams p) {
  ditops::qknorm_rope_body<bf16, float, long long, 128, 128, kNeox, false, true, true, true, true>(p);
}

struct Case {
  const char* name;
  long long tokens;
  int heads;
  bool neox;
};

template <int MinBlocks, bool kNeox>
float run_variant(const Case& c, void* q, void* k, void* w, void* cache, void* pos, void* flush, size_t fb) {
  auto kernel = qk_variant<MinBlocks, kNeox>;
  int blocks_per_sm = 0, sms = 0;
  CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks_per_sm, kernel, 256, 0));
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaFuncAttributes attr;
  CHECK(cudaFuncGetAttributes(&attr, kernel));
  const int heads = 2 * c.heads;
  const int unit_heads = ditops::kQkChunkHeadIterations * 2;
  const int cpt = (heads + unit_heads - 1) / unit_heads;
  const long long units = c.tokens * cpt;
  const long long grid = std::max<long long>(1, std::min<long long>((long long)blocks_per_sm * sms, (units + 7) / 8));
  const long long warps = grid * 8;
  QkNormRopeParams p{};
  p.q = q;
  p.k_shifted = static_cast<char*>(k) - (long long)c.heads * 128 * 2;
  p.q_weight = w;
  p.k_weight = w;
  p.cos_sin_cache = cache;
  p.positions = pos;
  p.num_tokens = c.tokens;
  p.q_token_stride = (long long)c.heads * 128;
  p.k_token_stride = (long long)c.heads * 128;
  p.head_stride = 128;
  p.cache_row_stride = 128;
  p.positions_stride = 1;
  p.num_q_heads = c.heads;
  p.num_heads = heads;
  p.unit_iterations = ditops::kQkChunkHeadIterations;
  p.chunks_per_token = cpt;
  p.unit_token_step = warps / cpt;
  p.unit_chunk_step = static_cast<int>(warps % cpt);
  p.eps = 1e-6f;
  const float us = median_us([&] { kernel<<<grid, 256>>>(p); }, flush, fb);
  CHECK(cudaGetLastError());
  std::printf("  minblocks %d: regs %d, %d blocks/SM, %.2f us\n", MinBlocks, attr.numRegs, blocks_per_sm, us);
  return us;
}

int main(int argc, char** argv) {
  const int only = argc > 1 ? std::atoi(argv[1]) : -1;  // one case (for the profiler)
  const Case cases[] = {{"FLUX 4608x24 interleaved", 4608, 24, false},
                        {"Qwen 6912x24 neox", 6912, 24, true},
                        {"Hunyuan 30000x24 neox", 30000, 24, true},
                        {"Wan 32760x40 neox", 32760, 40, true},
                        {"small 256x24", 256, 24, false}};
  const size_t fb = 256u << 20;
  void* flush;
  CHECK(cudaMalloc(&flush, fb));
  std::printf("variant: units of %d head iterations\n", QK_TUNE_CHUNK);
  for (int ci = 0; ci < 5; ++ci) {
    const Case& c = cases[ci];
    if (only >= 0 && ci != only) continue;
    const size_t n = (size_t)c.tokens * c.heads * 128;
    std::vector<unsigned short> host(n);
    std::mt19937 rng(1);
    std::normal_distribution<float> nd;
    for (auto& v : host) {
      float f = nd(rng);
      unsigned u;
      std::memcpy(&u, &f, 4);
      v = (unsigned short)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
    }
    void *q, *k, *w, *cache, *pos, *src, *dst;
    CHECK(cudaMalloc(&q, n * 2));
    CHECK(cudaMalloc(&k, n * 2));
    CHECK(cudaMemcpy(q, host.data(), n * 2, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(k, host.data(), n * 2, cudaMemcpyHostToDevice));
    std::vector<unsigned short> hw(128, 0x3f80);
    CHECK(cudaMalloc(&w, 256));
    CHECK(cudaMemcpy(w, hw.data(), 256, cudaMemcpyHostToDevice));
    const long long rows = std::max<long long>(c.tokens, 4096);
    std::vector<float> hc(rows * 128);
    for (long long r = 0; r < rows; ++r)
      for (int j = 0; j < 64; ++j) {
        hc[r * 128 + j] = std::cos(r * std::pow(10000.0, -j / 64.0));
        hc[r * 128 + 64 + j] = std::sin(r * std::pow(10000.0, -j / 64.0));
      }
    CHECK(cudaMalloc(&cache, hc.size() * 4));
    CHECK(cudaMemcpy(cache, hc.data(), hc.size() * 4, cudaMemcpyHostToDevice));
    std::vector<long long> hp(c.tokens);
    for (long long t = 0; t < c.tokens; ++t) hp[t] = (t * 7919) % rows;
    CHECK(cudaMalloc(&pos, c.tokens * 8));
    CHECK(cudaMemcpy(pos, hp.data(), c.tokens * 8, cudaMemcpyHostToDevice));
    const size_t bytes = 4 * n * 2;  // q and k read and written
    CHECK(cudaMalloc(&src, bytes / 2));
    CHECK(cudaMalloc(&dst, bytes / 2));
    const float copy = median_us([&] { CHECK(cudaMemcpyAsync(dst, src, bytes / 2, cudaMemcpyDeviceToDevice)); }, flush, fb);
    std::printf("%s: copy %.2f us\n", c.name, copy);
    float best = 1e30f;
    if (c.neox) {
      best = std::min(best, run_variant<1, true>(c, q, k, w, cache, pos, flush, fb));
      best = std::min(best, run_variant<3, true>(c, q, k, w, cache, pos, flush, fb));
      best = std::min(best, run_variant<4, true>(c, q, k, w, cache, pos, flush, fb));
    } else {
      best = std::min(best, run_variant<1, false>(c, q, k, w, cache, pos, flush, fb));
      best = std::min(best, run_variant<3, false>(c, q, k, w, cache, pos, flush, fb));
      best = std::min(best, run_variant<4, false>(c, q, k, w, cache, pos, flush, fb));
    }
    std::printf("  best %.2f us = %.1f%% of copy\n", best, 100.0 * copy / best);
    cudaFree(q); cudaFree(k); cudaFree(w); cudaFree(cache); cudaFree(pos); cudaFree(src); cudaFree(dst);
  }
  return 0;
}
