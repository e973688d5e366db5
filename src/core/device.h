// Device facts for dispatch (SM, features, multiprocessors), queried once per device and cached:
// after the first call on a device, asking costs no driver call.
#pragma once

#include "ditops/registry.h"

namespace ditops {

// For DeviceKind::cpu returns the CPU; throws Error for a CUDA device that does not exist.
const DeviceInfo& device_info(Device device);

}  // namespace ditops
