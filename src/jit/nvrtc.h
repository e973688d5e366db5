// NVRTC, loaded at run time (dlopen), and the compile step of the JIT.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ditops::jit {

// NVRTC version as major*1000 + minor*10 (13000 for 13.0), or 0 when NVRTC cannot be loaded;
// `why` then says why. Thread-safe, loads once.
int nvrtc_version(std::string* why = nullptr);

struct SourceFile {
  std::string name;      // include name, e.g. "common/vec.cuh"
  std::string contents;
};

// Compiles `source` for `arch` (e.g. "sm_90a") into a cubin. The headers are served from memory
// under their include names. Throws Error carrying the NVRTC log on failure.
std::vector<uint8_t> nvrtc_compile(const std::string& source, const std::string& program_name,
                                   const std::string& arch, const std::vector<SourceFile>& headers,
                                   const std::vector<std::string>& extra_options = {});

}  // namespace ditops::jit
