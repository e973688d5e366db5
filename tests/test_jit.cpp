// JIT without a GPU: every template key of the test grid compiles with NVRTC for sm_90a, sm_100a
// and sm_120a; the cubin cache (memory, disk, two processes, corruption, source hash).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>

#include "ditops/registry.h"
#include "ditops/qknorm_rope.h"
#include "jit/index_check.h"
#include "jit/jit.h"
#include "test_util.h"
#include "ops/qknorm_rope/qknorm_rope_kernels.h"
#include "tools/read_bandwidth.h"

namespace ditops {
namespace {

bool nvrtc_present() { return jit::nvrtc_version() > 0; }

// Every key the GPU test grid and the benchmark use.
std::vector<QkKernelKey> grid_keys() {
  std::vector<QkKernelKey> keys;
  for (int D : {64, 128, 256})
    for (int R : {D, D / 2, 32})
      for (bool neox : {false, true}) {
        if (R > D || (neox && R % 16)) continue;
        QkKernelKey k;
        k.head_dim = D;
        k.rope_dim = R;
        k.neox = neox;
        keys.push_back(k);
      }
  // Dtype, cache, position, mode and layout variants at D = 128.
  for (DType act : {DType::bf16, DType::f16})
    for (DType cache : {DType::f32, act})
      for (bool full : {false, true})
        for (QkRounding rounding : {QkRounding::rounded, QkRounding::fp32})
          for (QkNormOrder order : {QkNormOrder::aten, QkNormOrder::warp}) {
            QkKernelKey k;
            k.act = act;
            k.cache = cache;
            k.full_width = full;
            k.rounding = rounding;
            k.order = order;
            k.neox = full;  // cover both pairings without doubling the count
            keys.push_back(k);
          }
  QkKernelKey k;
  k.pos = DType::i32;
  k.pdl = false;
  k.aligned = false;
  keys.push_back(k);
  k.order = QkNormOrder::warp;
  k.head_dim = 256;
  k.rope_dim = 256;
  keys.push_back(k);
  k.head_dim = 64;
  k.rope_dim = 64;
  keys.push_back(k);
  // diffusers' RMSNorm chain (aten_mean order, weight rounding twice) and MochiRMSNorm's (once),
  // both head dims, both dtypes; twice with the other orders; a 16-bit cache, unaligned, no PDL.
  for (DType act : {DType::bf16, DType::f16})
    for (int D : {64, 128})
      for (QkNormWeightRounding weight_rounding : {QkNormWeightRounding::twice, QkNormWeightRounding::once}) {
        QkKernelKey m;
        m.act = act;
        m.head_dim = m.rope_dim = D;
        m.neox = D == 64;
        m.full_width = D == 128;
        m.order = QkNormOrder::aten_mean;
        m.weight_rounding = weight_rounding;
        keys.push_back(m);
      }
  // Qwen-Image's chain: aten_mean, twice, the complex product (interleaved, compact fp32 cache).
  QkKernelKey qwen;
  qwen.order = QkNormOrder::aten_mean;
  qwen.weight_rounding = QkNormWeightRounding::twice;
  qwen.complex_product = true;
  keys.push_back(qwen);
  qwen.act = DType::f16;
  qwen.rope_dim = 64;
  qwen.aligned = false;
  keys.push_back(qwen);
  for (int D : {128, 256})
    for (QkNormOrder order : {QkNormOrder::aten, QkNormOrder::warp}) {
      QkKernelKey m;
      m.head_dim = m.rope_dim = D;
      m.order = order;
      m.weight_rounding = QkNormWeightRounding::twice;
      keys.push_back(m);
    }
  QkKernelKey unaligned;
  unaligned.head_dim = unaligned.rope_dim = 64;
  unaligned.cache = DType::bf16;
  unaligned.pos = DType::i32;
  unaligned.order = QkNormOrder::aten_mean;
  unaligned.weight_rounding = QkNormWeightRounding::twice;
  unaligned.pdl = false;
  unaligned.aligned = false;
  keys.push_back(unaligned);
  for (const auto& p : qk_prebuilt_keys()) keys.push_back(p);
  return keys;
}

class JitCache : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!nvrtc_present()) GTEST_SKIP() << "NVRTC not loadable here";
    dir_ = std::filesystem::temp_directory_path() /
           ("ditops-cache-test-" + std::to_string(getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    setenv("DITOPS_CACHE_DIR", dir_.c_str(), 1);
    reload_config();
    jit::clear_memory_cache();
  }
  void TearDown() override {
    std::filesystem::remove_all(dir_);
    unsetenv("DITOPS_CACHE_DIR");
    reload_config();
  }
  std::filesystem::path dir_;
};

TEST(JitCompile, EveryGridKeyCompilesForEveryTargetArch) {
  if (!nvrtc_present()) GTEST_SKIP() << "NVRTC not loadable here";
  const auto keys = grid_keys();
  int compiled = 0;
  for (const char* arch : {"sm_90a", "sm_100a", "sm_120a"}) {
    for (const auto& key : keys) {
      const auto request = qk_kernel_request(key);
      std::vector<uint8_t> cubin;
      ASSERT_NO_THROW(cubin = jit::nvrtc_compile(jit::wrapper_source(request, "ditops_entry"),
                                                 "ditops_jit_entry.cu", arch, jit::embedded_sources()))
          << key.to_string() << " for " << arch;
      ASSERT_GT(cubin.size(), 1000u) << key.to_string();
      // An ELF image.
      EXPECT_EQ(cubin[0], 0x7f);
      EXPECT_EQ(cubin[1], 'E');
      ++compiled;
    }
  }
  std::printf("compiled %d (key, arch) pairs\n", compiled);
}

// Ops whose kernel family lists variant keys (KernelSpec::variants) are compiled here, so a new op
// needs no edit of this file.
TEST(JitCompile, EveryRegisteredVariantCompilesForEveryTargetArch) {
  if (!nvrtc_present()) GTEST_SKIP() << "NVRTC not loadable here";
  int compiled = 0;
  for (const KernelSpec* spec : Registry::global().list()) {
    if (!spec->variants) continue;
    for (const auto& request : spec->variants())
      for (const char* arch : {"sm_90a", "sm_100a", "sm_120a"}) {
        std::vector<uint8_t> cubin;
        ASSERT_NO_THROW(cubin = jit::nvrtc_compile(jit::wrapper_source(request, "ditops_entry"),
                                                   "ditops_jit_entry.cu", arch, jit::embedded_sources()))
            << spec->name << " " << request.template_key << " for " << arch;
        EXPECT_GT(cubin.size(), 1000u) << request.template_key;
        ++compiled;
      }
  }
  std::printf("compiled %d (variant, arch) pairs\n", compiled);
}

// Checked mode's kernel (DITOPS_CHECK=1) is no op's implementation: compiled here.
TEST(JitCompile, IndexCheckKernelCompilesForEveryTargetArch) {
  if (!nvrtc_present()) GTEST_SKIP() << "NVRTC not loadable here";
  for (const auto& request : jit::index_check_requests())
    for (const char* arch : {"sm_90a", "sm_100a", "sm_120a"}) {
      std::vector<uint8_t> cubin;
      ASSERT_NO_THROW(cubin = jit::nvrtc_compile(jit::wrapper_source(request, "ditops_entry"),
                                                 "ditops_jit_entry.cu", arch, jit::embedded_sources()))
          << request.template_key << " for " << arch;
      EXPECT_GT(cubin.size(), 1000u) << request.template_key;
    }
}

// The benchmarks' read-bandwidth kernel (the read roof of GEMM/GEMV benchmarks), compiled here too.
TEST(JitCompile, ReadBandwidthKernelCompilesForEveryTargetArch) {
  if (!nvrtc_present()) GTEST_SKIP() << "NVRTC not loadable here";
  const KernelRequest request = cli::read_bandwidth_request();
  for (const char* arch : {"sm_90a", "sm_100a", "sm_120a"}) {
    std::vector<uint8_t> cubin;
    ASSERT_NO_THROW(cubin = jit::nvrtc_compile(jit::wrapper_source(request, "ditops_entry"), "ditops_jit_entry.cu",
                                               arch, jit::embedded_sources()))
        << request.template_key << " for " << arch;
    EXPECT_GT(cubin.size(), 1000u) << request.template_key;
  }
}

// DITOPS_CHECK through config(): "1" on, unset or "0" off, anything else off with a warning.
TEST(CheckedMode, EnvironmentValues) {
  test_util::ScopedEnv env("DITOPS_CHECK", nullptr);
  EXPECT_FALSE(config().checked);
  env.set("0");
  EXPECT_FALSE(config().checked);
  env.set("1");
  EXPECT_TRUE(config().checked);
  EXPECT_TRUE(jit::checked_mode());
  env.set("yes");
  EXPECT_FALSE(config().checked);
  ASSERT_EQ(config().problems.size(), 1u);
  EXPECT_EQ(config().problems[0], "DITOPS_CHECK='yes' is not 0 or 1; checked mode is off");
}

// On the CPU, positions are host memory and the reference checks them whatever the mode; checked
// mode adds no device work there (no driver is touched on this machine).
TEST(CheckedMode, CpuCallsKeepTheHostCheck) {
  test_util::ScopedEnv env("DITOPS_CHECK", "1");
  std::vector<uint16_t> q(2 * 64, 0x3F80), k(2 * 64, 0x3F80), w(64, 0x3F80);
  std::vector<float> cache(4 * 64, 0.0f);
  std::vector<int64_t> pos{1, 4};
  const Device cpu{DeviceKind::cpu, 0};
  const std::string message = test_util::error_of([&] {
    qknorm_rope(TensorView::contiguous(q.data(), DType::bf16, cpu, {2, 1, 64}),
                TensorView::contiguous(k.data(), DType::bf16, cpu, {2, 1, 64}),
                TensorView::contiguous(w.data(), DType::bf16, cpu, {64}),
                TensorView::contiguous(w.data(), DType::bf16, cpu, {64}),
                TensorView::contiguous(cache.data(), DType::f32, cpu, {4, 64}),
                TensorView::contiguous(pos.data(), DType::i64, cpu, {2}));
  });
  EXPECT_NE(message.find("positions"), std::string::npos) << message;
  EXPECT_EQ(message.find("DITOPS_CHECK"), std::string::npos) << message;
}

TEST(JitCompile, CompileErrorCarriesTheNvrtcLog) {
  if (!nvrtc_present()) GTEST_SKIP() << "NVRTC not loadable here";
  try {
    jit::nvrtc_compile("__global__ void broken() { this_is_not_cuda; }", "broken.cu", "sm_90a", {});
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("this_is_not_cuda"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("broken.cu"), std::string::npos) << e.what();
  }
}

TEST(JitCompile, InvalidTemplateKeyFailsToCompileWithStaticAssert) {
  if (!nvrtc_present()) GTEST_SKIP() << "NVRTC not loadable here";
  QkKernelKey bad;
  bad.neox = true;
  bad.rope_dim = 24;  // not a multiple of 16: the kernel's static_assert must fire
  const auto request = qk_kernel_request(bad);
  EXPECT_THROW(jit::nvrtc_compile(jit::wrapper_source(request, "e"), "bad", "sm_90a", jit::embedded_sources()),
               Error);
}

TEST_F(JitCache, MemoryThenDiskThenRecompileOnSourceChange) {
  QkKernelKey key;
  const auto request = qk_kernel_request(key);
  const auto before = jit::cache_stats();
  const auto a = jit::get_cubin(request, "sm_90a");
  const auto b = jit::get_cubin(request, "sm_90a");
  EXPECT_EQ(a, b);
  auto after = jit::cache_stats();
  EXPECT_EQ(after.compiles - before.compiles, 1);
  EXPECT_EQ(after.memory_hits - before.memory_hits, 1);
  EXPECT_TRUE(std::filesystem::exists(jit::cache_entry_path(request, "sm_90a")));

  jit::clear_memory_cache();
  const auto c = jit::get_cubin(request, "sm_90a");
  EXPECT_EQ(a, c);
  EXPECT_EQ(jit::cache_stats().disk_hits - after.disk_hits, 1);

  // Another arch and another key are separate entries.
  jit::get_cubin(request, "sm_120a");
  EXPECT_NE(jit::cache_entry_path(request, "sm_90a"), jit::cache_entry_path(request, "sm_120a"));
  // A changed source (here: a different template argument list, standing for an edited header)
  // maps to a different entry; the source hash is part of every key.
  auto other = request;
  other.template_args += " ";
  EXPECT_NE(jit::cache_entry_path(request, "sm_90a"), jit::cache_entry_path(other, "sm_90a"));
}

TEST_F(JitCache, CorruptOrTruncatedEntryIsDetectedAndRebuilt) {
  QkKernelKey key;
  const auto request = qk_kernel_request(key);
  const auto good = jit::get_cubin(request, "sm_90a");
  const auto path = jit::cache_entry_path(request, "sm_90a");
  for (int variant = 0; variant < 3; ++variant) {
    {
      std::string blob;
      {
        std::ifstream in(path, std::ios::binary);
        blob.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
      }
      ASSERT_GT(blob.size(), 100u);
      if (variant == 0) blob.resize(blob.size() / 2);     // truncated
      if (variant == 1) blob[blob.size() - 10] ^= 0x5a;   // flipped payload byte
      if (variant == 2) blob[0] = 'X';                    // bad magic
      std::ofstream out(path, std::ios::binary | std::ios::trunc);
      out << blob;
    }
    jit::clear_memory_cache();
    const auto stats = jit::cache_stats();
    const auto rebuilt = jit::get_cubin(request, "sm_90a");
    EXPECT_EQ(rebuilt, good) << "variant " << variant;
    EXPECT_EQ(jit::cache_stats().corrupt_rebuilt - stats.corrupt_rebuilt, 1) << "variant " << variant;
    EXPECT_EQ(jit::cache_stats().compiles - stats.compiles, 1) << "variant " << variant;
  }
}

TEST_F(JitCache, TwoProcessesCompilingOneKeyBothSucceedAndLeaveOneValidEntry) {
  QkKernelKey key;
  key.head_dim = 64;
  key.rope_dim = 64;
  const auto request = qk_kernel_request(key);
  pid_t children[2];
  for (pid_t& child : children) {
    child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      try {
        const auto cubin = jit::get_cubin(request, "sm_90a");
        _exit(cubin.size() > 1000 ? 0 : 3);
      } catch (...) {
        _exit(4);
      }
    }
  }
  for (pid_t child : children) {
    int status = 0;
    waitpid(child, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  }
  // One entry beside its lock file, no temp files left, and the entry loads from disk without a
  // compile.
  int entries = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir_ / "cubin")) {
    if (e.path().extension() == ".lock") continue;
    ++entries;
    EXPECT_EQ(e.path().extension(), ".cubin") << e.path();
  }
  EXPECT_EQ(entries, 1);
  const auto stats = jit::cache_stats();
  jit::get_cubin(request, "sm_90a");
  EXPECT_EQ(jit::cache_stats().disk_hits - stats.disk_hits, 1);
  EXPECT_EQ(jit::cache_stats().compiles - stats.compiles, 0);
}

