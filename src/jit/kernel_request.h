// A kernel instance's source as the JIT and the AOT build compile it: the wrapper around a
// KernelRequest (core/kernel_request.h) and the spelling of its template arguments. No
// dependency on the driver, so the build-time AOT generator can use it too.
#pragma once

#include <string>

#include "core/kernel_request.h"
#include "ditops/tensor.h"

namespace ditops::jit {

using KernelRequest = ::ditops::KernelRequest;  // core/kernel_request.h

// Template arguments as the kernel sources spell them: the device type of a DType
// ("ditops::kernel::bf16", "float", "long long", ...) and a bool ("true"/"false").
const char* kernel_type_name(DType dtype);
inline const char* kernel_bool(bool b) { return b ? "true" : "false"; }

// Source of the wrapper translation unit for `request`, with its entry named `entry_name`.
std::string wrapper_source(const KernelRequest& request, const std::string& entry_name);
// Only the entry definition (no #include), for concatenating several entries into one unit.
std::string wrapper_entry(const KernelRequest& request, const std::string& entry_name);

}  // namespace ditops::jit
