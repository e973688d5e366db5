// Tests of the registry and the dispatcher (src/core/registry.cpp) on SIMULATED devices: a local
// Registry filled with fake KernelSpecs whose run records which one ran. No GPU is needed.
// One test inspects the global registry's qknorm_rope entries (listing only, nothing compiles).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "core/enum_name.h"
#include "core/implementation.h"
#include "ditops/qknorm_rope.h"
#include "ditops/registry.h"
#include "jit/jit.h"

namespace {

using ditops::Capability;
using ditops::Contract;
using ditops::DeviceInfo;
using ditops::DeviceKind;
using ditops::DispatchOptions;
using ditops::DispatchReport;
using ditops::KernelSpec;
using ditops::Provenance;
using ditops::Quality;
using ditops::Registry;

constexpr const char* kOp = "fake_op";

// The op's "call" struct: the registry only passes it through as const void*.
struct FakeCall {
  int value = 0;
  bool refuse_jit = false;
  std::string key = "k0";
};

DeviceInfo cuda_sm(int sm, uint32_t features, int index = 0) {
  DeviceInfo info;
  info.device = {DeviceKind::cuda, index};
  info.sm = sm;
  info.features = features;
  info.multiprocessors = 132;
  info.name = "simulated sm_" + std::to_string(sm);
  return info;
}
DeviceInfo h200() { return cuda_sm(90, ditops::kFeaturePdl | ditops::kFeatureNvrtc); }
DeviceInfo a100() { return cuda_sm(80, ditops::kFeatureNvrtc); }
DeviceInfo rtx5090() { return cuda_sm(120, ditops::kFeatureNvrtc | ditops::kFeatureFp4Convert); }
DeviceInfo cpu() {
  DeviceInfo info;
  info.device = {DeviceKind::cpu, 0};
  info.name = "simulated cpu";
  return info;
}

Capability cuda_cap(int sm_min, int sm_max = 1 << 20, uint32_t features = 0) {
  return {DeviceKind::cuda, sm_min, sm_max, features};
}
Capability cpu_cap() { return {DeviceKind::cpu, 0, 1 << 20, 0}; }

const ditops::CandidateReport* find_candidate(const DispatchReport& report, const std::string& name) {
  for (const auto& c : report.candidates)
    if (c.name == name) return &c;
  return nullptr;
}

class RegistryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* v : kEnv) unsetenv(v);
    ditops::reload_config();
    ditops::reset_warnings();
    ditops::set_warning_sink([this](const std::string& message) {
      std::lock_guard<std::mutex> lock(mutex_);
      warnings_.push_back(message);
    });
  }
  void TearDown() override {
    for (const char* v : kEnv) unsetenv(v);
    ditops::reload_config();
    ditops::set_warning_sink(nullptr);
    ditops::reset_warnings();
  }

  // A spec that records its name into `ran_` when run.
  KernelSpec spec(const std::string& name, Provenance provenance, std::vector<Capability> caps = {},
                  Contract contract = Contract::bit_exact("oracle")) {
    KernelSpec s;
    s.op = kOp;
    s.name = name;
    s.provenance = provenance;
    s.capabilities = std::move(caps);
    s.contract = std::move(contract);
    s.predicate = [](const void*) { return std::string(); };
    s.template_key = [](const void* p) { return static_cast<const FakeCall*>(p)->key; };
    s.run = [this, name](const void*) {
      std::lock_guard<std::mutex> lock(mutex_);
      ran_.push_back(name);
    };
    return s;
  }

  // kda (sm90 only) > aot (sm90..sm120) > jit (sm80+, +nvrtc) > vendor (cuda) > reference (cpu)
  void fill_standard() {
    registry_.add(spec("fake.reference", Provenance::reference, {cpu_cap()}));
    registry_.add(spec("fake.vendor", Provenance::vendor, {cuda_cap(70)}));
    registry_.add(spec("fake.jit", Provenance::jit, {cuda_cap(80, 1 << 20, ditops::kFeatureNvrtc)}));
    registry_.add(spec("fake.aot", Provenance::aot, {cuda_cap(90, 90), cuda_cap(120, 120)}));
    registry_.add(spec("fake.kda", Provenance::kda, {cuda_cap(90, 90, ditops::kFeaturePdl)}));
  }

  std::vector<std::string> warnings() {
    std::lock_guard<std::mutex> lock(mutex_);
    return warnings_;
  }

  static constexpr const char* kEnv[] = {"DITOPS_FORCE_BACKEND", "DITOPS_DISABLE", "DITOPS_QUALITY"};
  Registry registry_;
  std::mutex mutex_;
  std::vector<std::string> ran_;
  std::vector<std::string> warnings_;
};

using DispatchTest = RegistryTest;

// ------------------------------------------------------------------ registration and listing

TEST_F(RegistryTest, ListIsInDefaultPriorityOrder) {
  fill_standard();
  std::vector<std::string> names;
  for (const KernelSpec* s : registry_.list(kOp)) names.push_back(s->name);
  EXPECT_EQ(names, (std::vector<std::string>{"fake.kda", "fake.aot", "fake.jit", "fake.vendor",
                                             "fake.reference"}));
  EXPECT_EQ(registry_.ops(), std::vector<std::string>{kOp});
  EXPECT_TRUE(registry_.list("other_op").empty());
}

TEST_F(RegistryTest, DuplicateNameRejected) {
  registry_.add(spec("fake.jit", Provenance::jit));
  try {
    registry_.add(spec("fake.jit", Provenance::aot));
    FAIL() << "duplicate accepted";
  } catch (const ditops::Error& e) {
    EXPECT_NE(std::string(e.what()).find("fake.jit is already registered"), std::string::npos) << e.what();
  }
  EXPECT_EQ(registry_.list(kOp).size(), 1u);
}

TEST_F(RegistryTest, SpecWithoutRunOrPredicateRejected) {
  KernelSpec no_run = spec("fake.norun", Provenance::jit);
  no_run.run = nullptr;
  EXPECT_THROW(registry_.add(no_run), ditops::Error);
  KernelSpec no_pred = spec("fake.nopred", Provenance::jit);
  no_pred.predicate = nullptr;
  EXPECT_THROW(registry_.add(no_pred), ditops::Error);
  EXPECT_TRUE(registry_.list(kOp).empty());
}

