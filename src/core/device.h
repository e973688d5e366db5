// Device facts for dispatch (SM, features, multiprocessors), queried once per device and cached:
// after the first call on a device, asking costs no driver call.
#pragma once

#include "ditops/registry.h"

namespace ditops {

// For DeviceKind::cpu returns the CPU; throws Error for a CUDA device that does not exist.
const DeviceInfo& device_info(Device device);

// What dispatch would read on a CUDA device of compute capability `sm` (major*10 + minor) with
// `multiprocessors` SMs: features derived from the SM as for a real device, NVRTC as on this
// machine; named "simulated sm_90".
DeviceInfo simulated_device_info(Device device, int sm, int multiprocessors);

// While alive, on this thread only: device_info() of any CUDA device returns `info`, and the CUDA
// driver reads as present (simulating_device()). explain() uses it to show how dispatch would
// choose on an architecture this machine lacks; nothing may run inside the scope.
class SimulatedDeviceScope {
 public:
  explicit SimulatedDeviceScope(const DeviceInfo& info);
  ~SimulatedDeviceScope();
  SimulatedDeviceScope(const SimulatedDeviceScope&) = delete;
  SimulatedDeviceScope& operator=(const SimulatedDeviceScope&) = delete;

 private:
  DeviceInfo info_;
  const DeviceInfo* previous_;
};
// Whether this thread is inside a SimulatedDeviceScope (the driver layer then stands in a
// driver whose every call is refused).
bool simulating_device();

// How a real machine is read. The layer that loads the CUDA driver and NVRTC (src/jit) installs
// it when the library loads, so core never includes that layer; before that, or without it, there
// is no CUDA device and no NVRTC.
struct MachineQuery {
  DeviceInfo (*cuda_device)(int index) = nullptr;  // sm, multiprocessors, name; throws Error if absent
  bool (*nvrtc)() = nullptr;                       // NVRTC can be loaded
};
void install_machine_query(const MachineQuery& query);

}  // namespace ditops
