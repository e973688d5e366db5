// `ditops cache list` and `ditops cache clear`: the on-disk cubin cache of DITOPS_CACHE_DIR.
#include <cstdio>
#include <string>

#include "ditops/tensor.h"
#include "jit/cubin_cache.h"
#include "tools/cli_common.h"

namespace ditops::cli {
namespace {

std::string human_bytes(uint64_t bytes) {
  char buf[32];
  if (bytes >= (uint64_t{1} << 20))
    std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  else
    std::snprintf(buf, sizeof buf, "%.1f KiB", static_cast<double>(bytes) / (1 << 10));
  return buf;
}

int cache_list() {
  const auto entries = jit::list_cache_entries();
  std::printf("cubin cache: %s\n", jit::cache_directory().c_str());
  uint64_t total = 0;
  for (const auto& e : entries) {
    total += e.bytes;
    std::printf("  %s  %-8s %10llu  %s%s%s\n", e.path.c_str(), e.arch.empty() ? "-" : e.arch.c_str(),
                static_cast<unsigned long long>(e.bytes), e.kernel.c_str(), e.kernel.empty() ? "" : "  ",
                e.problem.empty() ? "" : ("(" + e.problem + ")").c_str());
  }
  std::printf("%zu %s, %llu bytes (%s)\n", entries.size(), entries.size() == 1 ? "entry" : "entries",
              static_cast<unsigned long long>(total), human_bytes(total).c_str());
  return 0;
}

int cache_clear() {
  const jit::CacheClearResult r = jit::clear_disk_cache();
  std::printf("removed %d %s, %d lock %s and %d temp %s from %s: freed %llu bytes (%s)\n", r.entries,
              r.entries == 1 ? "entry" : "entries", r.lock_files, r.lock_files == 1 ? "file" : "files",
              r.temp_files, r.temp_files == 1 ? "file" : "files", r.directory.c_str(),
              static_cast<unsigned long long>(r.bytes), human_bytes(r.bytes).c_str());
  for (const auto& left : r.left) std::printf("  left %s\n", left.c_str());
  return r.left.empty() ? 0 : 1;
}

}  // namespace

int cmd_cache(const Args& args) {
  const std::string what = args.words.size() >= 2 ? args.words[1] : "";
  if (what == "list") return cache_list();
  if (what == "clear") return cache_clear();
  throw Error("cache: expected 'list' or 'clear' but got '" + what + "'");
}

}  // namespace ditops::cli
