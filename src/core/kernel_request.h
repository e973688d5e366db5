// What the JIT and the AOT build need to know about one kernel instance. Plain data: the
// registry lists an implementation's instances as these (KernelSpec::prebuilt, ::variants), the
// JIT (src/jit) compiles them and the build-time AOT generator reads them.
#pragma once

#include <string>

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

}  // namespace ditops
