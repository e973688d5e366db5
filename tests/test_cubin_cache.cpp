// The on-disk cubin cache without a GPU (NVRTC compiles on the CPU machine): per-key file locking
// across processes, DITOPS_JIT_FORCE_RECOMPILE, hostile states at an entry's path or of the cache
// directory, and `ditops cache list / clear`. Every test that could hang arms alarm() so that a
// regression fails instead of stalling CI.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <vector>

#include "ditops/registry.h"
#include "jit/jit.h"
#include "ops/qknorm_rope/qknorm_rope_kernels.h"

namespace ditops {
namespace {

namespace fs = std::filesystem;

constexpr const char* kArch = "sm_90a";

KernelRequest small_request() {
  QkKernelKey key;
  key.head_dim = 64;
  key.rope_dim = 64;
  return qk_kernel_request(key);
}

// The cubin NVRTC gives for small_request(), compiled once per test binary outside the cache.
const std::vector<uint8_t>& fresh_cubin() {
  static const std::vector<uint8_t> cubin = jit::nvrtc_compile(
      jit::wrapper_source(small_request(), jit::jit_entry_name(small_request())), "ditops_jit_entry.cu", kArch, jit::embedded_sources());
  return cubin;
}

class CubinCache : public ::testing::Test {
 protected:
  void SetUp() override {
    if (jit::nvrtc_version() <= 0) GTEST_SKIP() << "NVRTC not loadable here";
    dir_ = fs::temp_directory_path() / ("ditops-cubin-cache-test-" + std::to_string(getpid()) + "-" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    setenv("DITOPS_CACHE_DIR", dir_.c_str(), 1);
    unsetenv("DITOPS_JIT_FORCE_RECOMPILE");
    reload_config();
    jit::clear_memory_cache();
    reset_warnings();
    set_warning_sink([this](const std::string& message) {
      std::lock_guard<std::mutex> lock(mutex_);
      warnings_.push_back(message);
    });
  }
  void TearDown() override {
    alarm(0);
    set_warning_sink(nullptr);
    reset_warnings();
    std::error_code ignored;
    fs::permissions(dir_, fs::perms::owner_all, fs::perm_options::add, ignored);
    fs::remove_all(dir_, ignored);
    unsetenv("DITOPS_CACHE_DIR");
    unsetenv("DITOPS_JIT_FORCE_RECOMPILE");
    reload_config();
  }
  std::vector<std::string> warnings_with(const std::string& text) {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<std::string> out;
    for (const auto& w : warnings_)
      if (w.find(text) != std::string::npos) out.push_back(w);
    return out;
  }
  std::string all_warnings() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::string out;
    for (const auto& w : warnings_) out += w + "\n";
    return out;
  }
  // Requests the key twice: the first call compiles (the entry is unusable), the second is served
  // from memory. Both return the fresh cubin.
  void expect_compiled_then_served_from_memory() {
    const auto request = small_request();
    const auto before = jit::cache_stats();
    EXPECT_EQ(jit::get_cubin(request, kArch), fresh_cubin());
    const auto middle = jit::cache_stats();
    EXPECT_EQ(middle.compiles - before.compiles, 1);
    EXPECT_EQ(middle.disk_hits - before.disk_hits, 0);
    EXPECT_EQ(jit::get_cubin(request, kArch), fresh_cubin());
    EXPECT_EQ(jit::cache_stats().memory_hits - middle.memory_hits, 1);
  }

