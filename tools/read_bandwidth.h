// The read-only kernel that measures the device's read bandwidth (kernels/read_bandwidth.cuh), the
// roof of a GEMM or GEMV benchmark: the bytes it must read over this bandwidth.
#pragma once

#include "jit/kernel_request.h"

namespace ditops::cli {

inline constexpr int kReadBandwidthThreads = 256;

inline KernelRequest read_bandwidth_request() {
  KernelRequest r;
  r.header = "read_bandwidth.cuh";
  r.function = "ditops::read_bandwidth_body";
  r.template_args = "4";
  r.params_type = "ditops::ReadBandwidthParams";
  r.max_threads = kReadBandwidthThreads;
  r.template_key = "read_bandwidth:unroll4";
  return r;
}

}  // namespace ditops::cli
