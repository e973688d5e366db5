// The JIT and the launcher, the interface the ops include: kernel sources embedded in the
// library are compiled with NVRTC for the device's exact architecture (nvrtc.h), cached in
// memory and on disk (cubin_cache.h), loaded once per device with the prebuilt (aot) table
// beside them (module_loader.h), and launched on the caller's stream (launch.h).
#pragma once

#include "core/device.h"
#include "ditops/registry.h"
#include "jit/cubin_cache.h"
#include "jit/embedded_sources.h"
#include "jit/kernel_request.h"
#include "jit/launch.h"
#include "jit/module_loader.h"
#include "jit/nvrtc.h"
