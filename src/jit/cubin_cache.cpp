#include "jit/cubin_cache.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>

#include "ditops/registry.h"
#include "jit/embedded_sources.h"
#include "jit/nvrtc.h"

namespace ditops::jit {

namespace {

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

struct CacheState {
  std::mutex mutex;
  std::map<std::string, std::vector<uint8_t>> cubins;  // cache key -> cubin
  DiskCacheStats stats;
};

CacheState& cache() {
  static CacheState* s = new CacheState();
  return *s;
}

constexpr char kMagic[8] = {'D', 'I', 'T', 'O', 'P', 'S', 'C', '1'};

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

std::string cache_key(const KernelRequest& r, const std::string& arch) {
  return "ditops-jit-v1|" + r.header + "|" + r.function + "<" + r.template_args + ">|" +
         r.params_type + "|" + std::to_string(r.max_threads) + "," + std::to_string(r.min_blocks) + "|" + arch + "|nvrtc" +
         std::to_string(nvrtc_version()) + "|src" + hex64(embedded_sources_hash());
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

}  // namespace ditops::jit