TEST_F(RegistryTest, UnknownOpThrows) {
  fill_standard();
  FakeCall call;
  EXPECT_THROW(registry_.explain("no_such_op", &call, h200()), ditops::Error);
  EXPECT_THROW(registry_.dispatch("no_such_op", &call, h200()), ditops::Error);
}

TEST_F(RegistryTest, NamesParseRoundTrip) {
  for (Provenance p : {Provenance::kda, Provenance::aot, Provenance::jit, Provenance::vendor,
                       Provenance::reference}) {
    Provenance back;
    ASSERT_TRUE(ditops::parse_provenance(ditops::provenance_name(p), &back));
    EXPECT_EQ(back, p);
  }
  Provenance p;
  EXPECT_FALSE(ditops::parse_provenance("nvcc", &p));
  for (Quality q : {Quality::exact, Quality::lossless, Quality::high}) {
    Quality back;
    ASSERT_TRUE(ditops::parse_quality(ditops::quality_name(q), &back));
    EXPECT_EQ(back, q);
  }
  Quality q;
  EXPECT_FALSE(ditops::parse_quality("best", &q));
  EXPECT_FALSE(ditops::parse_quality("extra-high", &q));  // SGLang's former name: refused, not guessed
  EXPECT_EQ(ditops::feature_names(ditops::kFeatureNvrtc | ditops::kFeaturePdl), "nvrtc+pdl");
  EXPECT_EQ(ditops::feature_names(0), "");
}

// An enum with a gap and a value no enumerator names: enumerator_name reads the compiler's spelling
// of each value (core/enum_name.h), so a value past its window (32) or unnamed is "?".
enum class Sparse : uint8_t { first = 0, second = 1, fifth = 4, last = 31 };

TEST(EnumeratorNames, SpelledAsDeclaredAndUnnamedValuesRefused) {
  EXPECT_STREQ(ditops::provenance_name(Provenance::vendor), "vendor");
  EXPECT_STREQ(ditops::quality_name(Quality::lossless), "lossless");
  EXPECT_STREQ(ditops::enumerator_name(Sparse::fifth), "fifth");
  EXPECT_STREQ(ditops::enumerator_name(Sparse::last), "last");
  EXPECT_STREQ(ditops::enumerator_name(static_cast<Sparse>(2)), "?");   // no enumerator
  EXPECT_STREQ(ditops::enumerator_name(static_cast<Sparse>(40)), "?");  // past the window
  Sparse back = Sparse::first;
  EXPECT_TRUE(ditops::parse_enumerator("fifth", &back));
  EXPECT_EQ(back, Sparse::fifth);
  EXPECT_FALSE(ditops::parse_enumerator("third", &back));
  EXPECT_FALSE(ditops::parse_enumerator("?", &back));
  EXPECT_EQ(back, Sparse::fifth);  // unchanged by a failed parse
  static constexpr auto kTexts = ditops::enum_texts<Sparse>(
      {{Sparse::first, "A"}, {Sparse::second, "B"}, {Sparse::fifth, "E"}, {Sparse::last, "Z"}});
  EXPECT_STREQ(kTexts(Sparse::fifth), "E");
  EXPECT_STREQ(kTexts(static_cast<Sparse>(2)), "?");
}

TEST_F(RegistryTest, CapabilityWindowsAndFeatures) {
  const Capability c = cuda_cap(90, 100, ditops::kFeaturePdl);
  EXPECT_TRUE(c.admits(h200()));
  EXPECT_FALSE(c.admits(cuda_sm(90, ditops::kFeatureNvrtc)));                // feature missing
  EXPECT_FALSE(c.admits(cuda_sm(89, ditops::kFeaturePdl)));                  // below the window
  EXPECT_TRUE(c.admits(cuda_sm(100, ditops::kFeaturePdl)));                  // upper bound inclusive
  EXPECT_FALSE(c.admits(cuda_sm(103, ditops::kFeaturePdl)));                 // above
  EXPECT_FALSE(c.admits(cpu()));                                             // wrong kind
  EXPECT_TRUE(cpu_cap().admits(cpu()));
  EXPECT_FALSE(cpu_cap().admits(h200()));
  EXPECT_EQ(c.describe(), "cuda sm_90..sm_100 +pdl");
  EXPECT_EQ(cuda_cap(80, 1 << 20, ditops::kFeatureNvrtc).describe(), "cuda sm_80+ +nvrtc");
  EXPECT_EQ(cpu_cap().describe(), "cpu");
}

TEST_F(RegistryTest, ContractDescribe) {
  EXPECT_EQ(Contract::bit_exact("torch").describe(), "bit_exact vs torch");
  EXPECT_EQ(Contract::close("torch", "1 ulp").describe(), "close vs torch (1 ulp)");
}

// ------------------------------------------------------------------ selection

TEST_F(DispatchTest, DefaultPriorityPerDevice) {
  fill_standard();
  FakeCall call;
  // sm_90 with pdl+nvrtc: everything but the reference is capable; kda wins.
  EXPECT_EQ(registry_.dispatch(kOp, &call, h200()).name, "fake.kda");
  // sm_90 without pdl: kda needs +pdl, so aot.
  EXPECT_EQ(registry_.dispatch(kOp, &call, cuda_sm(90, ditops::kFeatureNvrtc)).name, "fake.aot");
  // sm_120: aot's second (OR-ed) capability.
  EXPECT_EQ(registry_.dispatch(kOp, &call, rtx5090()).name, "fake.aot");
  // sm_80: outside aot's windows, jit has nvrtc.
  EXPECT_EQ(registry_.dispatch(kOp, &call, a100()).name, "fake.jit");
  // sm_80 without nvrtc: vendor.
  EXPECT_EQ(registry_.dispatch(kOp, &call, cuda_sm(80, 0)).name, "fake.vendor");
  // cpu: reference.
  EXPECT_EQ(registry_.dispatch(kOp, &call, cpu()).name, "fake.reference");
  EXPECT_EQ(ran_, (std::vector<std::string>{"fake.kda", "fake.aot", "fake.aot", "fake.jit",
                                            "fake.vendor", "fake.reference"}));
  // sm_70 on cuda: vendor only (jit needs sm_80).
  EXPECT_EQ(registry_.explain(kOp, &call, cuda_sm(70, ditops::kFeatureNvrtc)).chosen->name, "fake.vendor");
}

