#include "jit/launch.h"

#include <cstdint>

#include "jit/cuda_driver.h"

namespace ditops::jit {

void launch(const LoadedKernel& kernel, unsigned grid, unsigned block, const void* params,
            size_t params_size, CUstream stream, bool pdl) {
  const CudaDriver& d = require_cuda_driver();
  CUlaunchAttribute attribute{};
  attribute.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
  attribute.value.programmaticStreamSerializationAllowed = 1;
  CUlaunchConfig cfg{};
  cfg.gridDimX = grid;
  cfg.gridDimY = cfg.gridDimZ = 1;
  cfg.blockDimX = block;
  cfg.blockDimY = cfg.blockDimZ = 1;
  cfg.sharedMemBytes = 0;
  cfg.hStream = stream;
  cfg.attrs = pdl ? &attribute : nullptr;
  cfg.numAttrs = pdl ? 1 : 0;
  // The params struct is passed by value through the extra-argument buffer.
  void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, const_cast<void*>(params),
                   CU_LAUNCH_PARAM_BUFFER_SIZE, &params_size, CU_LAUNCH_PARAM_END};
  check_cu(d.cuLaunchKernelEx(&cfg, kernel.function, nullptr, extra), "cuLaunchKernelEx");
}

void bind_and_check_stream(const char* op, const char* tensor, Device device, Stream stream) {
  if (device.kind != DeviceKind::cuda) return;
  bind_primary_context(device.index);
  const int stream_dev = stream_device(static_cast<CUstream>(stream));
  if (stream_dev >= 0 && stream_dev != device.index)
    throw InvalidArgument(std::string(op) + ": the stream belongs to cuda:" + std::to_string(stream_dev) + " but " + tensor +
                " is on " + device_name(device));
}

int stream_device(CUstream stream) {
  // One thread-local entry saves two driver calls per launch: a stream's device never changes.
  // The special handles (0: legacy default, 1: CU_STREAM_LEGACY, 2: CU_STREAM_PER_THREAD) mean
  // "the current context's" stream and are not cached. (A stream destroyed and its handle reused
  // for a stream of another device between two calls would be misreported; the launch itself
  // then fails with the driver's error instead of ours.)
  thread_local CUstream last_stream = nullptr;
  thread_local int last_device = -1;
  const bool cacheable = reinterpret_cast<uintptr_t>(stream) > 2;
  if (cacheable && stream == last_stream) return last_device;
  const CudaDriver& d = require_cuda_driver();
  // Querying a capturing stream's device invalidates the capture: report "unknown" (-1) then;
  // the capture itself is bound to the stream's device.
  CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
  check_cu(d.cuStreamIsCapturing(stream, &capture), "cuStreamIsCapturing");
  if (capture != CU_STREAM_CAPTURE_STATUS_NONE) return -1;
  CUdevice dev = 0;
  check_cu(d.cuStreamGetDevice(stream, &dev), "cuStreamGetDevice");
  if (cacheable) {
    last_stream = stream;
    last_device = static_cast<int>(dev);
  }
  return static_cast<int>(dev);
}

}  // namespace ditops::jit
