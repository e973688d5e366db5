// The real machine behind core's device_info (core/device.h MachineQuery): the CUDA device's
// compute capability, multiprocessors and name through the driver, and whether NVRTC loads.
// Installed when the library loads.
#include "core/device.h"
#include "jit/cuda_driver.h"
#include "jit/nvrtc.h"

namespace ditops::jit {

namespace {

DeviceInfo query_cuda_device(int index) {
  const CudaDriver& d = require_cuda_driver();
  if (index < 0 || index >= d.device_count)
    throw Error("CUDA device " + std::to_string(index) + " does not exist (" + std::to_string(d.device_count) +
                " devices)");
  CUdevice dev;
  check_cu(d.cuDeviceGet(&dev, index), "cuDeviceGet");
  int major = 0, minor = 0, sms = 0;
  d.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
  d.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev);
  d.cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev);
  char name[256] = {};
  d.cuDeviceGetName(name, sizeof name, dev);
  DeviceInfo info;
  info.sm = major * 10 + minor;
  info.multiprocessors = sms;
  info.name = name;
  return info;
}

bool nvrtc_loadable() { return nvrtc_version() > 0; }

const bool kInstalled = (install_machine_query({query_cuda_device, nvrtc_loadable}), true);

}  // namespace

}  // namespace ditops::jit
