// The CUDA driver API, loaded at run time with dlopen so that libditops starts on machines with
// no driver (there every CUDA implementation reports "CUDA unavailable").
#pragma once

#include <cuda.h>

#include <string>

namespace ditops::jit {

#define DITOPS_CUDA_DRIVER_FUNCTIONS(X)                                                        \
  X(cuInit) X(cuDriverGetVersion) X(cuGetErrorString) X(cuGetErrorName) X(cuDeviceGetCount)    \
  X(cuDeviceGet) X(cuDeviceGetAttribute) X(cuDeviceGetName) X(cuDevicePrimaryCtxRetain)        \
  X(cuCtxGetCurrent) X(cuCtxSetCurrent) X(cuCtxGetDevice) X(cuCtxSynchronize)                  \
  X(cuStreamGetDevice) X(cuStreamCreate) X(cuStreamDestroy) X(cuStreamSynchronize)             \
  X(cuModuleLoadData) X(cuModuleUnload) X(cuModuleGetFunction) X(cuFuncSetAttribute)           \
  X(cuOccupancyMaxActiveBlocksPerMultiprocessor) X(cuLaunchKernelEx) X(cuMemAlloc)             \
  X(cuMemFree) X(cuMemcpyHtoD) X(cuMemcpyDtoH) X(cuMemcpyDtoD) X(cuMemcpyDtoDAsync)           \
  X(cuMemsetD8) X(cuMemsetD8Async) X(cuEventCreate) X(cuEventDestroy) X(cuEventRecord)         \
  X(cuEventSynchronize) X(cuEventElapsedTime) X(cuStreamBeginCapture) X(cuStreamEndCapture)    \
  X(cuGraphInstantiate) X(cuGraphLaunch) X(cuGraphDestroy) X(cuGraphExecDestroy)              \
  X(cuPointerGetAttribute) X(cuStreamIsCapturing) X(cuThreadExchangeStreamCaptureMode)

struct CudaDriver {
#define DITOPS_DECLARE_FN(name) decltype(&::name) name = nullptr;
  DITOPS_CUDA_DRIVER_FUNCTIONS(DITOPS_DECLARE_FN)
#undef DITOPS_DECLARE_FN
  int driver_version = 0;
  int device_count = 0;
};

// The loaded driver (cuInit done), or nullptr; `why` then says what is missing. Thread-safe,
// loads once. Inside a SimulatedDeviceScope (core/device.h, explain on a simulated device): a
// stand-in whose every function returns CUDA_ERROR_NOT_SUPPORTED, so availability checks pass and
// anything that would touch a device fails with an Error.
const CudaDriver* cuda_driver(std::string* why = nullptr);
// Throws Error when CUDA is unavailable.
const CudaDriver& require_cuda_driver();


// Throws ditops::Error("<what>: CUDA_ERROR_xxx (message)") when result is not CUDA_SUCCESS.
void check_cu(CUresult result, const char* what);

// Makes the device's primary context current on this thread (retained once per device, cached).
void bind_primary_context(int device_index);

}  // namespace ditops::jit