// Timing of a first compile and of a warm disk load (printed, never asserted: CI machines vary).
TEST_F(JitCache, JitTimingFirstCompileAndWarmDiskLoad) {
  QkKernelKey key;
  key.neox = true;
  const auto request = qk_kernel_request(key);
  const std::string arch = "sm_90a";
  auto t0 = std::chrono::steady_clock::now();
  jit::get_cubin(request, arch);
  auto t1 = std::chrono::steady_clock::now();
  jit::clear_memory_cache();
  jit::get_cubin(request, arch);
  auto t2 = std::chrono::steady_clock::now();
  std::printf("JIT first compile: %.1f ms; warm disk-cache load: %.3f ms (%s)\n",
              std::chrono::duration<double, std::milli>(t1 - t0).count(),
              std::chrono::duration<double, std::milli>(t2 - t1).count(), request.template_key.c_str());
}

// A kernel key's number: a digit per field, so keys that differ in any field differ; a digit at
// its bound (a field the key's bounds do not cover) or bounds past 64 bits throw.
TEST(KernelKey, PackedDigitsAreDistinctAndBoundsAreChecked) {
  EXPECT_EQ(pack_key({true, {DType::f16, 9}, {3, 4}}), (1 * 9 + 1) * 4 + 3);
  EXPECT_NE(pack_key({{1, 4}, {0, 4}}), pack_key({{0, 4}, {1, 4}}));
  EXPECT_EQ(pack_key({DType::i64}), static_cast<uint64_t>(DType::i64));
  try {
    pack_key({true, {4, 4}});
    ADD_FAILURE() << "a digit at its bound packed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("digit 1 is 4, not below its bound 4"), std::string::npos) << e.what();
  }
  EXPECT_THROW(pack_key({{-1, 512}}), Error);  // a negative field wraps to a huge digit: refused
  std::initializer_list<KeyDigit> wide = {{0, uint64_t{1} << 40}, {0, uint64_t{1} << 30}};
  EXPECT_THROW(pack_key(wide), Error);
}

