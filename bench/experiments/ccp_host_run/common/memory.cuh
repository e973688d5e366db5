// Host stand-in for kernels/common/memory.cuh: loads and stores of 16-byte words that check
// their alignment and bounds (host_run.cpp's load_ok / store_ok) before they move the bytes.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/types.cuh"

namespace host_run {
bool load_ok(const void* p, int bytes);
bool store_ok(void* p, int bytes);
}  // namespace host_run

namespace ditops::kernel {
template <int Bytes>
struct alignas(Bytes) Word {
  u32 w[Bytes / 4];
};
template <int Bytes, bool kReadOnly>
inline Word<Bytes> load_word(const void* p) {
  if (reinterpret_cast<unsigned long long>(p) % Bytes || !host_run::load_ok(p, Bytes)) {
    std::printf("load of %d bytes at %p: misaligned or outside the sources\n", Bytes, p);
    std::abort();
  }
  Word<Bytes> w;
  std::memcpy(&w, p, Bytes);
  return w;
}
template <int Bytes>
inline void store_word(void* p, const Word<Bytes>& v) {
  if (reinterpret_cast<unsigned long long>(p) % Bytes || !host_run::store_ok(p, Bytes)) {
    std::printf("store of %d bytes at %p: misaligned or outside out\n", Bytes, p);
    std::abort();
  }
  std::memcpy(p, &v, Bytes);
}
inline void pdl_wait() {}
inline void pdl_launch_dependents() {}
}  // namespace ditops::kernel
