// libFuzzer target over fuzz/fuzz_entry.cpp (clang, -DDITOPS_BUILD_FUZZ=ON; docs/hostile_input.md).
#include <cstddef>
#include <cstdint>

#include "fuzz/fuzz_entry.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ditops_fuzz::run_one(data, size);
  return 0;
}