TEST(KernelKey, TemplateArgumentsAreSpelledAsTheKernelsDo) {
  EXPECT_EQ(jit::kernel_args(DType::bf16, true, 128, "ditops::kQkSumAten", false, DType::i64),
            "ditops::kernel::bf16, true, 128, ditops::kQkSumAten, false, long long");
  EXPECT_EQ(jit::kernel_args(), "");
  EXPECT_EQ(jit::kernel_args(std::string("x")), "x");
}

// A template key names one kernel instance: the prebuilt table is looked up by it alone, so two
// requests with one key and other template arguments (or bounds) would load the wrong kernel.
TEST(KernelKey, EveryTemplateKeyNamesOneInstance) {
  std::map<std::string, std::string> instance_of;
  int requests = 0;
  for (const KernelSpec* spec : Registry::global().list())
    for (const auto* listing : {&spec->variants, &spec->prebuilt}) {
      if (!*listing) continue;
      for (const KernelRequest& r : (*listing)()) {
        const std::string instance = r.header + "|" + r.function + "<" + r.template_args + ">|" + r.params_type + "|" +
                                     std::to_string(r.max_threads) + "," + std::to_string(r.min_blocks);
        const auto [it, fresh] = instance_of.emplace(r.template_key, instance);
        EXPECT_TRUE(fresh || it->second == instance)
            << spec->name << ": " << r.template_key << " names " << it->second << " and " << instance;
        ++requests;
      }
    }
  EXPECT_GT(requests, 100);
}

TEST(AotTable, EveryPrebuiltKeyIsInTheEmbeddedTable) {
  const auto& entries = jit::aot_entries();
  if (entries.empty()) GTEST_SKIP() << "built without prebuilt kernels";
  for (const auto& key : qk_prebuilt_keys())
    EXPECT_NE(jit::find_aot(qk_kernel_request(key).template_key), nullptr) << key.to_string();
}

}  // namespace
}  // namespace ditops
