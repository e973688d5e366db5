#include "jit/cubin_cache.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
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

// Entry layout: magic, payload size (u64), payload FNV-1a (u64), key size (u32), key, payload.
constexpr char kMagic[8] = {'D', 'I', 'T', 'O', 'P', 'S', 'C', '1'};
constexpr size_t kHeaderBytes = sizeof kMagic + 8 + 8 + 4;
// A cubin is a few MiB at most; a larger file at an entry's path is not one of ours, and reading
// it (or /dev/zero behind a link) must not take unbounded memory.
constexpr off_t kMaxEntryBytes = off_t{256} << 20;

constexpr const char* kEntrySuffix = ".cubin";
constexpr const char* kLockSuffix = ".lock";  // appended to the entry's name
constexpr const char* kTempInfix = ".tmp.";   // appended to the entry's name, then pid.counter

std::string entry_path_for_key(const std::string& cache_dir, const std::string& key) {
  return cache_dir + "/cubin/" + hex64(fnv1a(key.data(), key.size())) + kEntrySuffix;
}

void mkdirs(const std::string& path) {
  for (size_t pos = 1; pos <= path.size(); ++pos) {
    if (pos == path.size() || path[pos] == '/') mkdir(path.substr(0, pos).c_str(), 0755);
  }
}

std::string describe_file_type(mode_t mode) {
  if (S_ISDIR(mode)) return "is a directory";
  if (S_ISFIFO(mode)) return "is a FIFO";
  if (S_ISLNK(mode)) return "is a symbolic link";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "is a device";
  if (S_ISSOCK(mode)) return "is a socket";
  return "is not a regular file";
}

enum class EntryRead { hit, missing, corrupt, unusable };

// Reads an entry's bytes without following links or blocking (a FIFO or a link to /dev/zero at
// the path is refused, not read); only a regular file of bounded size is read.
EntryRead read_entry_file(const std::string& path, std::string* blob, std::string* why) {
  int fd = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT || errno == ENOTDIR) return EntryRead::missing;
    *why = errno == ELOOP ? "is a symbolic link" : std::string("cannot be opened: ") + std::strerror(errno);
    return EntryRead::unusable;
  }
  struct stat st {};
  EntryRead result = EntryRead::hit;
  if (fstat(fd, &st) != 0) {
    *why = std::string("cannot be examined: ") + std::strerror(errno);
    result = EntryRead::unusable;
  } else if (!S_ISREG(st.st_mode)) {
    *why = describe_file_type(st.st_mode);
    result = EntryRead::unusable;
  } else if (st.st_size > kMaxEntryBytes) {
    *why = "is " + std::to_string(st.st_size) + " bytes, more than a cubin entry can be";
    result = EntryRead::unusable;
  } else {
    blob->resize(static_cast<size_t>(st.st_size));
    size_t got = 0;
    while (got < blob->size()) {
      const ssize_t n = read(fd, blob->data() + got, blob->size() - got);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
    blob->resize(got);  // a short read shows up as a size mismatch below
  }
  close(fd);
  return result;
}

// Checks an entry's framing and payload hash; the stored key goes to `stored_key`.
bool parse_entry(const std::string& blob, std::string* stored_key, std::vector<uint8_t>* payload) {
  if (blob.size() < kHeaderBytes || std::memcmp(blob.data(), kMagic, sizeof kMagic) != 0) return false;
  uint64_t payload_size, payload_hash;
  uint32_t key_size;
  std::memcpy(&payload_size, blob.data() + 8, 8);
  std::memcpy(&payload_hash, blob.data() + 16, 8);
  std::memcpy(&key_size, blob.data() + 24, 4);
  if (payload_size > blob.size() || key_size > blob.size() ||
      blob.size() != kHeaderBytes + key_size + payload_size)
    return false;
  const char* data = blob.data() + kHeaderBytes + key_size;
  if (fnv1a(data, payload_size) != payload_hash) return false;
  stored_key->assign(blob.data() + kHeaderBytes, key_size);
  if (payload) payload->assign(data, data + payload_size);
  return true;
}

// One read of the entry for `key`: a hit fills `out`. A corrupt entry is left in place: the
// rebuilt one is renamed over it, and removing it here could remove a fresh one another process
// just published.
EntryRead read_entry(const std::string& path, const std::string& key, std::vector<uint8_t>* out) {
  std::string blob, why, stored_key;
  const EntryRead r = read_entry_file(path, &blob, &why);
  if (r == EntryRead::unusable) {
    warn_once("jit-cache-entry:" + path, "cubin cache entry " + path + " " + why +
                                             "; treating it as a miss (the kernel is compiled and "
                                             "served from memory)");
    return r;
  }
  if (r != EntryRead::hit) return r;
  // A key mismatch is a hash collision or an entry written under another key format.
  if (!parse_entry(blob, &stored_key, out) || stored_key != key) return EntryRead::corrupt;
  return EntryRead::hit;
}