TEST_F(DispatchTest, RefusalReasonsForCapabilities) {
  fill_standard();
  FakeCall call;
  const DispatchReport r = registry_.explain(kOp, &call, a100());
  ASSERT_EQ(r.candidates.size(), 5u);
  const auto* kda = find_candidate(r, "fake.kda");
  ASSERT_NE(kda, nullptr);
  EXPECT_FALSE(kda->eligible);
  EXPECT_NE(kda->reason.find("not capable on cuda:0 (sm_80)"), std::string::npos) << kda->reason;
  EXPECT_NE(kda->reason.find("cuda sm_90..sm_90 +pdl"), std::string::npos) << kda->reason;
  const auto* aot = find_candidate(r, "fake.aot");
  ASSERT_NE(aot, nullptr);
  EXPECT_NE(aot->reason.find("cuda sm_90..sm_90 | cuda sm_120..sm_120"), std::string::npos) << aot->reason;
  const auto* jit = find_candidate(r, "fake.jit");
  ASSERT_NE(jit, nullptr);
  EXPECT_TRUE(jit->eligible);
  EXPECT_TRUE(jit->chosen);
  EXPECT_EQ(jit->reason, "highest-priority eligible");
  const auto* vendor = find_candidate(r, "fake.vendor");
  EXPECT_TRUE(vendor->eligible);
  EXPECT_FALSE(vendor->chosen);
  EXPECT_EQ(vendor->reason, "eligible (lower priority)");
  EXPECT_FALSE(find_candidate(r, "fake.reference")->eligible);
  EXPECT_EQ(r.op, kOp);
  EXPECT_EQ(r.device, "cuda:0 (sm_80)");
  EXPECT_EQ(r.template_key, "k0");
}

TEST_F(DispatchTest, EmptyCapabilityMeansAnywhere) {
  registry_.add(spec("fake.any", Provenance::vendor));
  FakeCall call;
  for (const DeviceInfo& d : {h200(), a100(), rtx5090(), cpu(), cuda_sm(50, 0, 3)})
    EXPECT_EQ(registry_.dispatch(kOp, &call, d).name, "fake.any") << d.name;
  EXPECT_EQ(ran_.size(), 5u);
}

TEST_F(DispatchTest, PredicateRefusalShownInExplain) {
  Registry local;
  KernelSpec jit = spec("fake.jit", Provenance::jit);
  jit.predicate = [](const void* p) {
    return static_cast<const FakeCall*>(p)->refuse_jit ? std::string("head_dim 96 is not supported")
                                                       : std::string();
  };
  local.add(jit);
  local.add(spec("fake.vendor", Provenance::vendor));
  FakeCall refused;
  refused.refuse_jit = true;
  const DispatchReport r = local.explain(kOp, &refused, h200());
  const auto* c = find_candidate(r, "fake.jit");
  ASSERT_NE(c, nullptr);
  EXPECT_FALSE(c->eligible);
  EXPECT_EQ(c->reason, "head_dim 96 is not supported");
  EXPECT_EQ(r.chosen->name, "fake.vendor");
  EXPECT_EQ(local.dispatch(kOp, &refused, h200()).name, "fake.vendor");
  FakeCall ok;
  EXPECT_EQ(local.dispatch(kOp, &ok, h200()).name, "fake.jit");
}

TEST_F(DispatchTest, AvailabilityRefusal) {
  KernelSpec jit = spec("fake.jit", Provenance::jit);
  jit.availability = [] { return std::string("CUDA driver not found"); };
  registry_.add(jit);
  registry_.add(spec("fake.reference", Provenance::reference));
  FakeCall call;
  const DispatchReport r = registry_.explain(kOp, &call, h200());
  EXPECT_EQ(find_candidate(r, "fake.jit")->reason, "unavailable: CUDA driver not found");
  EXPECT_EQ(r.chosen->name, "fake.reference");
}

TEST_F(DispatchTest, ExplainRunsNothing) {
  fill_standard();
  std::atomic<int> predicate_calls{0};
  KernelSpec failing = spec("fake.failing", Provenance::kda);
  failing.name = "fake.kda2";
  failing.predicate = [&](const void*) { ++predicate_calls; return std::string(); };
  failing.run = [](const void*) { throw std::runtime_error("must not run"); };
  registry_.add(failing);
  FakeCall call;
  for (const DeviceInfo& d : {h200(), a100(), cpu()}) {
    const DispatchReport r = registry_.explain(kOp, &call, d);
    EXPECT_NE(r.chosen, nullptr);
  }
  EXPECT_TRUE(ran_.empty());
  EXPECT_EQ(predicate_calls.load(), 3);
  EXPECT_EQ(registry_.failure_count(), 0u);
}

TEST_F(DispatchTest, NoEligibleImplementationThrowsWithReasons) {
  registry_.add(spec("fake.jit", Provenance::jit, {cuda_cap(80)}));
  FakeCall call;
  try {
    registry_.dispatch(kOp, &call, cpu());
    FAIL() << "dispatched on cpu";
  } catch (const ditops::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("fake_op: no eligible implementation on cpu"), std::string::npos) << msg;
    EXPECT_NE(msg.find("fake.jit: not capable on cpu"), std::string::npos) << msg;
  }
  EXPECT_TRUE(ran_.empty());
}

// ------------------------------------------------------------------ quality

