#include "jit/jit.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>

#include "jit/cuda_driver.h"

namespace ditops::jit {

namespace generated {
struct EmbeddedFile {
  const char* name;
  const unsigned char* data;
  size_t size;
};
extern const EmbeddedFile kEmbeddedKernelFiles[];
struct AotTableEntry {
  const char* template_key;
  const char* entry_name;
};
extern const AotTableEntry kAotEntries[];  // terminated by {nullptr, nullptr}
extern const unsigned char kAotFatbin[];
extern const size_t kAotFatbinSize;
}  // namespace generated

namespace {

uint64_t fnv1a(const void* data, size_t size, uint64_t h = 1469598103934665603ull) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < size; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

struct CacheState {
  std::mutex mutex;
  std::map<std::string, std::vector<uint8_t>> cubins;  // cache key -> cubin
  DiskCacheStats stats;
  // (device, key) -> loaded kernel; entries are never erased, so references stay valid.
  std::map<std::string, std::unique_ptr<LoadedKernel>> loaded;
  std::map<int, CUmodule> aot_modules;
  std::map<int, std::string> aot_failures;
};

CacheState& cache() {
  static CacheState* s = new CacheState();
  return *s;
}

constexpr char kMagic[8] = {'D', 'I', 'T', 'O', 'P', 'S', 'C', '1'};

std::string cache_key(const KernelRequest& r, const std::string& arch) {
  return "ditops-jit-v1|" + r.header + "|" + r.function + "<" + r.template_args + ">|" +
         r.params_type + "|" + std::to_string(r.max_threads) + "," + std::to_string(r.min_blocks) + "|" + arch + "|nvrtc" +
         std::to_string(nvrtc_version()) + "|src" + hex64(embedded_sources_hash());
}

void mkdirs(const std::string& path) {
  for (size_t pos = 1; pos <= path.size(); ++pos) {
    if (pos == path.size() || path[pos] == '/') mkdir(path.substr(0, pos).c_str(), 0755);
  }
}

// Reads and verifies one entry; false (and the file removed) when missing, truncated or corrupt.
bool read_entry(const std::string& path, const std::string& key, std::vector<uint8_t>* out,
                bool* corrupt) {
  *corrupt = false;
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::string blob((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto bad = [&] {
    *corrupt = true;
    std::remove(path.c_str());
    return false;
  };
  const size_t header = sizeof kMagic + 8 + 8 + 4;
  if (blob.size() < header || std::memcmp(blob.data(), kMagic, sizeof kMagic) != 0) return bad();
  uint64_t payload_size, payload_hash;
  uint32_t key_size;
  std::memcpy(&payload_size, blob.data() + 8, 8);
  std::memcpy(&payload_hash, blob.data() + 16, 8);
  std::memcpy(&key_size, blob.data() + 24, 4);
  if (blob.size() != header + key_size + payload_size) return bad();
  if (blob.compare(header, key_size, key) != 0) return bad();  // hash collision or stale entry
  const char* payload = blob.data() + header + key_size;
  if (fnv1a(payload, payload_size) != payload_hash) return bad();
  out->assign(payload, payload + payload_size);
  return true;
}

// Publishes atomically: write a private temp file, then rename over the final name. Readers see
// either no file or a complete one; concurrent writers of one key race benignly (same bytes).
void write_entry(const std::string& dir, const std::string& path, const std::string& key,
                 const std::vector<uint8_t>& cubin) {
  mkdirs(dir);
  std::string tmp = path + ".tmp." + std::to_string(getpid()) + "." +
                    std::to_string(std::chrono::steady_clock::now().time_since_epoch().count());
  {
    std::ofstream out(tmp, std::ios::binary);
    if (!out) return;  // an unwritable cache only costs a recompile next time
    uint64_t size = cubin.size(), hash = fnv1a(cubin.data(), cubin.size());
    uint32_t key_size = static_cast<uint32_t>(key.size());
    out.write(kMagic, sizeof kMagic);
    out.write(reinterpret_cast<const char*>(&size), 8);
    out.write(reinterpret_cast<const char*>(&hash), 8);
    out.write(reinterpret_cast<const char*>(&key_size), 4);
    out.write(key.data(), key.size());
    out.write(reinterpret_cast<const char*>(cubin.data()), cubin.size());
    if (!out) {
      std::remove(tmp.c_str());
      return;
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) std::remove(tmp.c_str());
}

}  // namespace

const std::vector<SourceFile>& embedded_sources() {
  static const std::vector<SourceFile>* files = [] {
    auto* v = new std::vector<SourceFile>();
    for (const auto* f = generated::kEmbeddedKernelFiles; f->name; ++f)
      v->push_back({f->name, std::string(reinterpret_cast<const char*>(f->data), f->size)});
    return v;
  }();
  return *files;
}

uint64_t embedded_sources_hash() {
  static const uint64_t hash = [] {
    uint64_t h = fnv1a("", 0);
    for (const auto& f : embedded_sources()) {
      h = fnv1a(f.name.data(), f.name.size(), h);
      h = fnv1a(f.contents.data(), f.contents.size(), h);
    }
    return h;
  }();
  return hash;
}

std::string arch_for_sm(int sm) {
  if (sm == 90 || sm == 100 || sm == 103 || sm == 110 || sm == 120 || sm == 121)
    return "sm_" + std::to_string(sm) + "a";
  return "sm_" + std::to_string(sm);
}

std::string cache_entry_path(const KernelRequest& request, const std::string& arch) {
  return config().cache_dir + "/cubin/" + hex64(fnv1a(cache_key(request, arch).data(),
                                                      cache_key(request, arch).size())) +
         ".cubin";
}

std::vector<uint8_t> get_cubin(const KernelRequest& request, const std::string& arch) {
  const std::string key = cache_key(request, arch);
  CacheState& c = cache();
  {
    std::lock_guard<std::mutex> lock(c.mutex);
    auto it = c.cubins.find(key);
    if (it != c.cubins.end()) {
      ++c.stats.memory_hits;
      return it->second;
    }
  }
  const std::string dir = config().cache_dir + "/cubin";
  const std::string path = cache_entry_path(request, arch);
  std::vector<uint8_t> cubin;
  bool corrupt = false;
  const auto start = std::chrono::steady_clock::now();
  if (read_entry(path, key, &cubin, &corrupt)) {
    std::lock_guard<std::mutex> lock(c.mutex);
    ++c.stats.disk_hits;
  } else {
    cubin = nvrtc_compile(wrapper_source(request, "ditops_entry"), "ditops_jit_entry.cu", arch,
                          embedded_sources());
    write_entry(dir, path, key, cubin);
    std::lock_guard<std::mutex> lock(c.mutex);
    ++c.stats.compiles;
    if (corrupt) ++c.stats.corrupt_rebuilt;
  }
  if (config().jit_verbose) {
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    std::fprintf(stderr, "[ditops] jit %s %s for %s: %.1f ms (%s)\n",
                 corrupt ? "rebuilt corrupt entry" : "", request.template_key.c_str(), arch.c_str(), ms,
                 path.c_str());
  }
  std::lock_guard<std::mutex> lock(c.mutex);
  c.cubins.emplace(key, cubin);
  return cubin;
}

DiskCacheStats cache_stats() {
  std::lock_guard<std::mutex> lock(cache().mutex);
  return cache().stats;
}

void clear_memory_cache() {
  std::lock_guard<std::mutex> lock(cache().mutex);
  cache().cubins.clear();
}

namespace {

std::unique_ptr<LoadedKernel> finish_load(CUfunction function, int max_threads, int device_index) {
  const CudaDriver& d = require_cuda_driver();
  auto k = std::make_unique<LoadedKernel>();
  k->function = function;
  check_cu(d.cuOccupancyMaxActiveBlocksPerMultiprocessor(&k->blocks_per_sm, function, max_threads, 0),
           "cuOccupancyMaxActiveBlocksPerMultiprocessor");
  k->multiprocessors = device_info({DeviceKind::cuda, device_index}).multiprocessors;
  k->max_threads = max_threads;
  if (k->blocks_per_sm < 1) k->blocks_per_sm = 1;
  return k;
}

}  // namespace

const LoadedKernel& jit_kernel(const KernelRequest& request, int device_index) {
  const DeviceInfo& info = device_info({DeviceKind::cuda, device_index});
  const std::string arch = arch_for_sm(info.sm);
  const std::string slot = std::to_string(device_index) + "|" + cache_key(request, arch);
  CacheState& c = cache();
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
  check_cu(d.cuModuleGetFunction(&function, module, "ditops_entry"), "cuModuleGetFunction");
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
  CacheState& c = cache();
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

static const DeviceInfo& device_info_slow(Device device);

const DeviceInfo& device_info(Device device) {
  static const DeviceInfo cpu{{DeviceKind::cpu, 0}, 0, 0, 0, "host CPU"};
  if (device.kind == DeviceKind::cpu) return cpu;
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
  const CudaDriver& d = require_cuda_driver();
  if (device.index < 0 || device.index >= d.device_count)
    throw Error("CUDA device " + std::to_string(device.index) + " does not exist (" +
                std::to_string(d.device_count) + " devices)");
  CUdevice dev;
  check_cu(d.cuDeviceGet(&dev, device.index), "cuDeviceGet");
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
  if (info.sm >= 90) info.features |= kFeaturePdl;
  if (info.sm == 100 || info.sm == 103 || info.sm == 120 || info.sm == 121)
    info.features |= kFeatureFp4Convert;
  if (nvrtc_version() > 0) info.features |= kFeatureNvrtc;
  return infos->emplace(device.index, info).first->second;
}

void bind_and_check_stream(const char* op, const char* tensor, Device device, Stream stream) {
  if (device.kind != DeviceKind::cuda) return;
  bind_primary_context(device.index);
  const int stream_dev = stream_device(static_cast<CUstream>(stream));
  if (stream_dev >= 0 && stream_dev != device.index)
    throw Error(std::string(op) + ": the stream belongs to cuda:" + std::to_string(stream_dev) + " but " + tensor +
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
