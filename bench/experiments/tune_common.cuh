// Shared by the tuning experiments (not part of the library): error check and the cold-L2
// median timing (a memset of `flush_bytes` before each of 40 timed calls, 3 warm-up calls).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#define CHECK(x)                                                                           \
  do {                                                                                     \
    cudaError_t e = (x);                                                                   \
    if (e != cudaSuccess) {                                                                \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e), __FILE__, __LINE__); \
      std::exit(1);                                                                        \
    }                                                                                      \
  } while (0)

inline float median_us(const std::function<void()>& f, void* flush, size_t flush_bytes) {
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) f();
  std::vector<float> t;
  for (int i = 0; i < 40; ++i) {
    CHECK(cudaMemsetAsync(flush, i, flush_bytes));
    CHECK(cudaEventRecord(a));
    f();
    CHECK(cudaEventRecord(b));
    CHECK(cudaEventSynchronize(b));
    float ms;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms * 1000);
  }
  CHECK(cudaEventDestroy(a));
  CHECK(cudaEventDestroy(b));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// As rotated_us, but the rounds of launches captured in one CUDA graph (built with
// --default-stream per-thread, so f's <<<>>> launches can be captured): no host launch time between
// short kernels. f must launch kernels only (a captured cudaMemcpyAsync becomes a copy-engine node).
float rotated_graph_us(int n, const std::function<void(int)>& f) {
  for (int i = 0; i < n; ++i) f(i);
  CHECK(cudaStreamSynchronize(cudaStreamPerThread));
  const int rounds = std::max(2, 256 / n);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CHECK(cudaStreamBeginCapture(cudaStreamPerThread, cudaStreamCaptureModeThreadLocal));
  for (int r = 0; r < rounds; ++r)
    for (int i = 0; i < n; ++i) f(i);
  CHECK(cudaStreamEndCapture(cudaStreamPerThread, &graph));
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  CHECK(cudaGraphLaunch(exec, cudaStreamPerThread));
  std::vector<float> t;
  for (int r = 0; r < 15; ++r) {
    CHECK(cudaEventRecord(a, cudaStreamPerThread));
    CHECK(cudaGraphLaunch(exec, cudaStreamPerThread));
    CHECK(cudaEventRecord(b, cudaStreamPerThread));
    CHECK(cudaEventSynchronize(b));
    float ms;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms * 1000 / (rounds * n));
  }
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(graph));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}