  fs::path dir_;
  std::mutex mutex_;
  std::vector<std::string> warnings_;
};

struct ChildReport {
  int compiles = -1;
  int disk_hits = -1;
  uint64_t cubin_hash = 0;
  uint64_t cubin_size = 0;
};

// The JIT names each entry after its op, so that a profiler's kernel list tells the ops apart; the
// loader asks the module for that name (module_loader.cpp), so the cubin must hold it.
TEST(JitEntryName, IsTheOpOfTheTemplateKey) {
  KernelRequest r;
  r.template_key = "fp8_rowwise_quant:bf16,slots=6,vec16,gelu,pdl";
  EXPECT_EQ(jit::jit_entry_name(r), "ditops_fp8_rowwise_quant");
  r.template_key = "layernorm_modulate:fp8_rowwise,slots=6,cta";
  EXPECT_EQ(jit::jit_entry_name(r), "ditops_layernorm_modulate");
  r.template_key = "odd-op.v2";  // no ':': the whole key, every other character an underscore
  EXPECT_EQ(jit::jit_entry_name(r), "ditops_odd_op_v2");
  r.template_key = "";
  EXPECT_EQ(jit::jit_entry_name(r), "ditops_entry");
  EXPECT_EQ(jit::jit_entry_name(small_request()), "ditops_qknorm_rope");
}

TEST_F(CubinCache, TheCubinHoldsTheEntryTheLoaderAsksFor) {
  const auto cubin = jit::get_cubin(small_request(), kArch);
  const std::string bytes(cubin.begin(), cubin.end()), name = jit::jit_entry_name(small_request());
  EXPECT_NE(bytes.find(name + '\0'), std::string::npos) << name << " is not a symbol of the cubin";
  EXPECT_EQ(bytes.find(std::string("ditops_entry") + '\0'), std::string::npos);
}

TEST_F(CubinCache, FourColdProcessesCompileOneKeyOnce) {
  constexpr int kProcesses = 4;
  const auto request = small_request();
  (void)fresh_cubin();
  alarm(120);
  int go[2], reports[2];
  ASSERT_EQ(pipe(go), 0);
  ASSERT_EQ(pipe(reports), 0);
  std::vector<pid_t> children;
  for (int i = 0; i < kProcesses; ++i) {
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      alarm(100);
      close(go[1]);
      close(reports[0]);
      char byte;
      (void)!read(go[0], &byte, 1);  // every child starts when the parent closes the pipe
      ChildReport r;
      try {
        const auto stats = jit::cache_stats();
        const auto cubin = jit::get_cubin(request, kArch);
        r.compiles = jit::cache_stats().compiles - stats.compiles;
        r.disk_hits = jit::cache_stats().disk_hits - stats.disk_hits;
        r.cubin_hash = jit::fnv1a(cubin.data(), cubin.size());
        r.cubin_size = cubin.size();
      } catch (...) {
      }
      (void)!write(reports[1], &r, sizeof r);  // one small write: atomic on a pipe
      _exit(0);
    }
    children.push_back(child);
  }
  close(go[0]);
  close(reports[1]);
  close(go[1]);  // start them all at once, each with a cold cache
  int total_compiles = 0, total_disk_hits = 0;
  std::vector<ChildReport> got;
  ChildReport r;
  while (read(reports[0], &r, sizeof r) == static_cast<ssize_t>(sizeof r)) got.push_back(r);
  close(reports[0]);
  for (pid_t child : children) {
    int status = 0;
    waitpid(child, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  }
  ASSERT_EQ(got.size(), static_cast<size_t>(kProcesses));
  const auto& fresh = fresh_cubin();
  for (const auto& c : got) {
    total_compiles += c.compiles;
    total_disk_hits += c.disk_hits;
    EXPECT_EQ(c.cubin_size, fresh.size());
    EXPECT_EQ(c.cubin_hash, jit::fnv1a(fresh.data(), fresh.size()));
  }
  EXPECT_EQ(total_compiles, 1);
  EXPECT_EQ(total_disk_hits, kProcesses - 1);
  // One entry and its lock file; no temp file left; the lock file is not listed as an entry.
  int entries = 0, locks = 0, others = 0;
  for (const auto& e : fs::directory_iterator(dir_ / "cubin")) {
    const std::string name = e.path().filename();
    if (name.size() > 6 && name.substr(name.size() - 6) == ".cubin") ++entries;
    else if (name.size() > 5 && name.substr(name.size() - 5) == ".lock") ++locks;
    else ++others;
  }
  EXPECT_EQ(entries, 1);
  EXPECT_EQ(locks, 1);
  EXPECT_EQ(others, 0);
  const auto listed = jit::list_cache_entries();
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].path, jit::cache_entry_path(request, kArch));
  EXPECT_EQ(listed[0].arch, kArch);
  EXPECT_EQ(listed[0].kernel.rfind(small_request().function + "<", 0), 0u) << listed[0].kernel;
  EXPECT_EQ(listed[0].problem, "");
}

