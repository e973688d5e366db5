// The kernel sources (kernels/**) embedded in the library at build time, so run-time compiles
// need no source tree, and their hash, which is part of every cubin cache key.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "jit/nvrtc.h"

namespace ditops::jit {

const std::vector<SourceFile>& embedded_sources();
uint64_t embedded_sources_hash();

// FNV-1a: the hash of cache keys, payloads and sources (stable across builds and machines).
inline uint64_t fnv1a(const void* data, size_t size, uint64_t h = 1469598103934665603ull) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < size; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

}  // namespace ditops::jit
