#include "ditops/registry.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <unordered_map>

#include "core/enum_name.h"
#include "core/evidence.h"
#include "core/builtin_ops.h"
#include "ditops/op.h"

namespace ditops {

// ---------------------------------------------------------------- names

const char* provenance_name(Provenance provenance) { return enumerator_name(provenance); }
bool parse_provenance(const std::string& name, Provenance* out) { return parse_enumerator(name, out); }
const char* quality_name(Quality quality) { return enumerator_name(quality); }
bool parse_quality(const std::string& name, Quality* out) { return parse_enumerator(name, out); }

std::string feature_names(uint32_t features) {
  std::string out;
  auto add = [&](uint32_t bit, const char* name) {
    if (features & bit) out += std::string(out.empty() ? "" : "+") + name;
  };
  add(kFeatureNvrtc, "nvrtc");
  add(kFeaturePdl, "pdl");
  add(kFeatureFp4Convert, "fp4cvt");
  add(kFeatureGeluTable, "gelu-table");
  return out;
}

bool Capability::admits(const DeviceInfo& info) const {
  if (info.device.kind != kind) return false;
  if (kind == DeviceKind::cuda && (info.sm < sm_min || info.sm > sm_max)) return false;
  return (info.features & required_features) == required_features;
}

std::string Capability::describe() const {
  std::string out = kind == DeviceKind::cpu ? "cpu" : "cuda";
  if (kind == DeviceKind::cuda) {
    out += " sm_" + std::to_string(sm_min);
    out += sm_max >= (1 << 20) ? "+" : "..sm_" + std::to_string(sm_max);
  }
  if (required_features) out += " +" + feature_names(required_features);
  return out;
}

std::string Contract::describe() const {
  if (kind == Kind::bit_exact) return "bit_exact vs " + oracle;
  return "close vs " + oracle + " (" + bounds + ")";
}

// ---------------------------------------------------------------- config and warnings

namespace {

std::mutex& config_mutex() {
  static std::mutex m;
  return m;
}

Config read_config() {
  Config c;
  auto env = [](const char* name) -> std::string {
    const char* v = std::getenv(name);
    return v ? v : "";
  };
  if (std::string v = env("DITOPS_FORCE_BACKEND"); !v.empty()) {
    Provenance p;
    if (parse_provenance(v, &p))
      c.force_backend = p;
    else
      c.problems.push_back("DITOPS_FORCE_BACKEND=" + v +
                           " is not a backend (kda, aot, jit, vendor, reference); ignored");
  }
  if (std::string v = env("DITOPS_QUALITY"); !v.empty()) {
    if (!parse_quality(v, &c.quality))
      c.problems.push_back("DITOPS_QUALITY=" + v +
                           " is not a quality (exact, lossless, high); using exact");
  }
  std::stringstream items(env("DITOPS_DISABLE"));
  for (std::string item; std::getline(items, item, ',');) {
    if (item.empty()) continue;
    auto colon = item.find(':');
    if (colon == std::string::npos) {
      c.disabled.emplace_back(item, std::nullopt);
      continue;
    }
    Provenance p;
    if (parse_provenance(item.substr(colon + 1), &p))
      c.disabled.emplace_back(item.substr(0, colon), p);
    else
      c.problems.push_back("DITOPS_DISABLE entry '" + item + "' names no backend; ignored");
  }
  c.jit_verbose = env("DITOPS_JIT_VERBOSE") == "1";
  c.jit_force_recompile = env("DITOPS_JIT_FORCE_RECOMPILE") == "1";
  const std::string check = env("DITOPS_CHECK");
  c.checked = check == "1";
  if (!check.empty() && check != "0" && check != "1")
    c.problems.push_back("DITOPS_CHECK='" + check + "' is not 0 or 1; checked mode is off");
  c.cache_dir = env("DITOPS_CACHE_DIR");
  if (c.cache_dir.empty()) {
    std::string xdg = env("XDG_CACHE_HOME");
    std::string home = env("HOME");
    c.cache_dir = !xdg.empty() ? xdg + "/ditops" : (!home.empty() ? home + "/.cache/ditops" : "/tmp/ditops-cache");
  }
  return c;
}

Config* g_config = nullptr;

struct WarningState {
  std::mutex mutex;
  std::set<std::string> seen;
  std::function<void(const std::string&)> sink;
};
WarningState& warnings() {
  static WarningState w;
  return w;
}

}  // namespace

const Config& config() {
  std::lock_guard<std::mutex> lock(config_mutex());
  if (!g_config) g_config = new Config(read_config());
  return *g_config;
}

namespace {
// Bumped by every change that can alter a dispatch decision; cached decisions of an older
// generation are dropped.
std::atomic<uint64_t> g_dispatch_generation{1};
}  // namespace

void reload_config() {
  g_dispatch_generation.fetch_add(1);
  std::lock_guard<std::mutex> lock(config_mutex());
  Config* fresh = new Config(read_config());
  // The old object may still be referenced by a caller mid-dispatch; it is leaked on purpose
  // (reloads are rare: tests and the CLI).
  g_config = fresh;
}

void warn_once(const std::string& key, const std::string& message) {
  auto& w = warnings();
  std::function<void(const std::string&)> sink;
  {
    std::lock_guard<std::mutex> lock(w.mutex);
    if (!w.seen.insert(key).second) return;
    sink = w.sink;
  }
  if (sink)
    sink(message);
  else
    std::fprintf(stderr, "[ditops] warning: %s\n", message.c_str());
}

void set_warning_sink(std::function<void(const std::string&)> sink) {
  std::lock_guard<std::mutex> lock(warnings().mutex);
  warnings().sink = std::move(sink);
}

void reset_warnings() {
  std::lock_guard<std::mutex> lock(warnings().mutex);
  warnings().seen.clear();
}

// ---------------------------------------------------------------- registry

struct Registry::State {
  std::vector<std::unique_ptr<KernelSpec>> specs;
  std::vector<std::unique_ptr<OpDescription>> descriptions;
  mutable std::mutex failure_mutex;
  std::map<std::string, std::string> failures;  // key -> first failure message