TEST_F(CubinCache, ForceRecompileIgnoresMemoryAndDiskAndRepublishes) {
  const auto request = small_request();
  const auto path = jit::cache_entry_path(request, kArch);
  EXPECT_EQ(jit::get_cubin(request, kArch), fresh_cubin());
  struct stat published {};
  ASSERT_EQ(stat(path.c_str(), &published), 0);

  setenv("DITOPS_JIT_FORCE_RECOMPILE", "1", 1);
  reload_config();
  ASSERT_TRUE(config().jit_force_recompile);
  const auto before = jit::cache_stats();
  EXPECT_EQ(jit::get_cubin(request, kArch), fresh_cubin());  // in memory and on disk, compiled anyway
  const auto after = jit::cache_stats();
  EXPECT_EQ(after.compiles - before.compiles, 1);
  EXPECT_EQ(after.memory_hits - before.memory_hits, 0);
  EXPECT_EQ(after.disk_hits - before.disk_hits, 0);
  struct stat republished {};
  ASSERT_EQ(stat(path.c_str(), &republished), 0);
  EXPECT_NE(republished.st_ino, published.st_ino) << "the entry was not republished by rename";

  unsetenv("DITOPS_JIT_FORCE_RECOMPILE");
  reload_config();
  jit::clear_memory_cache();
  EXPECT_EQ(jit::get_cubin(request, kArch), fresh_cubin());
  EXPECT_EQ(jit::cache_stats().disk_hits - after.disk_hits, 1);  // the republished entry is valid
}

TEST_F(CubinCache, DirectoryAtEntryPathIsAMissServedFromMemory) {
  const auto path = jit::cache_entry_path(small_request(), kArch);
  fs::create_directories(fs::path(path) / "inside");
  alarm(60);
  expect_compiled_then_served_from_memory();
  EXPECT_EQ(warnings_with(path + " is a directory").size(), 1u) << all_warnings();
  EXPECT_TRUE(fs::is_directory(path));  // not ours to remove
}

TEST_F(CubinCache, FifoAtEntryPathDoesNotHangAndIsReplaced) {
  const auto path = jit::cache_entry_path(small_request(), kArch);
  fs::create_directories(dir_ / "cubin");
  ASSERT_EQ(mkfifo(path.c_str(), 0644), 0);
  alarm(60);  // a blocking open of the FIFO would stop here
  expect_compiled_then_served_from_memory();
  EXPECT_EQ(warnings_with(path + " is a FIFO").size(), 1u) << all_warnings();
  // The published entry took the FIFO's place.
  EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(path)));
}

TEST_F(CubinCache, SymlinkToDevZeroAtEntryPathIsNotFollowed) {
  const auto path = jit::cache_entry_path(small_request(), kArch);
  fs::create_directories(dir_ / "cubin");
  fs::create_symlink("/dev/zero", path);
  alarm(60);  // following the link would read without end
  expect_compiled_then_served_from_memory();
  EXPECT_EQ(warnings_with(path + " is a symbolic link").size(), 1u) << all_warnings();
  EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(path)));  // the link itself was replaced
}

TEST_F(CubinCache, OversizedFileAtEntryPathIsNotRead) {
  const auto path = jit::cache_entry_path(small_request(), kArch);
  fs::create_directories(dir_ / "cubin");
  { std::ofstream(path).put('x'); }
  fs::resize_file(path, uintmax_t{1} << 32);  // sparse: 4 GiB that must not be read
  alarm(60);
  expect_compiled_then_served_from_memory();
  EXPECT_EQ(warnings_with(path + " is 4294967296 bytes").size(), 1u) << all_warnings();
}

