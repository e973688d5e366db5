// Module loading: a JIT cubin or the prebuilt (aot) fatbin is loaded once per device and its
// kernel function, with its occupancy, kept for the life of the process.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "jit/kernel_request.h"

namespace ditops::jit {

// "sm_90a" for an H200 (sm 90), "sm_100a", "sm_120a"; "sm_XY" otherwise.
std::string arch_for_sm(int sm);

struct LoadedKernel {
  CUfunction function = nullptr;
  int blocks_per_sm = 0;    // occupancy at max_threads, cached with the function
  int multiprocessors = 0;
  int max_threads = 0;      // the request's block size bound (launch_bounds), which the occupancy assumes
};

// The JIT kernel for `request` on CUDA device `device_index`, compiled/loaded once (thread-safe).
const LoadedKernel& jit_kernel(const KernelRequest& request, int device_index);

// Resolved kernels of one op per slot (the op's packed template key and the device index): one
// lookup under a mutex per call, no strings; `resolve()` runs the first time a slot is asked for.
class KernelMemo {
 public:
  template <typename Resolve>
  const LoadedKernel& get(uint64_t slot, Resolve&& resolve) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = kernels_.find(slot);
      if (it != kernels_.end()) return *it->second;
    }
    const LoadedKernel& kernel = resolve();  // may compile: outside the lock
    std::lock_guard<std::mutex> lock(mutex_);
    kernels_[slot] = &kernel;
    return kernel;
  }

 private:
  std::mutex mutex_;
  std::unordered_map<uint64_t, const LoadedKernel*> kernels_;
};

// A prebuilt (aot) kernel from the embedded fatbin, by entry name; nullptr when the fatbin has
// no image for this device.
const LoadedKernel* aot_kernel(const std::string& entry_name, int max_threads, int device_index);

struct AotEntry {
  const char* template_key;
  const char* entry_name;
};
// The prebuilt keys (generated at build time); empty when built without AOT.
const std::vector<AotEntry>& aot_entries();
const AotEntry* find_aot(const std::string& template_key);

}  // namespace ditops::jit
