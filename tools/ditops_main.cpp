// The ditops command-line tool: list, explain, info, demo, bench.
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <sstream>

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <utility>

#include "core/device.h"
#include "ditops/op.h"
#include "jit/cuda_driver.h"
#include "jit/jit.h"
#include "tools/bench_common.h"
#include "tools/table_call.h"

namespace ditops::cli {

int64_t int_flag(const Args& args, const std::string& command, const std::string& flag, int64_t fallback, int64_t lo,
                 int64_t hi, const std::string& what) {
  if (!args.has(flag)) return fallback;
  const std::string text = args.get(flag, "");
  const size_t digits = text.rfind('-', 0) == 0 ? 1 : 0;
  bool ok = text.size() > digits && text.size() <= digits + 18 &&
            text.find_first_not_of("0123456789", digits) == std::string::npos;
  const int64_t v = ok ? std::stoll(text) : 0;
  ok = ok && v >= lo && v <= hi;
  if (!ok)
    throw Error(command + ": " + flag + " must be an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                "]" + (what.empty() ? "" : " (" + what + ")") + " but is '" + text + "'");
  return v;
}

namespace {

constexpr const char* kUsage = R"(usage: ditops <command> [options]      (ditops --help, -h; ditops --version)

  list [--keys]                 every op x implementation: provenance, capabilities, contract,
                                availability on this machine (--keys: the prebuilt template keys)
  ops [<op> ..]                 every op's (or the named ops') description: tensors, options
                                with defaults (--is-neox and --is_neox are the same flag), dims
  explain <op> [--shape N,N,..] [--dims NAME=N,..] [--dtype TENSOR=DT,..] [--with T,..]
          [--without T,..] [--<option> VALUE ..] [--device cpu|cuda:N] [--backend B] [--quality Q]
          [--sm SM [--sms N]]
                                the dispatch reasoning for one call of any op, without running
                                it; sizes default to the op's example dims (`ditops ops`);
                                --sm 90: on a simulated sm_90 device with N SMs (default 132),
                                on any machine (the driver is taken as present)
  info                          devices, SM, driver, NVRTC, cache directory
  cache list|clear              the cubin cache: entries (path, arch, size), total / remove entries, locks
  demo                          FLUX-sized QK norm + RoPE: on a GPU the best backend, its output
                                compared with the CPU reference's; without a GPU the CPU
                                reference alone (the README's first command)
  bench <op> [--reps N (1..100000, default 50)] [--json PATH] [--commit SHA]
          [--host-only (qknorm_rope)]
                                model shapes: us, GB/s, fraction of a device copy (of the read
                                roof for a GEMM/GEMV); needs a GPU (without one: exit code 3);
                                an op without a benchmark of its own takes explain's sizing
                                flags and times one call from the op table

exit codes: 0 done, 1 error, 2 usage (no or unknown command, cache or bench without its word),
3 bench without a usable CUDA GPU
)";

// A command given without the word it needs: what it takes, the usage, exit 2.
int usage_error(const std::string& what) {
  std::fprintf(stderr, "ditops %s\n%s", what.c_str(), kUsage);
  return kExitUsage;
}

// Flags that take no value; every other --flag takes exactly one.
bool is_switch(const std::string& flag) {
  return flag == "--keys" || flag == "--host-only" || flag == "--help" || flag == "--version";
}

// Option names are spelled with hyphens; an underscore is the same character (`ditops ops` prints
// the op table's option names, --is-neox for is_neox, and either spelling is accepted).
std::string flag_name(std::string s) {
  if (s == "-h") return "--help";
  std::replace(s.begin() + 2, s.end(), '_', '-');
  return s;
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    if (s.rfind("--", 0) == 0 || s == "-h") {
      const std::string flag = flag_name(s);
      if (a.has(flag) && std::find(a.repeated.begin(), a.repeated.end(), flag) == a.repeated.end())
        a.repeated.push_back(flag);
      if (is_switch(flag)) a.flags[flag] = "1";
      else if (i + 1 < argc) a.flags[flag] = argv[++i];
      else a.missing_value.push_back(flag);  // refused by require_known_flags: unknown, or no value
    } else {
      a.words.push_back(s);
    }
  }
  return a;
}