TEST_F(DispatchTest, CloseContractNeedsQualityHigh) {
  registry_.add(spec("fake.jit_fp32", Provenance::jit, {}, Contract::close("oracle", "1 ulp")));
  registry_.add(spec("fake.reference", Provenance::reference, {},
                     Contract::close("oracle", "reference is always admitted")));
  FakeCall call;
  // Exact by default: the close jit is refused, the reference (even close) admitted.
  DispatchReport r = registry_.explain(kOp, &call, h200());
  EXPECT_NE(find_candidate(r, "fake.jit_fp32")->reason.find("contract is close; quality exact"),
            std::string::npos)
      << find_candidate(r, "fake.jit_fp32")->reason;
  EXPECT_TRUE(find_candidate(r, "fake.reference")->eligible);
  EXPECT_EQ(registry_.dispatch(kOp, &call, h200()).name, "fake.reference");

  DispatchOptions high;
  high.quality = Quality::high;
  EXPECT_EQ(registry_.dispatch(kOp, &call, h200(), high).name, "fake.jit_fp32");
  // lossless admits only close implementations with an admission record; this one has none.
  DispatchOptions lossless;
  lossless.quality = Quality::lossless;
  r = registry_.explain(kOp, &call, h200(), lossless);
  EXPECT_NE(find_candidate(r, "fake.jit_fp32")->reason.find("not admitted"), std::string::npos)
      << find_candidate(r, "fake.jit_fp32")->reason;
  EXPECT_EQ(registry_.dispatch(kOp, &call, h200(), lossless).name, "fake.reference");
  DispatchOptions exact;
  exact.quality = Quality::exact;
  EXPECT_EQ(registry_.dispatch(kOp, &call, h200(), exact).name, "fake.reference");
}

TEST_F(DispatchTest, LosslessAdmitsAdmittedCloseImplementations) {
  Contract admitted = Contract::close("oracle", "1 ulp");
  admitted.admission = "H200, op test grid: rms 1.1x, max 1.2x the eager chain's error, bias 0.05 rms";
  registry_.add(spec("fake.jit_admitted", Provenance::jit, {}, admitted));
  registry_.add(spec("fake.reference", Provenance::reference));
  FakeCall call;
  EXPECT_EQ(registry_.dispatch(kOp, &call, h200()).name, "fake.reference");  // exact
  DispatchOptions lossless;
  lossless.quality = Quality::lossless;
  EXPECT_EQ(registry_.dispatch(kOp, &call, h200(), lossless).name, "fake.jit_admitted");
  DispatchOptions high;
  high.quality = Quality::high;
  EXPECT_EQ(registry_.dispatch(kOp, &call, h200(), high).name, "fake.jit_admitted");
}

// Nothing eligible at the call's tier, but a close implementation refused for its contract alone:
// the report names the lowest tier that admits one and what that tier would choose.
TEST_F(DispatchTest, NoEligibleImplementationNamesTheTierThatWouldChooseOne) {
  Contract admitted = Contract::close("oracle", "1 ulp");
  admitted.admission = "H200, op test grid";
  registry_.add(spec("fake.reference", Provenance::reference, {cpu_cap()}));
  registry_.add(spec("fake.vendor", Provenance::vendor, {cuda_cap(70)}, Contract::close("oracle", "2 ulp")));
  FakeCall call;
  DispatchReport r = registry_.explain(kOp, &call, h200());
  ASSERT_EQ(r.chosen, nullptr);
  EXPECT_EQ(r.quality, Quality::exact);
  ASSERT_TRUE(r.admitting_quality.has_value());
  EXPECT_EQ(*r.admitting_quality, Quality::high);  // not admitted: only high takes it
  EXPECT_EQ(r.admitting_choice, "fake.vendor");
  std::string text = r.format();
  EXPECT_NE(text.find("no eligible implementation at quality exact; quality high would choose fake.vendor"),
            std::string::npos) << text;
  try {
    registry_.dispatch(kOp, &call, h200());
    FAIL() << "dispatched at quality exact";
  } catch (const ditops::NoImplementation& e) {
    EXPECT_NE(std::string(e.what()).find("quality high would choose fake.vendor"), std::string::npos) << e.what();
  }

  // An admitted jit implementation: lossless is now the lowest tier that admits one.
  registry_.add(spec("fake.jit", Provenance::jit, {cuda_cap(80)}, admitted));
  r = registry_.explain(kOp, &call, h200());
  ASSERT_TRUE(r.admitting_quality.has_value());
  EXPECT_EQ(*r.admitting_quality, Quality::lossless);
  EXPECT_EQ(r.admitting_choice, "fake.jit");
  DispatchOptions lossless;
  lossless.quality = Quality::lossless;
  EXPECT_EQ(registry_.dispatch(kOp, &call, h200(), lossless).name, "fake.jit");  // the hint holds

  // Judged at lossless with the admitted one disabled: only high is left to name.
  setenv("DITOPS_DISABLE", "fake_op:jit", 1);
  ditops::reload_config();
  r = registry_.explain(kOp, &call, h200(), lossless);
  ASSERT_EQ(r.chosen, nullptr);
  ASSERT_TRUE(r.admitting_quality.has_value());
  EXPECT_EQ(*r.admitting_quality, Quality::high);
  EXPECT_EQ(r.admitting_choice, "fake.vendor");
  text = r.format();
  EXPECT_NE(text.find("no eligible implementation at quality lossless; quality high would choose fake.vendor"),
            std::string::npos) << text;
}

// A close implementation that its predicate refuses too is no answer: no tier is named.
TEST_F(DispatchTest, NoTierIsNamedWhenTheContractIsNotTheOnlyRefusal) {
  KernelSpec vendor = spec("fake.vendor", Provenance::vendor, {cuda_cap(70)}, Contract::close("oracle", "2 ulp"));
  vendor.predicate = [](const void*) { return std::string("K must be a multiple of 16"); };
  registry_.add(std::move(vendor));
  registry_.add(spec("fake.reference", Provenance::reference, {cpu_cap()}));
  FakeCall call;
  const DispatchReport r = registry_.explain(kOp, &call, h200());
  ASSERT_EQ(r.chosen, nullptr);
  EXPECT_FALSE(r.admitting_quality.has_value());
  EXPECT_TRUE(r.admitting_choice.empty());
  const std::string text = r.format();
  EXPECT_NE(text.find("no eligible implementation at any quality: each is refused above for what the call or the "
                      "device lacks, not for its contract\n"),
            std::string::npos) << text;
  EXPECT_EQ(text.find("would choose"), std::string::npos) << text;
  EXPECT_EQ(text.find("at quality exact"), std::string::npos) << text;
  // The contract stays the reason shown (the tier is the first thing a caller chooses).
  EXPECT_NE(find_candidate(r, "fake.vendor")->reason.find("contract is close"), std::string::npos);
  // An eligible candidate: no hint either.
  DispatchOptions high;
  high.quality = Quality::high;
  EXPECT_FALSE(registry_.explain(kOp, &call, cpu(), high).admitting_quality.has_value());
}

