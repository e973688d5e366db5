// Checked mode (DITOPS_CHECK=1, src/jit/index_check.h): a bounds check of device-resident indices
// before the op that reads them. Every index i with indices[i] outside [0, limit) lowers
// *first_bad to i (atomicMin), so the host reads back the first bad index whatever the order the
// blocks ran in. The host sets *first_bad to all ones before the launch.
#pragma once

namespace ditops {

// Launch parameters. Plain data, shared by the host (src/jit/index_check.cpp) and the kernel.
struct IndexCheckParams {
  const void* indices;             // Index [count], element stride `stride`
  long long count;
  long long stride;                // in elements
  long long limit;                 // valid indices are [0, limit)
  unsigned long long* first_bad;   // one 8-byte word of device memory
};

}  // namespace ditops

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

namespace ditops {

// Index: int or long long (i32 or i64 positions).
template <typename Index>
__device__ void index_check_body(const IndexCheckParams& p) {
  const Index* indices = static_cast<const Index*>(p.indices);
  const long long step = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < p.count; i += step) {
    const long long v = static_cast<long long>(indices[i * p.stride]);
    if (v < 0 || v >= p.limit) atomicMin(p.first_bad, static_cast<unsigned long long>(i));
  }
}

}  // namespace ditops

#endif
