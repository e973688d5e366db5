// The registry: every implementation of every op with its provenance, capabilities, numeric
// contract and predicate, and the dispatcher that picks one per call with a visible fallback.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ditops/tensor.h"

namespace ditops {

struct KernelRequest;  // a kernel instance's source: header, function, template arguments

// Where an implementation came from (never the hardware it runs on). Declaration order is the
// default priority: kda > aot > jit > vendor > reference.
enum class Provenance : uint8_t { kda, aot, jit, vendor, reference };
const char* provenance_name(Provenance provenance);
bool parse_provenance(const std::string& name, Provenance* out);

// How far from the oracle a caller accepts, named as SGLang's tiers now are (docs/quality.md):
// exact (the default) admits bit_exact implementations and the reference; lossless adds the close
// implementations that passed the admission check (error no worse than the eager chain's, no
// bias, the same NaN/Inf placement); high admits every close one.
enum class Quality : uint8_t { exact, lossless, high };
const char* quality_name(Quality quality);
bool parse_quality(const std::string& name, Quality* out);

// Device features a capability may require.
enum Feature : uint32_t {
  kFeatureNvrtc = 1u << 0,        // NVRTC could be loaded (run-time compilation possible)
  kFeaturePdl = 1u << 1,          // programmatic dependent launch (sm_90+)
  kFeatureFp4Convert = 1u << 2,   // hardware e2m1 conversion (sm_100a / sm_120a)
  kFeatureGeluTable = 1u << 3,    // fp8_rowwise_quant's GELU by table: DITOPS_GELU_TABLE=1 opts in (sm_89+) until
                                  // a model forward gains by it (docs/fp8_rowwise_quant.md)
};
std::string feature_names(uint32_t features);

// What the dispatcher knows about the device a call runs on. Filled once per device and cached
// (see device.h); tests build simulated ones.
struct DeviceInfo {
  Device device{};
  int sm = 0;                // compute capability major*10 + minor; 0 for the CPU
  uint32_t features = 0;
  int multiprocessors = 0;
  std::string name;
};

// One place an implementation can run: a device kind, an SM window [sm_min, sm_max] and required
// features. A spec's capabilities are OR-ed; an empty list means anywhere.
struct Capability {
  DeviceKind kind = DeviceKind::cpu;
  int sm_min = 0;
  int sm_max = 1 << 20;
  uint32_t required_features = 0;

  bool admits(const DeviceInfo& info) const;
  std::string describe() const;  // "cuda sm_90..sm_120 +nvrtc"
};

struct Contract {
  enum class Kind : uint8_t { bit_exact, close };
  Kind kind = Kind::bit_exact;
  std::string oracle;  // what it is compared against, e.g. "torch 2.11 eager chain on CUDA"
  std::string bounds;  // for close: the stated bound, e.g. "|d| <= 1 ulp(bf16) on <= 0.5% of elems"
  // How the contract was checked on a device: "verified: <device, method, commit>" or
  // "unverified: <why>" (per mode where modes differ). The registry test requires one of the two.
  std::string verification;
  // close only: the admission record that lets the lossless tier run it (filled from the
  // committed records, src/core/evidence_records.inc); empty: not admitted.
  std::string admission;

  static Contract bit_exact(std::string oracle) { return {Kind::bit_exact, std::move(oracle), ""}; }
  static Contract close(std::string oracle, std::string bounds) {
    return {Kind::close, std::move(oracle), std::move(bounds)};
  }
  // Contract::bit_exact(...).verified("H200, torch.equal ..., <date> at <commit>")
  Contract verified(const std::string& how) && {
    verification = "verified: " + how;
    return std::move(*this);
  }
  Contract unverified(const std::string& why) && {
    verification = "unverified: " + why;
    return std::move(*this);
  }
  std::string describe() const;
};

// Why a shape-specialized (kda) kernel is trusted: where it was validated and what it gained.
// Generated from the committed benchmark records (src/core/evidence_records.inc), never typed.
struct Evidence {
  std::string shapes;
  std::string oracle;
  std::string tolerance;
  std::string speedup;  // over a named baseline, e.g. "1.62x cuBLASLt (median over the shapes)"
  std::string device;
  std::string date;
  std::string commit;
};

// One implementation of one op, stored type-erased: `call` below is the op's own argument
// struct, which the registry never looks inside. Ops register through the typed helpers
// (src/core/implementation.h), whose functions take that struct.
struct KernelSpec {
  std::string op;
  std::string name;  // unique, e.g. "qknorm_rope.jit"
  Provenance provenance = Provenance::reference;
  std::vector<Capability> capabilities;
  Contract contract;
  std::string description;
  std::optional<Evidence> evidence;
  // Is this implementation usable on this machine at all, without compiling anything? "" if so,
  // else the reason ("CUDA driver not found"). Cheap and cached by the implementation.
  std::function<std::string()> availability;
  // "" when the implementation takes this call, else the reason. Pure: no GPU work, no compile.
  std::function<std::string(const void* call)> predicate;
  // Compile-time parameters of this call ("" when there are none): the failure-cache key.
  std::function<std::string(const void* call)> template_key;
  // Resolves lazily (memoized by the implementation) and launches. Throws on failure.
  std::function<void(const void* call)> run;
  // Identifies the call struct `call` points to; every implementation of an op has the same one.
  const void* call_type = nullptr;
  // aot only: the kernel instances the build compiles and embeds (read by ditops_aotgen).
  std::function<std::vector<KernelRequest>()> prebuilt;
  // jit: the kernel instances that cover every code path of the op, which the compile test
  // builds for every target arch (none listed: the op's own tests cover them).
  std::function<std::vector<KernelRequest>()> variants;
};

// What dispatch throws when no implementation takes a valid call, or every eligible one failed
// (try_call returns empty instead).
class NoImplementation : public Error {
 public:
  using Error::Error;
};

struct DispatchOptions {
  std::optional<Provenance> backend;  // explicit: strict, throws if ineligible
  std::optional<Quality> quality;     // default from DITOPS_QUALITY, else exact
};

struct CandidateReport {
  std::string name;
  Provenance provenance = Provenance::reference;
  bool eligible = false;
  bool chosen = false;
  std::string reason;  // why taken or refused
};

struct DispatchReport {
  std::string op;
  std::string device;
  std::string template_key;
  const KernelSpec* chosen = nullptr;
  std::vector<CandidateReport> candidates;  // in the order they were considered
  Quality quality = Quality::exact;         // the tier the call was judged at
  // When nothing is eligible and some candidates were refused only for their contract: the
  // lowest higher tier that admits one, and the implementation it would choose (empty otherwise).
  std::optional<Quality> admitting_quality;
  std::string admitting_choice;
  std::string format() const;  // a table for people
};

struct OpDescription;  // ditops/op.h

class Registry {
 public:
  Registry();
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // The process-wide registry holding every built-in op (registered on first use).
  static Registry& global();