TEST_F(DispatchTest, QualityFromEnvironment) {
  registry_.add(spec("fake.jit_fp32", Provenance::jit, {}, Contract::close("oracle", "1 ulp")));
  registry_.add(spec("fake.reference", Provenance::reference));
  FakeCall call;
  setenv("DITOPS_QUALITY", "high", 1);
  // Cached until reloaded.
  EXPECT_EQ(registry_.dispatch(kOp, &call, h200()).name, "fake.reference");
  ditops::reload_config();
  EXPECT_EQ(ditops::config().quality, Quality::high);
  EXPECT_EQ(registry_.dispatch(kOp, &call, h200()).name, "fake.jit_fp32");
  // The per-call option overrides the environment.
  DispatchOptions exact;
  exact.quality = Quality::exact;
  EXPECT_EQ(registry_.dispatch(kOp, &call, h200(), exact).name, "fake.reference");
}

TEST_F(DispatchTest, BadEnvironmentValueWarnsOnce) {
  registry_.add(spec("fake.reference", Provenance::reference));
  setenv("DITOPS_QUALITY", "best", 1);
  ditops::reload_config();
  EXPECT_EQ(ditops::config().quality, Quality::exact);
  ASSERT_EQ(ditops::config().problems.size(), 1u);
  FakeCall call;
  registry_.dispatch(kOp, &call, cpu());
  registry_.dispatch(kOp, &call, cpu());
  const auto w = warnings();
  ASSERT_EQ(w.size(), 1u);
  EXPECT_NE(w[0].find("DITOPS_QUALITY=best"), std::string::npos) << w[0];
}

// ------------------------------------------------------------------ explicit backend