// Holds an exclusive flock on the entry's lock file while this process looks for, compiles and
// publishes one key: processes on one node then compile a key once. The lock file stays (removing
// it would let a late process lock a new file while another holds the old one); the lock is
// released by close. Without a usable lock file (an unwritable cache) it holds nothing.
class EntryLock {
 public:
  explicit EntryLock(const std::string& lock_path) {
    fd_ = open(lock_path.c_str(), O_RDWR | O_CREAT | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd_ < 0) return;
    struct stat st {};
    if (fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
      release();
      return;
    }
    while (flock(fd_, LOCK_EX) != 0) {
      if (errno != EINTR) {
        release();
        return;
      }
    }
  }
  ~EntryLock() { release(); }
  EntryLock(const EntryLock&) = delete;
  EntryLock& operator=(const EntryLock&) = delete;

 private:
  void release() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }
  int fd_ = -1;
};

bool write_all(int fd, const void* data, size_t size) {
  const auto* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = write(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

// Publishes atomically: write a private temp file, then rename over the final name. Readers see
// either no file or a complete one. Returns "" or why the entry could not be published.
std::string write_entry(const std::string& path, const std::string& key, const std::vector<uint8_t>& cubin) {
  static std::atomic<uint64_t> counter{0};
  const std::string tmp = path + kTempInfix + std::to_string(getpid()) + "." + std::to_string(counter++);
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) return std::string("cannot create a file in its directory: ") + std::strerror(errno);
  const uint64_t size = cubin.size(), hash = fnv1a(cubin.data(), cubin.size());
  const uint32_t key_size = static_cast<uint32_t>(key.size());
  const bool written = write_all(fd, kMagic, sizeof kMagic) && write_all(fd, &size, 8) &&
                       write_all(fd, &hash, 8) && write_all(fd, &key_size, 4) &&
                       write_all(fd, key.data(), key.size()) && write_all(fd, cubin.data(), cubin.size());
  const int write_errno = errno;
  if (close(fd) != 0 || !written) {
    unlink(tmp.c_str());
    return std::string("cannot write it: ") + std::strerror(written ? errno : write_errno);
  }
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    unlink(tmp.c_str());
    return std::string("cannot rename it into place: ") + std::strerror(e);
  }
  return "";
}