// Refuses flags the command does not know (a typo must not run the default silently), a flag given
// twice (which value was meant?), then a known flag given last without its value.
void require_known_flags(const Args& a, const std::vector<std::string>& known, const std::string& command) {
  std::string list;
  for (const auto& k : known) list += (list.empty() ? "" : " ") + k;
  auto refuse_unknown = [&](const std::string& flag) {
    if (std::find(known.begin(), known.end(), flag) != known.end()) return;
    throw Error(command + ": unknown option " + flag + (list.empty() ? " (no options)" : " (options: " + list + ")"));
  };
  for (const auto& [flag, value] : a.flags) refuse_unknown(flag);
  for (const auto& flag : a.missing_value) refuse_unknown(flag);
  if (!a.repeated.empty())
    throw Error(command + ": option " + a.repeated[0] + " is given more than once");
  if (!a.missing_value.empty()) throw Error(command + ": option " + a.missing_value[0] + " needs a value");
}

// Commands that take no further words refuse them (`ditops list extra` must not list silently).
void require_no_words(const Args& a, const std::string& command, size_t words = 1) {
  if (a.words.size() > words)
    throw Error(command + ": unexpected argument '" + a.words[words] + "' (" + command + " takes " +
                (words == 1 ? "none" : "one") + ")");
}

std::string availability_of(const KernelSpec& s) {
  std::string why = s.availability ? s.availability() : "";
  return why.empty() ? "available" : why;
}

// The output width: $COLUMNS, else the terminal's, else 100 (at least 60).
size_t output_columns() {
  if (const char* env = std::getenv("COLUMNS")) {
    const std::string text = env;
    if (!text.empty() && text.size() < 5 && text.find_first_not_of("0123456789") == std::string::npos)
      return std::clamp<size_t>(std::stoul(text), 60, 1000);
  }
  winsize ws{};
  if (isatty(STDOUT_FILENO) && ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col >= 60) return ws.ws_col;
  return 100;
}

// `text` broken at spaces into lines of at most `width` characters (a longer word is split).
std::vector<std::string> wrap(const std::string& text, size_t width) {
  std::vector<std::string> lines;
  std::string line;
  std::stringstream words(text);
  for (std::string word; words >> word;) {
    if (!line.empty() && line.size() + 1 + word.size() > width) lines.push_back(std::exchange(line, ""));
    while (word.size() > width) {
      if (!line.empty()) lines.push_back(std::exchange(line, ""));
      lines.push_back(word.substr(0, width));
      word.erase(0, width);
    }
    line += (line.empty() ? "" : " ") + word;
  }
  if (!line.empty() || lines.empty()) lines.push_back(line);
  return lines;
}

// Every column's width comes from its content; text past the output width wraps under its column.
int cmd_list(const Args& args) {
  require_known_flags(args, {"--keys"}, "list");
  const auto specs = Registry::global().list();
  const size_t columns = output_columns();
  size_t name_width = std::string("implementation").size(), prov_width = std::string("provenance").size();
  for (const KernelSpec* s : specs) {
    name_width = std::max(name_width, s->name.size());
    prov_width = std::max(prov_width, std::string(provenance_name(s->provenance)).size());
  }
  const size_t text_column = name_width + 2 + prov_width + 2;
  // Text in a third column while it leaves 30 characters there, else on lines of its own
  // indented by 4.
  const bool narrow = columns < text_column + 30;
  const size_t detail_column = narrow ? 4 : text_column;
  // `head` (at most `column` wide), then `text` wrapped at `column`.
  auto print_wrapped = [&](const std::string& head, size_t column, const std::string& text) {
    const size_t width = columns > column + 20 ? columns - column : 20;
    const auto lines = wrap(text, width);
    std::printf("%s%s%s\n", head.c_str(), std::string(column > head.size() ? column - head.size() : 0, ' ').c_str(),
                lines[0].c_str());
    for (size_t i = 1; i < lines.size(); ++i) std::printf("%s%s\n", std::string(column, ' ').c_str(), lines[i].c_str());
  };
  auto pad = [](std::string s, size_t width) { return s + std::string(width > s.size() ? width - s.size() : 0, ' '); };
  auto row = [&](const std::string& name, const std::string& provenance, const std::string& text) {
    if (!narrow) return print_wrapped(pad(name, name_width) + "  " + pad(provenance, prov_width) + "  ", text_column, text);
    std::printf("%s  %s\n", pad(name, name_width).c_str(), provenance.c_str());
    print_wrapped("", detail_column, text);
  };
  row("implementation", "provenance", "capabilities / contract, availability here, description");
  for (const KernelSpec* s : specs) {
    std::string caps;
    for (const auto& c : s->capabilities) caps += (caps.empty() ? "" : " | ") + c.describe();
    if (caps.empty()) caps = "anywhere";
    row(s->name, provenance_name(s->provenance), caps);
    print_wrapped("", detail_column, s->contract.describe());
    if (!s->contract.verification.empty()) print_wrapped("", detail_column, s->contract.verification);
    if (!s->contract.admission.empty()) print_wrapped("", detail_column, "admitted: " + s->contract.admission);
    print_wrapped("", detail_column, "here: " + availability_of(*s));
    print_wrapped("", detail_column, s->description);
    if (s->evidence)
      print_wrapped("", detail_column,
                    "evidence: " + s->evidence->shapes + "; oracle " + s->evidence->oracle + " (" +
                        s->evidence->tolerance + "); " + s->evidence->speedup + " on " + s->evidence->device + ", " +
                        s->evidence->date + " at " + s->evidence->commit);
  }
  std::printf("\nprebuilt (aot) keys: %zu\n", jit::aot_entries().size());
  if (args.has("--keys"))
    for (const auto& e : jit::aot_entries()) print_wrapped("", 2, e.template_key);
  return 0;
}