  // The dispatch decision cache (see Registry::dispatch).
  struct DecisionKey {
    std::string op;
    uint64_t signature;
    DeviceKind kind;
    int index, sm;
    int backend, quality;  // -1: not given
    bool operator==(const DecisionKey&) const = default;
  };
  struct DecisionHash {
    size_t operator()(const DecisionKey& k) const {
      uint64_t h = std::hash<std::string>()(k.op) ^ (k.signature * 0x9e3779b97f4a7c15ull);
      h ^= (static_cast<uint64_t>(k.kind) << 56) ^ (static_cast<uint64_t>(k.index) << 40) ^
           (static_cast<uint64_t>(k.sm) << 24) ^ (static_cast<uint64_t>(k.backend + 1) << 8) ^
           static_cast<uint64_t>(k.quality + 1);
      return static_cast<size_t>(h);
    }
  };
  std::mutex decision_mutex;
  uint64_t decision_generation = 0;
  std::unordered_map<DecisionKey, const KernelSpec*, DecisionHash> decisions;
};

Registry::Registry() : state_(std::make_unique<State>()) {}
Registry::~Registry() = default;

Registry& Registry::global() {
  static Registry* registry = [] {
    auto* r = new Registry();
    register_builtin_ops(*r);
    attach_evidence(*r);
    return r;
  }();
  return *registry;
}

void Registry::add(KernelSpec spec) {
  if (!spec.predicate || !spec.run)
    throw Error("Registry::add: " + spec.name + " needs a predicate and a run function");
  for (const auto& s : state_->specs) {
    if (s->name == spec.name) throw Error("Registry::add: " + spec.name + " is already registered");
    if (s->op == spec.op && s->call_type != spec.call_type)
      throw Error("Registry::add: " + spec.name + " takes another call type than " + s->name + " of op " + spec.op);
  }
  state_->specs.push_back(std::make_unique<KernelSpec>(std::move(spec)));
  g_dispatch_generation.fetch_add(1);
}

KernelSpec* Registry::find_mutable(const std::string& name) {
  for (auto& s : state_->specs)
    if (s->name == name) return s.get();
  return nullptr;
}

std::vector<const KernelSpec*> Registry::list(const std::string& op) const {
  std::vector<const KernelSpec*> out;
  for (const auto& s : state_->specs)
    if (op.empty() || s->op == op) out.push_back(s.get());
  // Grouped by op (in the order ops were first registered), then priority, then registration.
  const std::vector<std::string> op_order = ops();
  auto op_index = [&](const KernelSpec* s) {
    return std::find(op_order.begin(), op_order.end(), s->op) - op_order.begin();
  };
  std::stable_sort(out.begin(), out.end(), [&](const KernelSpec* a, const KernelSpec* b) {
    if (a->op != b->op) return op_index(a) < op_index(b);
    return a->provenance < b->provenance;
  });
  return out;
}

std::vector<std::string> Registry::ops() const {
  std::vector<std::string> out;
  for (const auto& s : state_->specs)
    if (std::find(out.begin(), out.end(), s->op) == out.end()) out.push_back(s->op);
  return out;
}

void Registry::describe(OpDescription description) {
  if (this->description(description.name))
    throw Error("Registry::describe: op " + description.name + " is already described");
  if (!description.run || !description.explain)
    throw Error("Registry::describe: op " + description.name + " needs run and explain");
  state_->descriptions.push_back(std::make_unique<OpDescription>(std::move(description)));
}

const OpDescription* Registry::description(const std::string& op) const {
  for (const auto& d : state_->descriptions)
    if (d->name == op) return d.get();
  return nullptr;
}

std::vector<const OpDescription*> Registry::descriptions() const {
  std::vector<const OpDescription*> out;
  for (const auto& d : state_->descriptions) out.push_back(d.get());
  return out;
}

namespace {

std::string failure_key(const DeviceInfo& device, const KernelSpec& spec, const std::string& key) {
  return device_name(device.device) + "|" + spec.op + "|" + provenance_name(spec.provenance) +
         "|" + spec.name + "|" + key;
}

// "" when the quality tier admits the implementation's contract (the reference always: it is the
// portable oracle, the last resort on the CPU).
std::string quality_refusal(const KernelSpec& spec, Quality quality) {
  if (spec.contract.kind != Contract::Kind::close || spec.provenance == Provenance::reference) return "";
  if (quality == Quality::exact)
    return "contract is close; quality exact admits only bit_exact (quality lossless adds admitted close "
           "implementations, high every close one)";
  if (quality == Quality::lossless && spec.contract.admission.empty())
    return "contract is close and not admitted (no admission record: docs/quality.md); quality lossless "
           "admits bit_exact and admitted close implementations (quality high admits every close one)";
  return "";
}

bool is_disabled(const Config& c, const KernelSpec& spec) {
  for (const auto& [op, backend] : c.disabled)
    if (op == spec.op && (!backend || *backend == spec.provenance)) return true;
  return false;
}

}  // namespace

DispatchReport Registry::explain(const std::string& op, const void* call, const DeviceInfo& device,
                                 const DispatchOptions& options) const {
  const Config& c = config();
  for (const auto& problem : c.problems) warn_once("config:" + problem, problem);
  const Quality quality = options.quality.value_or(c.quality);

  DispatchReport report;
  report.op = op;
  report.quality = quality;
  report.device = device_name(device.device) +
                  (device.device.kind == DeviceKind::cuda ? " (sm_" + std::to_string(device.sm) + ")" : "");
  std::vector<const KernelSpec*> specs = list(op);
  if (specs.empty()) throw Error("dispatch: no op named '" + op + "' is registered");

  // Evaluate every candidate once.
  struct Eval {
    const KernelSpec* spec;
    std::string refusal;  // "" = eligible
    std::string key;
    // Refused only for its contract: the lowest tier that admits it (for the report's hint).
    std::optional<Quality> admitted_at;
  };
  std::vector<Eval> evals;
  for (const KernelSpec* spec : specs) {
    Eval e{spec, "", spec->template_key ? spec->template_key(call) : ""};
    if (report.template_key.empty()) report.template_key = e.key;
    bool capable = spec->capabilities.empty();
    for (const auto& cap : spec->capabilities) capable = capable || cap.admits(device);
    if (!capable) {
      std::string caps;
      for (const auto& cap : spec->capabilities) caps += (caps.empty() ? "" : " | ") + cap.describe();
      e.refusal = "not capable on " + report.device + " (needs " + caps + ")";
    } else if (std::string why = spec->availability ? spec->availability() : ""; !why.empty()) {
      e.refusal = "unavailable: " + why;
    } else if (is_disabled(c, *spec)) {
      e.refusal = "disabled by DITOPS_DISABLE";
    } else {
      const std::string contract = quality_refusal(*spec, quality);
      if (std::string why = spec->predicate(call); !why.empty()) {
        e.refusal = why;
      } else {
        std::lock_guard<std::mutex> lock(state_->failure_mutex);
        auto it = state_->failures.find(failure_key(device, *spec, e.key));
        if (it != state_->failures.end()) e.refusal = "failed earlier for this key: " + it->second;
      }
      // Refused for its contract alone: the report can name the tier that would admit it.
      if (!contract.empty() && e.refusal.empty())
        e.admitted_at = spec->contract.admission.empty() ? Quality::high : Quality::lossless;
      if (!contract.empty()) e.refusal = contract;  // the contract is the reason shown first
    }
    evals.push_back(e);
  }

  // Order: explicit backend (strict) > forced backend (best effort) > priority.
  std::vector<const Eval*> order;
  if (options.backend) {
    for (const auto& e : evals)
      if (e.spec->provenance == *options.backend) order.push_back(&e);
  } else {
    if (c.force_backend) {
      for (const auto& e : evals)
        if (e.spec->provenance == *c.force_backend && e.refusal.empty()) order.push_back(&e);
      if (order.empty())
        warn_once("force:" + op + ":" + provenance_name(*c.force_backend),
                  std::string("DITOPS_FORCE_BACKEND=") + provenance_name(*c.force_backend) +
                      " has no eligible implementation of " + op + "; using the default order");
    }
    for (const auto& e : evals)
      if (std::find(order.begin(), order.end(), &e) == order.end()) order.push_back(&e);
  }

  for (const Eval* e : order) {
    CandidateReport r;
    r.name = e->spec->name;
    r.provenance = e->spec->provenance;
    r.eligible = e->refusal.empty();
    if (r.eligible && !report.chosen) {
      r.chosen = true;
      report.chosen = e->spec;
      r.reason = options.backend ? "requested explicitly"
                 : (c.force_backend && *c.force_backend == e->spec->provenance)
                     ? "forced by DITOPS_FORCE_BACKEND"
                     : "highest-priority eligible";
    } else if (r.eligible) {
      r.reason = "eligible (lower priority)";
    } else {
      r.reason = e->refusal;
    }
    report.candidates.push_back(r);
  }
  if (!report.chosen) {
    // The lowest tier that admits one of the candidates refused only for their contract, and the
    // first of them in this call's order at that tier.
    for (const Eval* e : order)
      if (e->admitted_at && (!report.admitting_quality || *e->admitted_at < *report.admitting_quality))
        report.admitting_quality = e->admitted_at;
    for (const Eval* e : order)
      if (report.admitting_quality && e->admitted_at && *e->admitted_at <= *report.admitting_quality) {
        report.admitting_choice = e->spec->name;
        break;
      }
  }
  if (options.backend) {
    // Show the others too, so the table is complete.
    for (const auto& e : evals)
      if (e.spec->provenance != *options.backend)
        report.candidates.push_back({e.spec->name, e.spec->provenance, false, false,
                                     std::string("not the requested backend ") +
                                         provenance_name(*options.backend)});
  }
  return report;
}

namespace {
// Records a failed run (once per device, op, provenance, template key) and warns once.
void record_failure(std::mutex& mutex, std::map<std::string, std::string>& failures, const DeviceInfo& device,
                    const KernelSpec& spec, const void* call, const std::string& device_label,
                    const std::exception& e) {
  const std::string key = spec.template_key ? spec.template_key(call) : "";
  {
    std::lock_guard<std::mutex> lock(mutex);
    failures.emplace(failure_key(device, spec, key), e.what());
  }
  g_dispatch_generation.fetch_add(1);
  warn_once("failure:" + failure_key(device, spec, key),
            spec.name + " failed on " + device_label + " (key " + key + "): " + e.what() +
                "; falling back to the next implementation");
}
}  // namespace

const KernelSpec& Registry::dispatch(const std::string& op, const void* call,
                                     const DeviceInfo& device, const DispatchOptions& options,
                                     uint64_t signature) {
  State::DecisionKey decision_key;
  if (signature != 0) {
    decision_key = {op,
                    signature,
                    device.device.kind,
                    device.device.index,
                    device.sm,
                    options.backend ? static_cast<int>(*options.backend) : -1,
                    options.quality ? static_cast<int>(*options.quality) : -1};
    const KernelSpec* cached = nullptr;
    {
      std::lock_guard<std::mutex> lock(state_->decision_mutex);
      if (state_->decision_generation != g_dispatch_generation.load()) {
        state_->decisions.clear();
        state_->decision_generation = g_dispatch_generation.load();
      }
      auto it = state_->decisions.find(decision_key);
      if (it != state_->decisions.end()) cached = it->second;
    }
    if (cached) {
      try {
        cached->run(call);
        return *cached;
      } catch (const InvalidArgument&) {
        throw;  // the caller's data, not the implementation, is at fault
      } catch (const std::exception& e) {
        if (options.backend) throw;  // explicit requests are strict
        record_failure(state_->failure_mutex, state_->failures, device, *cached, call,
                       device_name(device.device), e);
        // The full selection below now skips the failed implementation.
      }
    }
  }

  const uint64_t generation = g_dispatch_generation.load();
  DispatchReport report = explain(op, call, device, options);
  if (!report.chosen) {
    std::string msg = op + ": no eligible implementation on " + report.device;
    if (options.backend) msg += " for the requested backend " + std::string(provenance_name(*options.backend));
    for (const auto& c : report.candidates) msg += "\n  " + c.name + ": " + c.reason;
    if (report.admitting_quality)
      msg += "\n  quality " + std::string(quality_name(*report.admitting_quality)) + " would choose " +
             report.admitting_choice;
    throw NoImplementation(msg);
  }
  for (const auto& cand : report.candidates) {
    if (!cand.eligible) continue;
    const KernelSpec* spec = nullptr;
    for (const KernelSpec* s : list(op))
      if (s->name == cand.name) spec = s;
    try {
      spec->run(call);
      if (signature != 0) {
        std::lock_guard<std::mutex> lock(state_->decision_mutex);
        // Only a decision made under the current generation is remembered.
        if (generation == g_dispatch_generation.load() && state_->decision_generation == generation)
          state_->decisions[decision_key] = spec;
      }
      return *spec;
    } catch (const InvalidArgument&) {
      throw;  // the caller's data, not the implementation, is at fault
    } catch (const std::exception& e) {
      if (options.backend) throw;  // explicit requests are strict
      record_failure(state_->failure_mutex, state_->failures, device, *spec, call, report.device, e);
    }
  }
  throw NoImplementation(op + ": every eligible implementation failed on " + report.device +
                         " (see the warnings above)");
}

size_t Registry::failure_count() const {
  std::lock_guard<std::mutex> lock(state_->failure_mutex);
  return state_->failures.size();
}

void Registry::clear_failures() {
  std::lock_guard<std::mutex> lock(state_->failure_mutex);
  state_->failures.clear();
  g_dispatch_generation.fetch_add(1);
}

std::string DispatchReport::format() const {
  std::ostringstream out;
  out << "op " << op << " on " << device;
  if (!template_key.empty()) out << "  key " << template_key;
  out << "\n";
  size_t width = 4;
  for (const auto& c : candidates) width = std::max(width, c.name.size());
  for (const auto& c : candidates) {
    out << (c.chosen ? "  * " : "    ") << c.name << std::string(width - c.name.size() + 2, ' ')
        << (c.chosen ? "CHOSEN   " : c.eligible ? "eligible " : "refused  ") << c.reason << "\n";
  }
  if (!chosen && admitting_quality) {
    out << "  no eligible implementation at quality " << quality_name(quality) << "; quality "
        << quality_name(*admitting_quality) << " would choose " << admitting_choice << " (--quality "
        << quality_name(*admitting_quality) << ", quality=\"" << quality_name(*admitting_quality)
        << "\" in Python, or DITOPS_QUALITY=" << quality_name(*admitting_quality) << ")\n";
  } else if (!chosen) {
    // Not the tier: a higher one would change nothing (e.g. an instruction the device lacks).
    out << "  no eligible implementation at any quality: each is refused above for what the call or the device "
        << "lacks, not for its contract\n";
  }
  return out.str();
}

}  // namespace ditops