bool has_suffix(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// "<16 hex digits>.cubin": the names this cache gives its entries (lock and temp files add to it).
bool is_entry_stem(const std::string& name) {
  if (name.size() < 16 + std::strlen(kEntrySuffix)) return false;
  for (size_t i = 0; i < 16; ++i)
    if (!std::isxdigit(static_cast<unsigned char>(name[i]))) return false;
  return name.compare(16, std::strlen(kEntrySuffix), kEntrySuffix) == 0;
}

enum class CacheFileKind { entry, lock, temp, other };

CacheFileKind classify(const std::string& name) {
  if (!is_entry_stem(name)) return CacheFileKind::other;
  const std::string rest = name.substr(16 + std::strlen(kEntrySuffix));
  if (rest.empty()) return CacheFileKind::entry;
  if (rest == kLockSuffix) return CacheFileKind::lock;
  if (rest.rfind(kTempInfix, 0) == 0) return CacheFileKind::temp;
  return CacheFileKind::other;
}

std::vector<std::string> directory_names(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = opendir(dir.c_str());
  if (!d) return names;
  while (const dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

// The key's first field: v2 added the entry's name (ditops_<op>) after it.
constexpr const char* kKeyFormat = "ditops-jit-v2";

std::string cache_key(const KernelRequest& r, const std::string& arch) {
  return std::string(kKeyFormat) + "|" + jit_entry_name(r) + "|" + r.header + "|" + r.function + "<" +
         r.template_args + ">|" + r.params_type + "|" + std::to_string(r.max_threads) + "," +
         std::to_string(r.min_blocks) + "|" + arch + "|nvrtc" + std::to_string(nvrtc_version()) + "|src" +
         hex64(embedded_sources_hash());
}

std::string cache_directory() { return config().cache_dir + "/cubin"; }

std::string cache_entry_path(const KernelRequest& request, const std::string& arch) {
  return entry_path_for_key(config().cache_dir, cache_key(request, arch));
}

std::vector<uint8_t> get_cubin(const KernelRequest& request, const std::string& arch) {
  const Config& cfg = config();
  const bool force = cfg.jit_force_recompile;
  const std::string key = cache_key(request, arch);
  CacheState& c = cache();
  if (!force) {
    std::lock_guard<std::mutex> lock(c.mutex);
    auto it = c.cubins.find(key);
    if (it != c.cubins.end()) {
      ++c.stats.memory_hits;
      return it->second;
    }
  }
  const std::string path = entry_path_for_key(cfg.cache_dir, key);
  const auto start = std::chrono::steady_clock::now();
  std::vector<uint8_t> cubin;
  EntryRead first = force ? EntryRead::missing : read_entry(path, key, &cubin);
  bool corrupt = first == EntryRead::corrupt;
  if (first != EntryRead::hit) {
    mkdirs(cfg.cache_dir + "/cubin");
    EntryLock lock(path + kLockSuffix);
    // Another process may have published the entry while this one waited for the lock.
    const EntryRead again = force ? EntryRead::missing : read_entry(path, key, &cubin);
    corrupt = corrupt || again == EntryRead::corrupt;
    if (again == EntryRead::hit) {
      corrupt = false;
      first = EntryRead::hit;
    } else {
      cubin = nvrtc_compile(wrapper_source(request, jit_entry_name(request)), "ditops_jit_entry.cu", arch,
                            embedded_sources());
      if (std::string why = write_entry(path, key, cubin); !why.empty())
        warn_once("jit-cache-publish:" + path,
                  "could not publish the cubin to the cache at " + path + ": " + why +
                      "; the kernel is served from memory and compiled again by the next process");
    }
  }
  {
    std::lock_guard<std::mutex> lock(c.mutex);
    if (first == EntryRead::hit) {
      ++c.stats.disk_hits;
    } else {
      ++c.stats.compiles;
      if (corrupt) ++c.stats.corrupt_rebuilt;
    }
    c.cubins.insert_or_assign(key, cubin);
  }
  if (cfg.jit_verbose) {
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    const char* what = first == EntryRead::hit ? "loaded" : corrupt ? "rebuilt corrupt entry" : "compiled";
    std::fprintf(stderr, "[ditops] jit %s %s for %s: %.1f ms (%s)\n", what, request.template_key.c_str(),
                 arch.c_str(), ms, path.c_str());
  }
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

std::vector<CacheEntryInfo> list_cache_entries() {
  const std::string dir = cache_directory();
  // The tail every current key ends with: an entry with another one was written by another
  // NVRTC or other kernel sources and is never read again.
  const std::string current_tail = "|nvrtc" + std::to_string(nvrtc_version()) + "|src" + hex64(embedded_sources_hash());
  std::vector<CacheEntryInfo> entries;
  for (const std::string& name : directory_names(dir)) {
    if (classify(name) != CacheFileKind::entry) continue;
    CacheEntryInfo info;
    info.path = dir + "/" + name;
    std::string blob, why, key;
    const EntryRead r = read_entry_file(info.path, &blob, &why);
    if (r == EntryRead::missing) continue;  // removed meanwhile
    struct stat st {};
    if (lstat(info.path.c_str(), &st) == 0) info.bytes = static_cast<uint64_t>(st.st_size);
    if (r == EntryRead::unusable) {
      info.problem = why;
    } else if (!parse_entry(blob, &key, nullptr)) {
      info.problem = "corrupt or truncated (rebuilt on next use)";
    } else {
      // "ditops-jit-v2|entry|header|function<args>|params|threads|arch|nvrtcN|srcH" (v1: no entry)
      std::vector<std::string> fields;
      for (size_t begin = 0;;) {
        const size_t bar = key.find('|', begin);
        fields.push_back(key.substr(begin, bar - begin));
        if (bar == std::string::npos) break;
        begin = bar + 1;
      }
      const bool current_format = fields[0] == kKeyFormat;
      if (fields.size() >= (current_format ? 9u : 8u)) {
        info.kernel = fields[current_format ? 3 : 2];
        info.arch = fields[fields.size() - 3];
      }
      if (!current_format) info.problem = "stale (an earlier key format)";
      else if (!has_suffix(key, current_tail)) info.problem = "stale (another NVRTC or other kernel sources)";
    }
    entries.push_back(info);
  }
  return entries;
}

CacheClearResult clear_disk_cache() {
  CacheClearResult result;
  result.directory = cache_directory();
  for (const std::string& name : directory_names(result.directory)) {
    const CacheFileKind kind = classify(name);
    if (kind == CacheFileKind::other) continue;  // not ours: left alone
    const std::string path = result.directory + "/" + name;
    struct stat st {};
    if (lstat(path.c_str(), &st) != 0) continue;
    if (S_ISDIR(st.st_mode)) {
      result.left.push_back(path + " (a directory)");
      continue;
    }
    if (unlink(path.c_str()) != 0) {
      result.left.push_back(path + " (" + std::strerror(errno) + ")");
      continue;
    }
    if (S_ISREG(st.st_mode)) result.bytes += static_cast<uint64_t>(st.st_size);
    if (kind == CacheFileKind::entry) ++result.entries;
    if (kind == CacheFileKind::lock) ++result.lock_files;
    if (kind == CacheFileKind::temp) ++result.temp_files;
  }
  return result;
}

}  // namespace ditops::jit
