// The CUDA built-ins kernels/causal_conv3d_cat_pad.cuh uses, on the host: a warp is 32 threads
// that meet at a barrier in every shuffle and ballot (bench/experiments/ccp_host_run/run.sh).
#pragma once
#include <barrier>
#include <cstdint>

#define __CUDACC__ 1
#define __host__
#define __device__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))

struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
};
inline thread_local Dim3 threadIdx, blockIdx;
inline Dim3 blockDim, gridDim;

namespace host_run {
struct Warp {
  std::barrier<>* meet;
  unsigned slots[32];
};
inline thread_local Warp* warp;
inline thread_local int lane;
}  // namespace host_run

inline unsigned __shfl_sync(unsigned, unsigned v, int src) {
  host_run::warp->slots[host_run::lane] = v;
  host_run::warp->meet->arrive_and_wait();
  const unsigned r = host_run::warp->slots[src & 31];
  host_run::warp->meet->arrive_and_wait();
  return r;
}
inline unsigned __shfl_down_sync(unsigned mask, unsigned v, int d) {
  const int src = host_run::lane + d;
  return __shfl_sync(mask, v, src < 32 ? src : host_run::lane);
}
inline unsigned __ballot_sync(unsigned, int pred) {
  host_run::warp->slots[host_run::lane] = pred ? 1u : 0u;
  host_run::warp->meet->arrive_and_wait();
  unsigned r = 0;
  for (int i = 0; i < 32; ++i) r |= host_run::warp->slots[i] << i;
  host_run::warp->meet->arrive_and_wait();
  return r;
}
inline bool __any_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) != 0; }
inline unsigned __funnelshift_r(unsigned lo, unsigned hi, unsigned s) {
  return static_cast<unsigned>(((static_cast<uint64_t>(hi) << 32) | lo) >> (s & 31));
}
inline unsigned __funnelshift_lc(unsigned lo, unsigned hi, unsigned s) {
  return static_cast<unsigned>((((static_cast<uint64_t>(hi) << 32) | lo) << (s > 32 ? 32 : s)) >> 32);
}
inline unsigned __funnelshift_rc(unsigned lo, unsigned hi, unsigned s) {
  return static_cast<unsigned>(((static_cast<uint64_t>(hi) << 32) | lo) >> (s > 32 ? 32 : s));
}
