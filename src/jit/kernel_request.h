// What the JIT and the AOT build need to know about one kernel instance, and the source they
// compile for it. Plain data and strings, no dependency on the driver: the registry lists an
// implementation's instances as these (KernelSpec::prebuilt, ::variants), the JIT (src/jit)
// compiles them and the build-time AOT generator (tools/aotgen.cpp) reads them.
#pragma once

#include <string>

#include "ditops/tensor.h"

namespace ditops {

// A __device__ function template of a kernel header instantiated with template arguments; it is
// wrapped in an extern "C" __global__ entry taking the Params struct by value
// (__grid_constant__). The JIT (NVRTC) and the AOT build (nvcc) compile the same wrapper.
struct KernelRequest {
  std::string header;         // "qknorm_rope.cuh"
  std::string function;       // "ditops::qknorm_rope_body"
  std::string template_args;  // "ditops::kernel::bf16, float, ..."
  std::string params_type;    // "ditops::QkNormRopeParams"
  int max_threads = 256;      // __launch_bounds__
  int min_blocks = 0;         // __launch_bounds__' minimum resident blocks per SM (0: ptxas decides)
  std::string template_key;   // human-readable key, part of the cache key
};

namespace jit {

// Template arguments as the kernel sources spell them: the device type of a DType
// ("ditops::kernel::bf16", "float", "long long", ...) and a bool ("true"/"false").
const char* kernel_type_name(DType dtype);
inline const char* kernel_bool(bool b) { return b ? "true" : "false"; }

// Source of the wrapper translation unit for `request`, with its entry named `entry_name`.
std::string wrapper_source(const KernelRequest& request, const std::string& entry_name);
// Only the entry definition (no #include), for concatenating several entries into one unit.
std::string wrapper_entry(const KernelRequest& request, const std::string& entry_name);

}  // namespace jit
}  // namespace ditops