TEST_F(DispatchTest, ExplicitBackendIsStrict) {
  fill_standard();
  FakeCall call;
  DispatchOptions want_jit;
  want_jit.backend = Provenance::jit;
  EXPECT_EQ(registry_.dispatch(kOp, &call, h200(), want_jit).name, "fake.jit");
  const DispatchReport r = registry_.explain(kOp, &call, h200(), want_jit);
  EXPECT_EQ(find_candidate(r, "fake.jit")->reason, "requested explicitly");
  EXPECT_EQ(find_candidate(r, "fake.kda")->reason, "not the requested backend jit");
  EXPECT_EQ(r.candidates.size(), 5u);

  // jit needs nvrtc: the explicit request throws with the refusal, no fallback to vendor.
  ran_.clear();
  try {
    registry_.dispatch(kOp, &call, cuda_sm(80, 0), want_jit);
    FAIL() << "explicit backend fell back";
  } catch (const ditops::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("for the requested backend jit"), std::string::npos) << msg;
    EXPECT_NE(msg.find("fake.jit: not capable on cuda:0 (sm_80)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("+nvrtc"), std::string::npos) << msg;
  }
  EXPECT_TRUE(ran_.empty());
}

TEST_F(DispatchTest, ExplicitBackendPredicateRefusalInMessage) {
  KernelSpec jit = spec("fake.jit", Provenance::jit);
  jit.predicate = [](const void*) { return std::string("rope_dim 24 is not supported"); };
  registry_.add(jit);
  registry_.add(spec("fake.reference", Provenance::reference));
  FakeCall call;
  DispatchOptions want_jit;
  want_jit.backend = Provenance::jit;
  try {
    registry_.dispatch(kOp, &call, h200(), want_jit);
    FAIL();
  } catch (const ditops::Error& e) {
    EXPECT_NE(std::string(e.what()).find("rope_dim 24 is not supported"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(ran_.empty());
}

TEST_F(DispatchTest, ExplicitBackendFailingRunRethrowsWithoutFallback) {
  KernelSpec jit = spec("fake.jit", Provenance::jit);
  jit.run = [](const void*) { throw ditops::Error("NVRTC compile error: boom"); };
  registry_.add(jit);
  registry_.add(spec("fake.reference", Provenance::reference));
  FakeCall call;
  DispatchOptions want_jit;
  want_jit.backend = Provenance::jit;
  try {
    registry_.dispatch(kOp, &call, h200(), want_jit);
    FAIL();
  } catch (const ditops::Error& e) {
    EXPECT_EQ(std::string(e.what()), "NVRTC compile error: boom");
  }
  EXPECT_TRUE(ran_.empty());
  EXPECT_EQ(registry_.failure_count(), 0u);
  EXPECT_TRUE(warnings().empty());
}

// ------------------------------------------------------------------ environment

TEST_F(DispatchTest, ForceBackendPicksJitOverAot) {
  fill_standard();
  FakeCall call;
  setenv("DITOPS_FORCE_BACKEND", "jit", 1);
  ditops::reload_config();
  ASSERT_TRUE(ditops::config().force_backend.has_value());
  const DispatchReport r = registry_.explain(kOp, &call, h200());
  ASSERT_NE(r.chosen, nullptr);
  EXPECT_EQ(r.chosen->name, "fake.jit");
  EXPECT_EQ(r.candidates.front().name, "fake.jit");
  EXPECT_EQ(r.candidates.front().reason, "forced by DITOPS_FORCE_BACKEND");
  EXPECT_EQ(registry_.dispatch(kOp, &call, h200()).name, "fake.jit");
  EXPECT_TRUE(warnings().empty());
}

TEST_F(DispatchTest, ForceBackendFallsBackWithOneWarning) {
  fill_standard();
  FakeCall call;
  setenv("DITOPS_FORCE_BACKEND", "jit", 1);
  ditops::reload_config();
  const DeviceInfo no_nvrtc = cuda_sm(90, ditops::kFeaturePdl);  // jit ineligible
  EXPECT_EQ(registry_.dispatch(kOp, &call, no_nvrtc).name, "fake.kda");
  EXPECT_EQ(registry_.dispatch(kOp, &call, no_nvrtc).name, "fake.kda");
  const auto w = warnings();
  ASSERT_EQ(w.size(), 1u);
  EXPECT_NE(w[0].find("DITOPS_FORCE_BACKEND=jit has no eligible implementation of fake_op"),
            std::string::npos)
      << w[0];
}

TEST_F(DispatchTest, DisableOneBackend) {
  fill_standard();
  FakeCall call;
  setenv("DITOPS_DISABLE", "fake_op:kda,other_op:aot", 1);
  ditops::reload_config();
  const DispatchReport r = registry_.explain(kOp, &call, h200());
  EXPECT_EQ(find_candidate(r, "fake.kda")->reason, "disabled by DITOPS_DISABLE");
  EXPECT_EQ(r.chosen->name, "fake.aot");
  setenv("DITOPS_DISABLE", "fake_op:aot", 1);
  ditops::reload_config();
  EXPECT_EQ(registry_.dispatch(kOp, &call, rtx5090()).name, "fake.jit");
}

TEST_F(DispatchTest, DisableWholeOp) {
  fill_standard();
  FakeCall call;
  setenv("DITOPS_DISABLE", "fake_op", 1);
  ditops::reload_config();
  const DispatchReport r = registry_.explain(kOp, &call, h200());
  EXPECT_EQ(r.chosen, nullptr);
  for (const auto& c : r.candidates) {
    if (c.name == "fake.reference") continue;  // not capable on cuda anyway
    EXPECT_EQ(c.reason, "disabled by DITOPS_DISABLE") << c.name;
  }
  EXPECT_THROW(registry_.dispatch(kOp, &call, h200()), ditops::Error);
  EXPECT_TRUE(ran_.empty());
  // Another op name is not affected.
  setenv("DITOPS_DISABLE", "fake_op2", 1);
  ditops::reload_config();
  EXPECT_EQ(registry_.dispatch(kOp, &call, h200()).name, "fake.kda");
}

// ------------------------------------------------------------------ failures

TEST_F(DispatchTest, FailingRunFallsThroughAndIsCached) {
  std::atomic<int> failing_runs{0};
  KernelSpec aot = spec("fake.aot", Provenance::aot);
  aot.run = [&](const void*) {
    ++failing_runs;
    throw ditops::Error("no image for sm_90");
  };
  registry_.add(aot);
  registry_.add(spec("fake.jit", Provenance::jit));
  FakeCall call;

  EXPECT_EQ(registry_.dispatch(kOp, &call, h200()).name, "fake.jit");
  EXPECT_EQ(failing_runs.load(), 1);
  EXPECT_EQ(registry_.failure_count(), 1u);
  auto w = warnings();
  ASSERT_EQ(w.size(), 1u);
  EXPECT_NE(w[0].find("fake.aot failed on cuda:0 (sm_90) (key k0): no image for sm_90"),
            std::string::npos)
      << w[0];

  // Second identical call: no second warning and the failing run is not tried again.
  EXPECT_EQ(registry_.dispatch(kOp, &call, h200()).name, "fake.jit");
  EXPECT_EQ(failing_runs.load(), 1);
  EXPECT_EQ(warnings().size(), 1u);
  EXPECT_EQ(registry_.failure_count(), 1u);
  const DispatchReport r = registry_.explain(kOp, &call, h200());
  const auto* c = find_candidate(r, "fake.aot");
  EXPECT_FALSE(c->eligible);
  EXPECT_NE(c->reason.find("failed earlier"), std::string::npos) << c->reason;
  EXPECT_NE(c->reason.find("no image for sm_90"), std::string::npos) << c->reason;

  // Another template key, or another device, is tried again.
  FakeCall other;
  other.key = "k1";
  EXPECT_EQ(registry_.dispatch(kOp, &other, h200()).name, "fake.jit");
  EXPECT_EQ(failing_runs.load(), 2);
  EXPECT_EQ(registry_.failure_count(), 2u);
  EXPECT_EQ(registry_.dispatch(kOp, &call, cuda_sm(90, 0, 1)).name, "fake.jit");
  EXPECT_EQ(failing_runs.load(), 3);
  EXPECT_EQ(registry_.failure_count(), 3u);

  registry_.clear_failures();
  EXPECT_EQ(registry_.failure_count(), 0u);
  EXPECT_TRUE(find_candidate(registry_.explain(kOp, &call, h200()), "fake.aot")->chosen);
  EXPECT_EQ(registry_.dispatch(kOp, &call, h200()).name, "fake.jit");
  EXPECT_EQ(failing_runs.load(), 4);
}

TEST_F(DispatchTest, SignatureCachesTheDecisionUntilTheRegistryChanges) {
  std::atomic<int> predicate_calls{0};
  KernelSpec aot = spec("fake.aot", Provenance::aot);
  aot.predicate = [&](const void* p) {
    ++predicate_calls;
    return static_cast<const FakeCall*>(p)->value == 7 ? std::string("value 7 refused") : std::string();
  };
  registry_.add(aot);
  registry_.add(spec("fake.jit", Provenance::jit));
  FakeCall call;

  EXPECT_EQ(registry_.dispatch(kOp, &call, h200(), {}, 42).name, "fake.aot");
  const int evaluated = predicate_calls.load();
  EXPECT_GE(evaluated, 1);
  // Same signature: the decision is reused, no predicate runs, the implementation still runs.
  for (int i = 0; i < 3; ++i) EXPECT_EQ(registry_.dispatch(kOp, &call, h200(), {}, 42).name, "fake.aot");
  EXPECT_EQ(predicate_calls.load(), evaluated);
  EXPECT_EQ(ran_.size(), 4u);
  // Without a signature every call evaluates.
  registry_.dispatch(kOp, &call, h200());
  EXPECT_GT(predicate_calls.load(), evaluated);
  // Another signature, device or options is a separate decision.
  FakeCall refused;
  refused.value = 7;
  EXPECT_EQ(registry_.dispatch(kOp, &refused, h200(), {}, 43).name, "fake.jit");
  DispatchOptions jit_only;
  jit_only.backend = Provenance::jit;
  EXPECT_EQ(registry_.dispatch(kOp, &call, h200(), jit_only, 42).name, "fake.jit");
  EXPECT_EQ(registry_.dispatch(kOp, &call, cuda_sm(90, 0, 1), {}, 42).name, "fake.aot");
  // A configuration reload drops the cached decisions.
  setenv("DITOPS_DISABLE", "fake_op:aot", 1);
  ditops::reload_config();
  EXPECT_EQ(registry_.dispatch(kOp, &call, h200(), {}, 42).name, "fake.jit");
  unsetenv("DITOPS_DISABLE");
  ditops::reload_config();
  EXPECT_EQ(registry_.dispatch(kOp, &call, h200(), {}, 42).name, "fake.aot");
}

TEST_F(DispatchTest, CachedDecisionThatFailsFallsThroughOnce) {
  std::atomic<int> runs{0};
  std::atomic<bool> fail{false};
  KernelSpec aot = spec("fake.aot", Provenance::aot);
  aot.run = [&](const void*) {
    ++runs;
    if (fail) throw ditops::Error("launch failed");
  };
  registry_.add(aot);
  registry_.add(spec("fake.jit", Provenance::jit));
  FakeCall call;
  EXPECT_EQ(registry_.dispatch(kOp, &call, h200(), {}, 5).name, "fake.aot");
  fail = true;
  // The cached choice fails: recorded, warned once, the next candidate runs; later calls go
  // straight to it without retrying the failed one.
  EXPECT_EQ(registry_.dispatch(kOp, &call, h200(), {}, 5).name, "fake.jit");
  EXPECT_EQ(runs.load(), 2);
  EXPECT_EQ(registry_.failure_count(), 1u);
  EXPECT_EQ(registry_.dispatch(kOp, &call, h200(), {}, 5).name, "fake.jit");
  EXPECT_EQ(runs.load(), 2);
  EXPECT_EQ(warnings().size(), 1u);
  // An explicit backend stays strict on the cached path too.
  fail = false;
  registry_.clear_failures();
  DispatchOptions aot_only;
  aot_only.backend = Provenance::aot;
  EXPECT_EQ(registry_.dispatch(kOp, &call, h200(), aot_only, 5).name, "fake.aot");
  fail = true;
  EXPECT_THROW(registry_.dispatch(kOp, &call, h200(), aot_only, 5), ditops::Error);
}

TEST_F(DispatchTest, EveryEligibleFailedThrows) {
  KernelSpec aot = spec("fake.aot", Provenance::aot);
  aot.run = [](const void*) { throw std::runtime_error("a"); };
  KernelSpec jit = spec("fake.jit", Provenance::jit);
  jit.run = [](const void*) { throw std::runtime_error("b"); };
  registry_.add(aot);
  registry_.add(jit);
  FakeCall call;
  try {
    registry_.dispatch(kOp, &call, h200());
    FAIL();
  } catch (const ditops::Error& e) {
    EXPECT_NE(std::string(e.what()).find("every eligible implementation failed"), std::string::npos);
  }
  EXPECT_EQ(registry_.failure_count(), 2u);
  EXPECT_EQ(warnings().size(), 2u);
  // Now nothing is eligible: the no-eligible error lists "failed earlier".
  try {
    registry_.dispatch(kOp, &call, h200());
    FAIL();
  } catch (const ditops::Error& e) {
    EXPECT_NE(std::string(e.what()).find("failed earlier"), std::string::npos) << e.what();
  }
}

TEST_F(DispatchTest, AFailureIsRememberedPerDevice) {
  // An implementation that fails on cuda:0 (a module that will not load there, say) is skipped on
  // cuda:0 from then on and still tried on cuda:1: failures are keyed by device.
  KernelSpec jit = spec("fake.jit", Provenance::jit);
  int runs = 0;
  jit.run = [&](const void*) {
    ++runs;
    throw std::runtime_error("no module on this device");
  };
  registry_.add(jit);
  registry_.add(spec("fake.reference", Provenance::reference));
  DeviceInfo gpu0 = h200();
  DeviceInfo gpu1 = h200();
  gpu1.device.index = 1;
  FakeCall call;
  EXPECT_EQ(registry_.dispatch(kOp, &call, gpu0).name, "fake.reference");
  EXPECT_EQ(runs, 1);
  EXPECT_NE(find_candidate(registry_.explain(kOp, &call, gpu0), "fake.jit")->reason.find("failed earlier"),
            std::string::npos);
  EXPECT_TRUE(find_candidate(registry_.explain(kOp, &call, gpu1), "fake.jit")->eligible);
  EXPECT_EQ(registry_.dispatch(kOp, &call, gpu1).name, "fake.reference");
  EXPECT_EQ(runs, 2);  // tried once on each device
}

TEST_F(DispatchTest, ConcurrentFirstCalls) {
  std::atomic<int> calls{0};
  KernelSpec jit = spec("fake.jit", Provenance::jit, {cuda_cap(80)});
  jit.run = [&](const void* p) {
    EXPECT_EQ(static_cast<const FakeCall*>(p)->value, 42);
    calls.fetch_add(1);
  };
  registry_.add(jit);
  registry_.add(spec("fake.reference", Provenance::reference, {cpu_cap()}));
  constexpr int kThreads = 8;
  std::atomic<int> ok{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&] {
      while (!go.load()) std::this_thread::yield();
      FakeCall call;
      call.value = 42;
      try {
        if (registry_.dispatch(kOp, &call, h200()).name == "fake.jit") ok.fetch_add(1);
      } catch (...) {
      }
    });
  }
  go = true;
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), kThreads);
  EXPECT_EQ(calls.load(), kThreads);
  EXPECT_EQ(registry_.failure_count(), 0u);
}