TEST_F(CubinCache, UnwritableCacheDirectoryWarnsOnceAndServesFromMemory) {
  // A file where the cubin directory should be: no entry, lock or temp file can be created, for
  // root as well (these tests may run as root, where permission bits do not stop writes).
  fs::create_directories(dir_);
  { std::ofstream(dir_ / "cubin") << "not a directory"; }
  const auto path = jit::cache_entry_path(small_request(), kArch);
  alarm(60);
  expect_compiled_then_served_from_memory();
  const auto published = warnings_with("could not publish the cubin to the cache at " + path);
  ASSERT_EQ(published.size(), 1u) << all_warnings();
  EXPECT_NE(published[0].find("Not a directory"), std::string::npos) << published[0];
  // Another miss of the same key in this process does not warn again.
  jit::clear_memory_cache();
  EXPECT_EQ(jit::get_cubin(small_request(), kArch), fresh_cubin());
  EXPECT_EQ(warnings_with("could not publish").size(), 1u) << all_warnings();
}

TEST_F(CubinCache, ReadOnlyCacheDirectoryWarnsWithTheReason) {
  if (geteuid() == 0) GTEST_SKIP() << "root writes through permission bits";
  fs::create_directories(dir_ / "cubin");
  fs::permissions(dir_ / "cubin", fs::perms::owner_read | fs::perms::owner_exec);
  const auto path = jit::cache_entry_path(small_request(), kArch);
  alarm(60);
  expect_compiled_then_served_from_memory();
  const auto published = warnings_with("could not publish the cubin to the cache at " + path);
  ASSERT_EQ(published.size(), 1u) << all_warnings();
  EXPECT_NE(published[0].find("Permission denied"), std::string::npos) << published[0];
}

std::string run_cli(const std::string& args, int* status) {
  std::string out;
  FILE* pipe = popen((std::string(DITOPS_CLI_PATH) + " " + args + " 2>&1").c_str(), "r");
  if (!pipe) return out;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, pipe)) > 0;) out.append(buf, n);
  *status = pclose(pipe);
  return out;
}

TEST_F(CubinCache, CliListShowsEntriesAndClearRemovesEntriesAndLocksOnly) {
  const auto request = small_request();
  jit::get_cubin(request, kArch);
  const auto path = jit::cache_entry_path(request, kArch);
  const auto bytes = fs::file_size(path);
  { std::ofstream(dir_ / "cubin" / "notes.txt") << "not ours"; }
  alarm(60);

  int status = -1;
  const std::string list = run_cli("cache list", &status);
  EXPECT_EQ(status, 0) << list;
  EXPECT_NE(list.find(path), std::string::npos) << list;
  EXPECT_NE(list.find(kArch), std::string::npos) << list;
  EXPECT_NE(list.find(std::to_string(bytes)), std::string::npos) << list;
  EXPECT_NE(list.find("1 entry, " + std::to_string(bytes) + " bytes"), std::string::npos) << list;
  EXPECT_EQ(list.find(".lock"), std::string::npos) << list;
  EXPECT_EQ(list.find("notes.txt"), std::string::npos) << list;

  const std::string clear = run_cli("cache clear", &status);
  EXPECT_EQ(status, 0) << clear;
  EXPECT_NE(clear.find("removed 1 entry, 1 lock file and 0 temp files"), std::string::npos) << clear;
  EXPECT_NE(clear.find("freed " + std::to_string(bytes) + " bytes"), std::string::npos) << clear;
  EXPECT_FALSE(fs::exists(path));
  EXPECT_FALSE(fs::exists(path + ".lock"));
  EXPECT_TRUE(fs::exists(dir_ / "cubin" / "notes.txt"));  // not ours: left alone
}

}  // namespace
}  // namespace ditops
