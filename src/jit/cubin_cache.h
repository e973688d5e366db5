// The cubin cache: compiled kernels in memory (per process) and on disk (per user, shared by
// processes), keyed by everything that changes the compiled bytes. Layout, locking and what
// happens with a damaged cache directory: docs/jit.md.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "jit/kernel_request.h"

namespace ditops::jit {

// The full cache key of (request, arch): request, launch bounds, arch, NVRTC version and the
// embedded sources' hash. Stored inside every disk entry and compared on read.
std::string cache_key(const KernelRequest& request, const std::string& arch);

// Cubin for (request, arch): memory cache, then disk cache, then NVRTC under the key's file lock
// (published to disk by atomic rename). DITOPS_JIT_FORCE_RECOMPILE=1 skips both caches. A cache
// entry or directory that cannot be used is a miss with a warning, never an error. Throws Error
// with the NVRTC log on a compile error.
std::vector<uint8_t> get_cubin(const KernelRequest& request, const std::string& arch);

struct DiskCacheStats {
  int memory_hits = 0, disk_hits = 0, compiles = 0, corrupt_rebuilt = 0;
};
DiskCacheStats cache_stats();
void clear_memory_cache();  // tests: forget in-process cubins so the disk cache is exercised
std::string cache_entry_path(const KernelRequest& request, const std::string& arch);

// The directory holding the entries: <DITOPS_CACHE_DIR>/cubin.
std::string cache_directory();

// One entry of the disk cache as `ditops cache list` shows it.
struct CacheEntryInfo {
  std::string path;
  std::string kernel;   // "function<template args>" from the stored key
  std::string arch;     // "sm_90a"
  uint64_t bytes = 0;
  std::string problem;  // "" for a usable entry, else why it is not one
};
std::vector<CacheEntryInfo> list_cache_entries();

// Removes the entries, lock files and leftover temp files of the cache directory; files it did
// not name itself are left alone.
struct CacheClearResult {
  std::string directory;
  int entries = 0, lock_files = 0, temp_files = 0;
  uint64_t bytes = 0;               // freed
  std::vector<std::string> left;    // ours but not removable, with the reason
};
CacheClearResult clear_disk_cache();

}  // namespace ditops::jit
