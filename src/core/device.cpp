#include "core/device.h"

#include <map>
#include <mutex>

// The driver and NVRTC are loaded by the jit layer (dlopen); the device query only reads them.
#include "jit/cuda_driver.h"
#include "jit/nvrtc.h"

namespace ditops {

static const DeviceInfo& device_info_slow(Device device);

namespace {
thread_local const DeviceInfo* t_simulated = nullptr;  // SimulatedDeviceScope

uint32_t features_of_sm(int sm) {
  uint32_t features = 0;
  if (sm >= 90) features |= kFeaturePdl;
  if (sm == 100 || sm == 103 || sm == 120 || sm == 121) features |= kFeatureFp4Convert;
  if (jit::nvrtc_version() > 0) features |= kFeatureNvrtc;
  return features;
}
}  // namespace

const DeviceInfo& device_info(Device device) {
  static const DeviceInfo cpu{{DeviceKind::cpu, 0}, 0, 0, 0, "host CPU"};
  if (device.kind == DeviceKind::cpu) return cpu;
  if (t_simulated) [[unlikely]] return *t_simulated;
  // Per-call fast path: the entries never move or change once made (std::map nodes are stable).
  thread_local int last_index = -1;
  thread_local const DeviceInfo* last_info = nullptr;
  if (last_info && device.index == last_index) return *last_info;
  const DeviceInfo& info = device_info_slow(device);
  last_index = device.index;
  last_info = &info;
  return info;
}

static const DeviceInfo& device_info_slow(Device device) {
  static std::mutex mutex;
  static std::map<int, DeviceInfo>* infos = new std::map<int, DeviceInfo>();
  std::lock_guard<std::mutex> lock(mutex);
  auto it = infos->find(device.index);
  if (it != infos->end()) return it->second;
  const jit::CudaDriver& d = jit::require_cuda_driver();
  if (device.index < 0 || device.index >= d.device_count)
    throw Error("CUDA device " + std::to_string(device.index) + " does not exist (" +
                std::to_string(d.device_count) + " devices)");
  CUdevice dev;
  jit::check_cu(d.cuDeviceGet(&dev, device.index), "cuDeviceGet");
  int major = 0, minor = 0, sms = 0;
  d.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
  d.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev);
  d.cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev);
  char name[256] = {};
  d.cuDeviceGetName(name, sizeof name, dev);
  DeviceInfo info;
  info.device = device;
  info.sm = major * 10 + minor;
  info.multiprocessors = sms;
  info.name = name;
  info.features = features_of_sm(info.sm);
  return infos->emplace(device.index, info).first->second;
}

DeviceInfo simulated_device_info(Device device, int sm, int multiprocessors) {
  DeviceInfo info;
  info.device = device;
  info.sm = sm;
  info.multiprocessors = multiprocessors;
  info.features = features_of_sm(sm);
  info.name = "simulated sm_" + std::to_string(sm);
  return info;
}

SimulatedDeviceScope::SimulatedDeviceScope(const DeviceInfo& info) : info_(info), previous_(t_simulated) {
  t_simulated = &info_;
  jit::simulate_cuda_driver(true);
}

SimulatedDeviceScope::~SimulatedDeviceScope() {
  t_simulated = previous_;
  jit::simulate_cuda_driver(previous_ != nullptr);
}

}  // namespace ditops