  // Throws Error if (op, name) is already registered or the spec lacks predicate/run.
  void add(KernelSpec spec);
  // The registered implementation of that name, or null; for attaching evidence at start-up
  // (src/core/evidence.h), before any dispatch.
  KernelSpec* find_mutable(const std::string& name);
  std::vector<const KernelSpec*> list(const std::string& op = "") const;
  std::vector<std::string> ops() const;

  // The op's description (ditops/op.h), from which every binding is derived; one per op name.
  void describe(OpDescription description);
  const OpDescription* description(const std::string& op) const;  // nullptr when not described
  std::vector<const OpDescription*> descriptions() const;         // in registration order

  // Selection only: every candidate with the reason it was chosen or refused. Runs nothing.
  DispatchReport explain(const std::string& op, const void* call, const DeviceInfo& device,
                         const DispatchOptions& options = {}) const;
  // Select and run; on a failure while resolving or launching, record it per (device, op,
  // provenance, template key), warn once and fall through to the next candidate, unless the
  // backend was requested explicitly. Returns the implementation that ran.
  //
  // signature != 0 enables the decision cache: the op promises that `signature` covers everything
  // its predicates, availability and template keys read from `call` (dtypes, sizes that select a
  // kernel, alignment, flags). Calls with equal (op, signature, device, options) then reuse the
  // chosen implementation without evaluating the candidates, until the registry changes (add,
  // reload_config, a recorded failure, clear_failures). This is what keeps a call's host cost to
  // argument matching plus the launch.
  const KernelSpec& dispatch(const std::string& op, const void* call, const DeviceInfo& device,
                             const DispatchOptions& options = {}, uint64_t signature = 0);

  size_t failure_count() const;
  void clear_failures();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// Environment configuration, read once (thread-safe) and cached; reload_config() re-reads it.
struct Config {
  std::optional<Provenance> force_backend;  // DITOPS_FORCE_BACKEND
  // DITOPS_DISABLE=op[:backend],...: (op, backend or none for all backends of op)
  std::vector<std::pair<std::string, std::optional<Provenance>>> disabled;
  Quality quality = Quality::exact;  // DITOPS_QUALITY
  bool jit_verbose = false;             // DITOPS_JIT_VERBOSE=1
  // DITOPS_JIT_FORCE_RECOMPILE=1: every cubin request compiles (memory and disk entries are
  // ignored) and republishes its disk entry; for a cache suspected stale.
  bool jit_force_recompile = false;
  std::string cache_dir;                // DITOPS_CACHE_DIR, else $XDG_CACHE_HOME/ditops, ~/.cache/ditops, /tmp/ditops-cache
  // DITOPS_CHECK=1: device-resident indices are bounds-checked on the device before the op runs
  // (a launch and a synchronization per call; refused under CUDA-graph capture). docs/dispatch.md
  bool checked = false;
  std::vector<std::string> problems;    // unparseable values, warned about once
};
const Config& config();
void reload_config();

// Warnings go to stderr once per key ("[ditops] warning: ..."). A sink replaces stderr (tests).
void warn_once(const std::string& key, const std::string& message);
void set_warning_sink(std::function<void(const std::string&)> sink);
void reset_warnings();  // forget which keys have warned (tests)

}  // namespace ditops
