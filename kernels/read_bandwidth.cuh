// The device's read bandwidth, for the read roof of a GEMM or GEMV benchmark (tools/bench_*):
// every thread sums 16-byte words of one large buffer, kUnroll loads in flight, and writes a word
// only in the unlikely case that its sum hits a constant, so nothing but the reads costs. A copy
// moves each byte twice (read and write); a weight-streaming GEMV only reads, so its roof is this.
#pragma once

namespace ditops {

struct ReadBandwidthParams {
  const void* data;              // words * 16 bytes, 16-byte aligned
  long long words;
  unsigned long long* sink;      // one 8-byte word, written only on the unlikely match
};

}  // namespace ditops

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

#include "common/memory.cuh"

namespace ditops {

template <int kUnroll>
__device__ void read_bandwidth_body(const ReadBandwidthParams& p) {
  const char* data = static_cast<const char*>(p.data);
  const long long step = static_cast<long long>(gridDim.x) * blockDim.x;
  long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  unsigned sum = 0;
  for (; i + (kUnroll - 1) * step < p.words; i += kUnroll * step) {
    kernel::Word<16> w[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) w[u] = kernel::load_word<16, true>(data + (i + u * step) * 16);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) sum += w[u].w[0] + w[u].w[1] + w[u].w[2] + w[u].w[3];
  }
  for (; i < p.words; i += step) {
    const kernel::Word<16> w = kernel::load_word<16, true>(data + i * 16);
    sum += w.w[0] + w.w[1] + w.w[2] + w.w[3];
  }
  if (sum == 0x9e3779b9u) atomicAdd(p.sink, 1ull);
}

}  // namespace ditops

#endif
