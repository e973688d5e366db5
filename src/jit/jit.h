// The JIT and the launcher: kernel sources embedded in the library are compiled with NVRTC for
// the device's exact architecture, cached in memory and on disk (cubins), loaded once per
// device, and launched with the driver API on the caller's stream (PDL where the device has it).
#pragma once

#include <cuda.h>

#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "ditops/registry.h"
#include "jit/kernel_request.h"
#include "jit/nvrtc.h"

namespace ditops::jit {

// The embedded kernel sources (kernels/**) and their combined hash.
const std::vector<SourceFile>& embedded_sources();
uint64_t embedded_sources_hash();

// "sm_90a" for an H200 (sm 90), "sm_100a", "sm_120a"; "sm_XY" otherwise.
std::string arch_for_sm(int sm);

// Cubin for (request, arch): memory cache, then disk cache, then NVRTC (published to disk by
// atomic rename). Throws Error with the NVRTC log on a compile error.
std::vector<uint8_t> get_cubin(const KernelRequest& request, const std::string& arch);

struct DiskCacheStats {
  int memory_hits = 0, disk_hits = 0, compiles = 0, corrupt_rebuilt = 0;
};
DiskCacheStats cache_stats();
void clear_memory_cache();  // tests: forget in-process cubins so the disk cache is exercised
std::string cache_entry_path(const KernelRequest& request, const std::string& arch);

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

// Before dispatching a call on CUDA tensors: makes the device's primary context current and
// refuses a stream of another device, naming `op` and the tensor that carries the device.
// Nothing for CPU tensors.
void bind_and_check_stream(const char* op, const char* tensor, Device device, Stream stream);
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

// Launch on `stream` with programmatic dependent launch when `pdl` (the kernel must then call
// griddepcontrol.wait before its first dependent read). No allocation, no synchronization.
void launch(const LoadedKernel& kernel, unsigned grid, unsigned block, const void* params,
            size_t params_size, CUstream stream, bool pdl);

// Device facts, queried once per device and cached. For DeviceKind::cpu returns the CPU.
const DeviceInfo& device_info(Device device);
// The device a stream belongs to (cuStreamGetDevice), for checking tensors against it; -1 while
// the stream is capturing a graph (the query is not permitted then).
int stream_device(CUstream stream);

}  // namespace ditops::jit
