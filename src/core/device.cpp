#include "core/device.h"

#include <cstdlib>
#include <map>
#include <mutex>
#include <string>

namespace ditops {

static const DeviceInfo& device_info_slow(Device device);

namespace {
thread_local const DeviceInfo* t_simulated = nullptr;  // SimulatedDeviceScope
MachineQuery g_machine;  // installed by src/jit at load time, read after

// Whether environment variable `name` is set to `on_value` or `word` (e.g. "1" / "on").
bool env_says(const char* name, const char* on_value, const char* word) {
  const char* v = std::getenv(name);
  return v && (std::string(v) == on_value || std::string(v) == word);
}

// DITOPS_PDL=0: launch without programmatic dependent launch (an A/B of its effect on the kernels
// around ours, e.g. a cuBLAS GEMM that triggers its dependents early). Read once per device.
bool pdl_allowed() { return !env_says("DITOPS_PDL", "0", "off"); }

// DITOPS_GELU_TABLE=1: fp8_rowwise_quant's GELU rows by the shared-memory table
// (kernels/common/gelu_table.cuh). Opt-in: faster alone on an H100, slower in the random-weight FLUX.1
// forward (docs/fp8_rowwise_quant.md). Read once per device.
bool gelu_table_opted_in() { return env_says("DITOPS_GELU_TABLE", "1", "on"); }

uint32_t features_of_sm(int sm) {
  uint32_t features = 0;
  if (sm >= 90 && pdl_allowed()) features |= kFeaturePdl;
  if (sm >= 89 && gelu_table_opted_in()) features |= kFeatureGeluTable;
  if (sm == 100 || sm == 103 || sm == 120 || sm == 121) features |= kFeatureFp4Convert;
  if (g_machine.nvrtc && g_machine.nvrtc()) features |= kFeatureNvrtc;
  return features;
}
}  // namespace

void install_machine_query(const MachineQuery& query) { g_machine = query; }

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
  if (!g_machine.cuda_device) throw Error("CUDA unavailable: no CUDA driver layer in this build");
  DeviceInfo info = g_machine.cuda_device(device.index);
  info.device = device;
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
}

SimulatedDeviceScope::~SimulatedDeviceScope() { t_simulated = previous_; }

bool simulating_device() { return t_simulated != nullptr; }

}  // namespace ditops