int cmd_ops(const Args& args) {
  require_known_flags(args, {}, "ops");
  std::vector<const OpDescription*> ops;
  for (size_t i = 1; i < args.words.size(); ++i) ops.push_back(&op(args.words[i]));  // throws naming the known ops
  if (ops.empty()) ops = op_descriptions();
  for (const OpDescription* d : ops) {
    std::printf("%s: %s\n  dims %s\n", d->name.c_str(), d->summary.c_str(), d->dims.c_str());
    if (d->gemm) std::printf("  a GEMM/GEMV: `ditops bench` reports the fraction of the read roof\n");
    for (const TensorSlot& t : d->tensors)
      std::printf("  tensor %-14s %-5s %-14s [%s]%s%s\n", t.name.c_str(), tensor_role_name(t.role), t.dtypes.c_str(),
                  t.shape.c_str(), t.optional ? " optional" : "", t.keyword ? " keyword" : "");
    for (const OptionSlot& o : d->options)
      std::printf("  option %-24s %-6s default %s%s\n", option_flag(o).c_str(), option_kind_name(o.kind),
                  o.default_text.c_str(), o.choices.empty() ? "" : (" (" + [&] {
                    std::string c;
                    for (const auto& x : o.choices) c += (c.empty() ? "" : "|") + x;
                    return c;
                  }() + ")").c_str());
  }
  return 0;
}

Device parse_device(const std::string& s) {
  if (s == "cpu") return {DeviceKind::cpu, 0};
  if (s == "cuda") return {DeviceKind::cuda, 0};
  if (s.rfind("cuda:", 0) == 0 && s.size() > 5 && s.size() < 9 &&
      s.find_first_not_of("0123456789", 5) == std::string::npos)
    return {DeviceKind::cuda, std::atoi(s.c_str() + 5)};
  throw Error("--device must be cpu or cuda:N but is '" + s + "'");
}

