// libFuzzer target over the C ABI (fuzz/fuzz_c_abi.cpp; clang, -DDITOPS_BUILD_FUZZ=ON;
// docs/hostile_input.md).
#include <cstddef>
#include <cstdint>

#include "fuzz/fuzz_entry.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ditops_fuzz::run_c_abi(data, size);
  return 0;
}
