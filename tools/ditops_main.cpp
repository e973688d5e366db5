// The ditops command-line tool: list, explain, info, demo, bench.
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <sstream>

#include "ditops/qknorm_rope.h"
#include "jit/cuda_driver.h"
#include "jit/jit.h"
#include "tools/bench_common.h"

namespace ditops::cli {
namespace {

constexpr const char* kUsage = R"(usage: ditops <command> [options]

  list [--keys]                 every op x implementation: provenance, capabilities, contract,
                                availability on this machine (--keys: the prebuilt template keys)
  explain qknorm_rope --shape T,Hq,Hk,D [--rope-dim R] [--dtype bf16|f16] [--cache-dtype f32]
          [--pos-dtype i64|i32] [--neox] [--full-width] [--rounding rounded|fp32]
          [--order aten|warp] [--device cpu|cuda:N] [--backend B] [--quality Q]
                                the dispatch reasoning for one call, without running it
  info                          devices, SM, driver, NVRTC, cache directory
  cache list|clear              the cubin cache: entries (path, arch, size), total / remove entries, locks
  demo                          FLUX-sized QK norm + RoPE on the best backend, checked against
                                the reference (the README's first command)
  bench <op> [--reps N] [--json PATH] [--commit SHA] [--host-only (qknorm_rope)]
                                model shapes: us, GB/s, fraction of a device copy (needs a GPU)
)";

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string s = argv[i];
    if (s.rfind("--", 0) == 0) {
      const bool is_switch = s == "--neox" || s == "--full-width" || s == "--keys" || s == "--host-only";
      if (!is_switch && i + 1 < argc) a.flags[s] = argv[++i];
      else if (!is_switch) throw Error("option " + s + " needs a value");
      else a.flags[s] = "1";
    } else {
      a.words.push_back(s);
    }
  }
  return a;
}

std::string availability_of(const KernelSpec& s) {
  std::string why = s.availability ? s.availability() : "";
  return why.empty() ? "available" : why;
}

int cmd_list(const Args& args) {
  const auto specs = Registry::global().list();
  std::printf("%-26s %-10s %-40s %s\n", "implementation", "provenance", "capabilities", "contract");
  for (const KernelSpec* s : specs) {
    std::string caps;
    for (const auto& c : s->capabilities) caps += (caps.empty() ? "" : " | ") + c.describe();
    if (caps.empty()) caps = "anywhere";
    std::printf("%-26s %-10s %-40s %s\n", s->name.c_str(), provenance_name(s->provenance), caps.c_str(),
                s->contract.describe().c_str());
    std::printf("%-26s   here: %s\n", "", availability_of(*s).c_str());
    std::printf("%-26s   %s\n", "", s->description.c_str());
    if (s->evidence)
      std::printf("%-26s   evidence: %s; oracle %s; %s on %s, %s\n", "", s->evidence->shapes.c_str(),
                  s->evidence->oracle.c_str(), s->evidence->speedup.c_str(), s->evidence->device.c_str(),
                  s->evidence->date.c_str());
  }
  std::printf("\nprebuilt (aot) keys: %zu\n", jit::aot_entries().size());
  if (args.has("--keys"))
    for (const auto& e : jit::aot_entries()) std::printf("  %s\n", e.template_key);
  return 0;
}

Device parse_device(const std::string& s) {
  if (s == "cpu") return {DeviceKind::cpu, 0};
  if (s.rfind("cuda", 0) == 0) return {DeviceKind::cuda, s.size() > 5 ? std::atoi(s.c_str() + 5) : 0};
  throw Error("--device must be cpu or cuda:N but is " + s);
}

DType parse_dtype_flag(const Args& a, const std::string& flag, const std::string& fallback) {
  DType d;
  const std::string v = a.get(flag, fallback);
  if (!parse_dtype(v, &d)) throw Error(flag + " must be a dtype (bf16, f16, f32, i32, i64) but is " + v);
  return d;
}

