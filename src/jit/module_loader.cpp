#include "jit/module_loader.h"

#include <map>
#include <memory>
#include <mutex>

#include "core/device.h"
#include "jit/cubin_cache.h"
#include "jit/cuda_driver.h"

namespace ditops::jit {

namespace generated {
struct AotTableEntry {
  const char* template_key;
  const char* entry_name;
};
extern const AotTableEntry kAotEntries[];  // terminated by {nullptr, nullptr}
extern const unsigned char kAotFatbin[];
extern const size_t kAotFatbinSize;
}  // namespace generated

namespace {

struct LoaderState {
  std::mutex mutex;
  // (device, key) -> loaded kernel; entries are never erased, so references stay valid.
  std::map<std::string, std::unique_ptr<LoadedKernel>> loaded;
  std::map<int, CUmodule> aot_modules;
  std::map<int, std::string> aot_failures;
};

LoaderState& loader() {
  static LoaderState* s = new LoaderState();
  return *s;
}

}  // namespace

std::string arch_for_sm(int sm) {
  if (sm == 90 || sm == 100 || sm == 103 || sm == 110 || sm == 120 || sm == 121)
    return "sm_" + std::to_string(sm) + "a";
  return "sm_" + std::to_string(sm);
}

namespace {

std::unique_ptr<LoadedKernel> finish_load(CUfunction function, int max_threads, int device_index) {
  const CudaDriver& d = require_cuda_driver();
  auto k = std::make_unique<LoadedKernel>();
  k->function = function;
  check_cu(d.cuOccupancyMaxActiveBlocksPerMultiprocessor(&k->blocks_per_sm, function, max_threads, 0),
           "cuOccupancyMaxActiveBlocksPerMultiprocessor");
  k->multiprocessors = ditops::device_info({DeviceKind::cuda, device_index}).multiprocessors;
  k->max_threads = max_threads;
  if (k->blocks_per_sm < 1) k->blocks_per_sm = 1;
  return k;
}

}  // namespace

const LoadedKernel& jit_kernel(const KernelRequest& request, int device_index) {
  const DeviceInfo& info = ditops::device_info({DeviceKind::cuda, device_index});
  const std::string arch = arch_for_sm(info.sm);
  const std::string slot = std::to_string(device_index) + "|" + cache_key(request, arch);
  LoaderState& c = loader();
  // Resolution is serialized: concurrent first calls compile and load once.
  static std::mutex resolve_mutex;
  std::lock_guard<std::mutex> resolve_lock(resolve_mutex);
  {
    std::lock_guard<std::mutex> lock(c.mutex);
    auto it = c.loaded.find(slot);
    if (it != c.loaded.end()) return *it->second;
  }
  std::vector<uint8_t> cubin = get_cubin(request, arch);
  const CudaDriver& d = require_cuda_driver();
  bind_primary_context(device_index);
  CUmodule module;
  check_cu(d.cuModuleLoadData(&module, cubin.data()), "cuModuleLoadData (jit cubin)");
  CUfunction function;
  check_cu(d.cuModuleGetFunction(&function, module, jit_entry_name(request).c_str()), "cuModuleGetFunction");
  auto loaded = finish_load(function, request.max_threads, device_index);
  std::lock_guard<std::mutex> lock(c.mutex);
  return *c.loaded.emplace(slot, std::move(loaded)).first->second;
}

const std::vector<AotEntry>& aot_entries() {
  static const std::vector<AotEntry>* entries = [] {
    auto* v = new std::vector<AotEntry>();
    for (const auto* e = generated::kAotEntries; e->template_key; ++e)
      v->push_back({e->template_key, e->entry_name});
    return v;
  }();
  return *entries;
}

const AotEntry* find_aot(const std::string& template_key) {
  for (const auto& e : aot_entries())
    if (template_key == e.template_key) return &e;
  return nullptr;
}

const LoadedKernel* aot_kernel(const std::string& entry_name, int max_threads, int device_index) {
  LoaderState& c = loader();
  const std::string slot = std::to_string(device_index) + "|aot|" + entry_name;
  static std::mutex resolve_mutex;
  std::lock_guard<std::mutex> resolve_lock(resolve_mutex);
  CUmodule module = nullptr;
  {
    std::lock_guard<std::mutex> lock(c.mutex);
    auto it = c.loaded.find(slot);
    if (it != c.loaded.end()) return it->second.get();
    if (c.aot_failures.count(device_index)) return nullptr;
    auto m = c.aot_modules.find(device_index);
    if (m != c.aot_modules.end()) module = m->second;
  }
  const CudaDriver& d = require_cuda_driver();
  bind_primary_context(device_index);
  if (!module) {
    if (generated::kAotFatbinSize == 0) return nullptr;
    CUresult r = d.cuModuleLoadData(&module, generated::kAotFatbin);
    std::lock_guard<std::mutex> lock(c.mutex);
    if (r != CUDA_SUCCESS) {
      c.aot_failures[device_index] = "no image for this device";
      return nullptr;
    }
    c.aot_modules[device_index] = module;
  }
  CUfunction function;
  check_cu(d.cuModuleGetFunction(&function, module, entry_name.c_str()), "cuModuleGetFunction (aot)");
  auto loaded = finish_load(function, max_threads, device_index);
  std::lock_guard<std::mutex> lock(c.mutex);
  return c.loaded.emplace(slot, std::move(loaded)).first->second.get();
}

}  // namespace ditops::jit