TEST_F(DispatchTest, ReportFormatNamesChosen) {
  fill_standard();
  FakeCall call;
  const DispatchReport r = registry_.explain(kOp, &call, a100());
  const std::string text = r.format();
  EXPECT_NE(text.find("op fake_op on cuda:0 (sm_80)"), std::string::npos) << text;
  EXPECT_NE(text.find("key k0"), std::string::npos) << text;
  EXPECT_NE(text.find("* fake.jit"), std::string::npos) << text;
  EXPECT_NE(text.find("CHOSEN"), std::string::npos) << text;
  EXPECT_NE(text.find("refused"), std::string::npos) << text;
  EXPECT_EQ(text.find("no eligible implementation"), std::string::npos) << text;
  // Exactly one chosen line.
  size_t chosen_lines = 0;
  for (size_t pos = text.find("CHOSEN"); pos != std::string::npos; pos = text.find("CHOSEN", pos + 1))
    ++chosen_lines;
  EXPECT_EQ(chosen_lines, 1u);

  setenv("DITOPS_DISABLE", "fake_op", 1);
  ditops::reload_config();
  const std::string none = registry_.explain(kOp, &call, a100()).format();
  EXPECT_NE(none.find("no eligible implementation"), std::string::npos) << none;
  EXPECT_EQ(none.find("CHOSEN"), std::string::npos) << none;
}

