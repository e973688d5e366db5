// Checked mode: DITOPS_CHECK=1 makes ops bounds-check their device-resident indices (qknorm_rope's
// positions against the cos/sin cache rows) on the device before they run, and refuse the call
// with the first bad index. Off by default, at the cost of one cached flag test per CUDA call. On, it
// adds a launch, a stream synchronization and two 8-byte reads per call, so it refuses a stream
// that is capturing a CUDA graph.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ditops/tensor.h"
#include "jit/kernel_request.h"

namespace ditops::jit {

// Whether DITOPS_CHECK=1 (config(): read once, reload_config() re-reads it).
bool checked_mode();

// Every indices[i] (a rank-1 i32 or i64 CUDA view) must lie in [0, limit). Launches the check on
// `stream`, waits for it and throws InvalidArgument
//   "<op>: <name>[<i>] = <v> is outside [0, <limit>) (<limit_what>); found by DITOPS_CHECK=1"
// for the first bad i. Nothing for an empty view.
void check_indices_on_device(const std::string& op, const std::string& name, const TensorView& indices,
                             int64_t limit, const std::string& limit_what, Stream stream);

// The kernel's requests, one per index dtype (the compile test builds them for every target arch).
KernelRequest index_check_request(DType index_dtype);
std::vector<KernelRequest> index_check_requests();

}  // namespace ditops::jit
