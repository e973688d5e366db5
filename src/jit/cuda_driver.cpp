#include "jit/cuda_driver.h"

#include <dlfcn.h>

#include <mutex>
#include <vector>

#include "core/device.h"
#include "ditops/tensor.h"

#define DITOPS_STR(x) #x
#define DITOPS_XSTR(x) DITOPS_STR(x)

namespace ditops::jit {

namespace {

struct DriverState {
  CudaDriver driver;
  bool ok = false;
  std::string why;
  std::mutex context_mutex;
  std::vector<CUcontext> primary;  // retained primary context per device (never released)
};

DriverState& state() {
  static DriverState* s = [] {
    auto* st = new DriverState();
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      st->why = "CUDA unavailable: the CUDA driver (libcuda.so.1) could not be loaded";
      return st;
    }
    CudaDriver& d = st->driver;
    // The header maps each name to its current ABI symbol (cuMemAlloc -> cuMemAlloc_v2); asking
    // dlsym for the mapped name gives the function whose prototype the header declares.
#define DITOPS_LOAD_FN(name)                                                                 \
  d.name = reinterpret_cast<decltype(d.name)>(dlsym(lib, DITOPS_XSTR(name)));                \
  if (!d.name) {                                                                             \
    st->why = std::string("CUDA unavailable: the driver lacks ") + DITOPS_XSTR(name) +      \
              " (driver too old for CUDA 13)";                                               \
    return st;                                                                               \
  }
    DITOPS_CUDA_DRIVER_FUNCTIONS(DITOPS_LOAD_FN)
#undef DITOPS_LOAD_FN
    CUresult r = d.cuInit(0);
    if (r != CUDA_SUCCESS) {
      const char* name = nullptr;
      d.cuGetErrorName(r, &name);
      st->why = std::string("CUDA unavailable: cuInit failed (") + (name ? name : "?") + ")";
      return st;
    }
    d.cuDriverGetVersion(&d.driver_version);
    d.cuDeviceGetCount(&d.device_count);
    if (d.device_count == 0) {
      st->why = "CUDA unavailable: the driver reports no device";
      return st;
    }
    st->primary.assign(d.device_count, nullptr);
    st->ok = true;
    return st;
  }();
  return *s;
}

// The simulated driver's functions: every call is refused.
template <typename F>
struct Refused;
template <typename... A>
struct Refused<CUresult (*)(A...)> {
  static CUresult fn(A...) { return CUDA_ERROR_NOT_SUPPORTED; }
};

const CudaDriver& simulated_driver() {
  static const CudaDriver d = [] {
    CudaDriver s;
#define DITOPS_REFUSE_FN(name) s.name = &Refused<decltype(s.name)>::fn;
    DITOPS_CUDA_DRIVER_FUNCTIONS(DITOPS_REFUSE_FN)
#undef DITOPS_REFUSE_FN
    s.device_count = 1;
    return s;
  }();
  return d;
}

}  // namespace

const CudaDriver* cuda_driver(std::string* why) {
  if (simulating_device()) [[unlikely]] return &simulated_driver();
  DriverState& s = state();
  if (!s.ok) {
    if (why) *why = s.why;
    return nullptr;
  }
  return &s.driver;
}

const CudaDriver& require_cuda_driver() {
  std::string why;
  const CudaDriver* d = cuda_driver(&why);
  if (!d) throw Error(why);
  return *d;
}

void check_cu(CUresult result, const char* what) {
  if (result == CUDA_SUCCESS) return;
  const CudaDriver* d = cuda_driver();
  const char* name = nullptr;
  const char* text = nullptr;
  if (d) {
    d->cuGetErrorName(result, &name);
    d->cuGetErrorString(result, &text);
  }
  throw Error(std::string(what) + ": " + (name ? name : "CUDA error " + std::to_string(result)) +
              (text ? std::string(" (") + text + ")" : ""));
}

void bind_primary_context(int device_index) {
  const CudaDriver& d = require_cuda_driver();
  // Per-call fast path without the lock: the primary context of a device never changes once
  // retained.
  thread_local int last_index = -1;
  thread_local CUcontext last_ctx = nullptr;
  if (device_index == last_index) {
    CUcontext current = nullptr;
    d.cuCtxGetCurrent(&current);
    if (current != last_ctx) check_cu(d.cuCtxSetCurrent(last_ctx), "cuCtxSetCurrent");
    return;
  }
  DriverState& s = state();
  if (device_index < 0 || device_index >= d.device_count)
    throw Error("CUDA device " + std::to_string(device_index) + " does not exist (" +
                std::to_string(d.device_count) + " devices)");
  CUcontext ctx;
  {
    std::lock_guard<std::mutex> lock(s.context_mutex);
    if (!s.primary[device_index]) {
      CUdevice dev;
      check_cu(d.cuDeviceGet(&dev, device_index), "cuDeviceGet");
      check_cu(d.cuDevicePrimaryCtxRetain(&s.primary[device_index], dev), "cuDevicePrimaryCtxRetain");
    }
    ctx = s.primary[device_index];
  }
  CUcontext current = nullptr;
  d.cuCtxGetCurrent(&current);
  if (current != ctx) check_cu(d.cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
  last_index = device_index;
  last_ctx = ctx;
}

}  // namespace ditops::jit