// ------------------------------------------------------------------ the global registry

TEST(RegistryGlobal, QknormRopeImplementations) {
  const auto before = ditops::jit::cache_stats();
  const auto specs = Registry::global().list("qknorm_rope");
  const auto after = ditops::jit::cache_stats();
  EXPECT_EQ(after.compiles, before.compiles);
  ASSERT_EQ(specs.size(), 6u);
  struct Expected {
    const char* name;
    Provenance provenance;
    Contract::Kind contract;
  };
  const Expected expected[] = {
      {"qknorm_rope.aot", Provenance::aot, Contract::Kind::bit_exact},
      {"qknorm_rope.aot_fp32", Provenance::aot, Contract::Kind::close},
      {"qknorm_rope.jit", Provenance::jit, Contract::Kind::bit_exact},
      {"qknorm_rope.jit_fp32", Provenance::jit, Contract::Kind::close},
      {"qknorm_rope.jit_twice", Provenance::jit, Contract::Kind::bit_exact},
      {"qknorm_rope.reference", Provenance::reference, Contract::Kind::bit_exact},
  };
  for (size_t i = 0; i < 6; ++i) {
    SCOPED_TRACE(expected[i].name);
    EXPECT_EQ(specs[i]->name, expected[i].name);
    EXPECT_EQ(specs[i]->op, "qknorm_rope");
    EXPECT_EQ(specs[i]->provenance, expected[i].provenance);
    EXPECT_EQ(specs[i]->contract.kind, expected[i].contract);
    EXPECT_FALSE(specs[i]->contract.oracle.empty());
    if (expected[i].contract == Contract::Kind::close) EXPECT_FALSE(specs[i]->contract.bounds.empty());
    EXPECT_TRUE(static_cast<bool>(specs[i]->run));
    EXPECT_TRUE(static_cast<bool>(specs[i]->predicate));
  }
  // Non-decreasing provenance = priority order.
  for (size_t i = 1; i < specs.size(); ++i) EXPECT_LE(specs[i - 1]->provenance, specs[i]->provenance);
  // The reference runs on the cpu only, the CUDA ones on cuda only.
  ASSERT_EQ(specs[5]->capabilities.size(), 1u);
  EXPECT_EQ(specs[5]->capabilities[0].kind, DeviceKind::cpu);
  // The diffusers chain's contract names its chain, with Qwen-Image's complex product.
  EXPECT_NE(specs[4]->contract.oracle.find("diffusers' RMSNorm"), std::string::npos) << specs[4]->contract.oracle;
  EXPECT_NE(specs[4]->contract.oracle.find("rope_product=complex"), std::string::npos) << specs[4]->contract.oracle;
  for (size_t i = 0; i < 5; ++i)
    for (const auto& cap : specs[i]->capabilities) EXPECT_EQ(cap.kind, DeviceKind::cuda);
  const auto ops = Registry::global().ops();
  EXPECT_NE(std::find(ops.begin(), ops.end(), "qknorm_rope"), ops.end());
  EXPECT_EQ(ditops::jit::cache_stats().compiles, before.compiles);
}

// A typed implementation's KernelSpec functions take the Dispatched call dispatch() makes; the
// op's call struct passed in its place throws instead of being read as one.
TEST_F(RegistryTest, TypedImplementationTakesOnlyItsDispatchedCall) {
  struct Key {
    std::string to_string() const { return "k"; }
  };
  int ran = 0;
  ditops::Implementation<FakeCall, Key> impl;
  impl.name = "fake.typed";
  impl.capabilities = {cpu_cap()};
  impl.predicate = [](const FakeCall& c, const Key&) { return c.refuse_jit ? std::string("refused") : std::string(); };
  impl.run = [&ran](const FakeCall& c, const Key&) { ran += c.value; };
  ditops::add_implementation(registry_, kOp, std::move(impl));
  const KernelSpec* typed = registry_.list(kOp).at(0);
  FakeCall call;
  call.value = 3;
  const Key key;
  const DeviceInfo info = cpu();
  const ditops::Dispatched<FakeCall, Key> dispatched{call, key, info};
  EXPECT_EQ(typed->predicate(&dispatched), "");
  EXPECT_EQ(typed->template_key(&dispatched), "");  // a CPU call has no kernel
  typed->run(&dispatched);
  EXPECT_EQ(ran, 3);
  EXPECT_THROW(typed->run(&call), ditops::Error);
  EXPECT_THROW(typed->predicate(&call), ditops::Error);
  EXPECT_EQ(ran, 3);
}

}  // namespace