// The explain call of any op: tensors built from the op table over fake addresses (explain reads
// no memory), one after the other so that no two overlap whatever the sizes.
int cmd_explain(const Args& a) {
  std::string ops;
  for (const OpDescription* d : op_descriptions()) ops += (ops.empty() ? "" : ", ") + d->name;
  if (a.words.size() != 2) throw Error("explain: name one op (" + ops + ")");
  const OpDescription& d = op(a.words[1]);
  std::vector<std::string> known = table_call_flags(d);
  for (const char* flag : {"--device", "--sm", "--sms"}) known.push_back(flag);
  require_known_flags(a, known, "explain " + d.name);

  // --sm: a simulated CUDA device of that architecture (a machine without a GPU can explain GPU
  // dispatch); the SM count enters some template keys (residual_gate_add's tiles).
  const std::string command = "explain " + d.name;
  const int sm = static_cast<int>(int_flag(a, command, "--sm", 0, 50, 200, "compute capability major*10+minor, e.g. 90"));
  const int sms = static_cast<int>(int_flag(a, command, "--sms", 132, 1, 1024, "multiprocessors"));
  if (a.has("--sms") && !sm) throw Error(command + ": --sms is the simulated device's SM count and needs --sm");
  const Device dev = parse_device(a.get("--device", sm || jit::cuda_driver() ? "cuda:0" : "cpu"));
  if (sm && dev.kind != DeviceKind::cuda)
    throw Error(command + ": --sm simulates a CUDA device but --device is " + device_name(dev));

  __int128 next_fake = __int128{1} << 40;
  const TableCall t = table_call(d, a, dev, [&](size_t, int64_t bytes) {
    if (next_fake + bytes > (__int128{1} << 60))
      throw Error(d.name + ": the tensors of this call would take more than 2^60 bytes of address space");
    void* p = reinterpret_cast<void*>(static_cast<uintptr_t>(next_fake));
    next_fake += (bytes + 4095) / 4096 * 4096;
    return p;
  });
  if (sm) {
    std::printf("simulated device: sm_%d with %d SMs%s (no GPU is used: the CUDA driver is taken as present; "
                "NVRTC and the prebuilt kernels are this machine's)\n",
                sm, sms, a.has("--sms") ? "" : " (--sms default)");
    std::printf("%s", explain(d.name, t.call, simulated_device_info(dev, sm, sms)).format().c_str());
    return 0;
  }
  std::printf("%s", d.explain(t.call).format().c_str());
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
    if (args.has("--version")) {
      std::printf("ditops %s\n", DITOPS_VERSION);
      return 0;
    }
    if (args.has("--help") || (!args.words.empty() && args.words[0] == "help")) {
      std::printf("%s", kUsage);
      return 0;
    }
    if (args.words.empty()) {
      std::fprintf(stderr, "%s", kUsage);  // no command: a usage error
      return kExitUsage;
    }
    const std::string& cmd = args.words[0];
    if (cmd == "list") {
      require_no_words(args, "list");
      return cmd_list(args);
    }
    if (cmd == "explain") return cmd_explain(args);
    if (cmd == "ops") return cmd_ops(args);
    if (cmd == "info") {
      require_known_flags(args, {}, "info");
      require_no_words(args, "info");
      return cmd_info();
    }
    if (cmd == "cache") {
      require_known_flags(args, {}, "cache");  // `cache clear --dry-run x` must not clear
      if (args.words.size() == 1) return usage_error("cache: name what to do: 'list' or 'clear'");
      if (args.words.size() > 2) throw ditops::Error("cache: expected 'list' or 'clear' alone but got '" + args.words[2] + "'");
      return cmd_cache(args);
    }
    if (cmd == "demo") {
      require_known_flags(args, {}, "demo");
      require_no_words(args, "demo");
      return run_demo(args);
    }
    if (cmd == "bench") {
      std::string known;
      for (const ditops::OpDescription* d : ditops::op_descriptions()) known += (known.empty() ? "" : ", ") + d->name;
      if (args.words.size() == 1) return usage_error("bench: name one op, one of: " + known);
      for (const auto& [op, run] : bench_commands()) {
        if (args.words.size() == 2 && args.words[1] == op) {
          // Checked before the GPU is looked for, so a typo fails on any machine.
          std::vector<std::string> flags = {"--reps", "--json", "--commit"};
          if (op == "qknorm_rope") flags.push_back("--host-only");
          require_known_flags(args, flags, "bench " + op);
          bench_reps(args, op);
          if (args.has("--json") && args.get("--json", "").empty()) throw ditops::Error("bench " + op + ": --json needs a path");
          return run(args);
        }
      }
      // Every other described op: the generic benchmark of one call from the op table.
      if (args.words.size() == 2) {
        const ditops::OpDescription& d = ditops::op(args.words[1]);  // throws naming the known ops
        std::vector<std::string> flags = table_call_flags(d);
        for (const char* flag : {"--reps", "--json", "--commit"}) flags.push_back(flag);
        require_known_flags(args, flags, "bench " + d.name);
        bench_reps(args, d.name);
        if (args.has("--json") && args.get("--json", "").empty()) throw ditops::Error("bench " + d.name + ": --json needs a path");
        return run_table_bench(d, args);
      }
      throw ditops::Error("bench: name one op, one of: " + known);
    }
    std::fprintf(stderr, "ditops: unknown command '%s'\n%s", cmd.c_str(), kUsage);
    return kExitUsage;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ditops: error: %s\n", e.what());
    return kExitError;
  }
}