int cmd_explain(const Args& a) {
  if (a.words.size() < 2 || a.words[1] != "qknorm_rope") throw Error("explain: only qknorm_rope is registered; usage:\n" + std::string(kUsage));
  std::vector<int64_t> shape;
  std::stringstream ss(a.get("--shape", "4608,24,24,128"));
  for (std::string item; std::getline(ss, item, ',');) shape.push_back(std::stoll(item));
  if (shape.size() != 4) throw Error("--shape must be T,Hq,Hk,D");
  const int64_t T = shape[0], Hq = shape[1], Hk = shape[2], D = shape[3];
  QkNormRopeOptions opt;
  opt.is_neox = a.has("--neox");
  opt.cache_full_width = a.has("--full-width");
  const int64_t R = std::stoll(a.get("--rope-dim", std::to_string(D)));
  opt.rounding = a.get("--rounding", "rounded") == "fp32" ? QkRounding::fp32 : QkRounding::rounded;
  opt.norm_order = a.get("--order", "aten") == "warp" ? QkNormOrder::warp : QkNormOrder::aten;
  if (a.has("--backend")) {
    Provenance p;
    if (!parse_provenance(a.get("--backend", ""), &p)) throw Error("unknown --backend " + a.get("--backend", ""));
    opt.dispatch.backend = p;
  }
  if (a.has("--quality")) {
    Quality q;
    if (!parse_quality(a.get("--quality", ""), &q)) throw Error("unknown --quality " + a.get("--quality", ""));
    opt.dispatch.quality = q;
  }
  const Device dev = parse_device(a.get("--device", jit::cuda_driver() ? "cuda:0" : "cpu"));
  const DType act = parse_dtype_flag(a, "--dtype", "bf16");
  const DType cache = parse_dtype_flag(a, "--cache-dtype", "f32");
  const DType pos = parse_dtype_flag(a, "--pos-dtype", "i64");
  // Views over an aligned dummy address: explain never touches memory.
  void* fake = reinterpret_cast<void*>(uintptr_t{1} << 20);
  const int64_t width = opt.cache_full_width ? 2 * R : R;
  const auto q = TensorView::contiguous(fake, act, dev, {T, Hq, D});
  const auto k = TensorView::contiguous(fake, act, dev, {T, Hk, D});
  auto k2 = k;
  k2.data = reinterpret_cast<void*>(uintptr_t{1} << 30);
  const auto w = TensorView::contiguous(fake, act, dev, {D});
  const auto c = TensorView::contiguous(fake, cache, dev, {std::max<int64_t>(T, 1), width});
  const auto p = TensorView::contiguous(fake, pos, dev, {T});
  const QkNormRopeCall call = match_qknorm_rope(q, k2, w, w, c, p, opt);
  std::printf("%s", explain_qknorm_rope(call).format().c_str());
  return 0;
}

int cmd_info() {
  std::printf("ditops %s\n", DITOPS_VERSION);
  std::string why;
  const jit::CudaDriver* d = jit::cuda_driver(&why);
  if (!d) {
    std::printf("cuda: %s (the reference backend still works)\n", why.c_str());
  } else {
    std::printf("cuda driver: %d.%d, %d device(s)\n", d->driver_version / 1000, (d->driver_version % 1000) / 10,
                d->device_count);
    for (int i = 0; i < d->device_count; ++i) {
      const DeviceInfo& info = device_info({DeviceKind::cuda, i});
      std::printf("  cuda:%d %s sm_%d, %d SMs, features %s, jit arch %s\n", i, info.name.c_str(), info.sm,
                  info.multiprocessors, feature_names(info.features).c_str(), jit::arch_for_sm(info.sm).c_str());
    }
  }
  const int v = jit::nvrtc_version(&why);
  if (v) std::printf("nvrtc: %d.%d\n", v / 1000, (v % 1000) / 10);
  else std::printf("nvrtc: %s\n", why.c_str());
  std::printf("build toolkit headers: %s\n", DITOPS_CUDA_INCLUDE_DIR);
  std::printf("cubin cache: %s/cubin\n", config().cache_dir.c_str());
  std::printf("prebuilt kernels: %zu keys\n", jit::aot_entries().size());
  std::printf("quality: %s\n", quality_name(config().quality));
  return 0;
}

}  // namespace
}  // namespace ditops::cli

int main(int argc, char** argv) {
  using namespace ditops::cli;
  try {
    const Args args = parse(argc, argv);
    if (args.words.empty() || args.words[0] == "help" || args.has("--help")) {
      std::printf("%s", kUsage);
      return args.words.empty() ? 2 : 0;
    }
    const std::string& cmd = args.words[0];
    if (cmd == "list") return cmd_list(args);
    if (cmd == "explain") return cmd_explain(args);
    if (cmd == "info") return cmd_info();
    if (cmd == "cache") return cmd_cache(args);
    if (cmd == "demo") return run_demo(args);
    if (cmd == "bench") {
      std::string known;
      for (const auto& [op, run] : bench_commands()) {
        if (args.words.size() >= 2 && args.words[1] == op) return run(args);
        known += (known.empty() ? "" : ", ") + op;
      }
      throw ditops::Error("bench: expected one of: " + known);
    }
    std::fprintf(stderr, "unknown command '%s'\n%s", cmd.c_str(), kUsage);
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ditops: error: %s\n", e.what());
    return 1;
  }
}
