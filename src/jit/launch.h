// Launching a loaded kernel on the caller's stream, and the per-call stream check. Nothing here
// allocates, synchronizes or queries the device beyond a cached stream lookup.
#pragma once

#include <cuda.h>

#include <cstddef>

#include "ditops/tensor.h"
#include "jit/module_loader.h"

namespace ditops::jit {

// Before dispatching a call on CUDA tensors: makes the device's primary context current and
// refuses a stream of another device, naming `op` and the tensor that carries the device.
// Nothing for CPU tensors.
void bind_and_check_stream(const char* op, const char* tensor, Device device, Stream stream);

// Launch on `stream` with programmatic dependent launch when `pdl` (the kernel must then call
// griddepcontrol.wait before its first dependent read). No allocation, no synchronization.
void launch(const LoadedKernel& kernel, unsigned grid, unsigned block, const void* params,
            size_t params_size, CUstream stream, bool pdl);

// The device a stream belongs to (cuStreamGetDevice), for checking tensors against it; -1 while
// the stream is capturing a graph (the query is not permitted then).
int stream_device(CUstream stream);

}  // namespace ditops::jit
