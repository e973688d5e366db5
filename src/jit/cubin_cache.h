// The cubin cache: compiled kernels in memory (per process) and on disk (per user, shared by
// processes), keyed by everything that changes the compiled bytes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "jit/kernel_request.h"

namespace ditops::jit {

// The full cache key of (request, arch): request, launch bounds, arch, NVRTC version and the
// embedded sources' hash. Stored inside every disk entry and compared on read.
std::string cache_key(const KernelRequest& request, const std::string& arch);

// Cubin for (request, arch): memory cache, then disk cache, then NVRTC (published to disk by
// atomic rename). Throws Error with the NVRTC log on a compile error.
std::vector<uint8_t> get_cubin(const KernelRequest& request, const std::string& arch);

struct DiskCacheStats {
  int memory_hits = 0, disk_hits = 0, compiles = 0, corrupt_rebuilt = 0;
};
DiskCacheStats cache_stats();
void clear_memory_cache();  // tests: forget in-process cubins so the disk cache is exercised
std::string cache_entry_path(const KernelRequest& request, const std::string& arch);

}  // namespace ditops::jit
