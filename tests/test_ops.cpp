// The op test driver's gtest entry (`ctest -R ops`): per described op, kOpParts tests of each kind
// run the cases the op declares (tests/cases/<op>_cases.cpp), split by parts_of.
// ops.reference_against_the_oracles, on every machine: the reference's invariants (expected
// errors, nothing written on failure or outside outputs, every output element written, aliased
// equal to unaliased) and its oracles. ops.every_cuda_implementation_against_the_reference: every
// CUDA implementation against the reference and the bounding oracles; skipped without a device.
// ops_driver.* checks the driver itself, with the host standing in for the device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <regex>
#include <set>

#include "op_test_driver.h"

namespace ditops::optest {
namespace {

std::vector<std::string> described_ops() {
  std::vector<std::string> out;
  for (const OpDescription* d : op_descriptions()) out.push_back(d->name);
  return out;
}

// Parts of an op's cases, each its own ctest test: a GPU run spreads an op's CPU references over
// ctest's jobs (in 4 parts by index norm_scale_shift's last part took 215 s of a 507 s H200 run:
// docs/tuning/device_verify.md).
constexpr int kOpParts = 8;

// The part of each case: the small ones by index, the large ones (the model-sized calls whose CPU
// reference is a device run's long pole) largest first onto the part with the fewest elements yet.
std::vector<int> parts_of(const std::vector<OpCase>& all) {
  std::vector<int> part(all.size());
  std::vector<std::pair<int64_t, size_t>> large;
  int small = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    if (!all[i].large) {
      part[i] = small++ % kOpParts;
      continue;
    }
    int64_t elements = 0;
    for (const TensorCase& t : all[i].tensors) elements += numel(t.shape);
    large.push_back({elements, i});
  }
  std::stable_sort(large.begin(), large.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<int64_t> load(kOpParts, 0);
  for (const auto& [elements, i] : large) {
    const int lightest = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    part[i] = lightest;
    load[lightest] += elements;
  }
  return part;
}

struct OpPart {
  std::string op;
  int part;
};

std::vector<OpPart> op_parts() {
  std::vector<OpPart> out;
  for (const std::string& op : described_ops())
    for (int part = 0; part < kOpParts; ++part) out.push_back({op, part});
  return out;
}

void PrintTo(const OpPart& p, std::ostream* os) { *os << p.op << " part " << p.part + 1 << " of " << kOpParts; }

class ops : public ::testing::TestWithParam<OpPart> {};

// DITOPS_OPS_CASES=<regex>: only the cases whose name it finds, in both tests (one feature's cases
// on a device); unset: every case.
bool selected(const OpCase& c) {
  static const std::optional<std::regex> only = [] {
    const char* pattern = std::getenv("DITOPS_OPS_CASES");
    return pattern ? std::optional<std::regex>(std::regex(pattern)) : std::nullopt;
  }();
  return !only || std::regex_search(c.name, *only);
}

// Large cases are model-sized calls the reference alone would take long on: they run where a
// device compares them (the device test checks their reference there).
TEST_P(ops, reference_against_the_oracles) {
  const std::string op = GetParam().op;
  const int part = GetParam().part;
  const std::vector<OpCase> all = cases(op);
  ASSERT_FALSE(all.empty()) << op << " declares no cases: add tests/cases/<op>_cases.cpp (docs/testing.md)";
  const std::vector<int> parts = parts_of(all);
  Summary summary;
  int skipped = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    if (parts[i] != part || !selected(all[i])) continue;
    if (all[i].large) {
      ++skipped;
      continue;
    }
    for (const std::string& failure : run_case(all[i], DriverOptions{}, &summary)) ADD_FAILURE() << failure;
  }
  std::printf("%s(%d large cases left to the device test)\n", summary.format(op).c_str(), skipped);
}

TEST_P(ops, every_cuda_implementation_against_the_reference) {
  const std::string op = GetParam().op;
  const int part = GetParam().part;
  const std::unique_ptr<Memory> device = cuda_memory();
  if (!device) GTEST_SKIP() << "no CUDA device: " << op << "'s CUDA implementations are compared where one is";
  const std::vector<OpCase> all = cases(op);
  ASSERT_FALSE(all.empty()) << op << " declares no cases: add tests/cases/<op>_cases.cpp (docs/testing.md)";
  Summary summary;
  int skipped = 0;
  // DITOPS_OPS_SKIP_LARGE=1: large cases skip here too (a sanitizer run, where their CPU
  // reference would take the run's time).
  const bool skip_large = std::getenv("DITOPS_OPS_SKIP_LARGE") != nullptr;
  const std::vector<int> parts = parts_of(all);
  for (size_t i = 0; i < all.size(); ++i) {
    if (parts[i] != part || !selected(all[i])) continue;
    const OpCase& c = all[i];
    if (c.large && skip_large) {
      ++skipped;
      continue;
    }
    DriverOptions options;
    options.device = device.get();
    options.check_reference = c.large;  // the other cases' references: reference_against_the_oracles
    for (const std::string& failure : run_case(c, options, &summary)) ADD_FAILURE() << failure;
  }
  std::printf("%s(%d large cases skipped)\n", summary.format(op).c_str(), skipped);
}

INSTANTIATE_TEST_SUITE_P(driver, ops, ::testing::ValuesIn(op_parts()),
                         [](const ::testing::TestParamInfo<OpPart>& info) {
                           return info.param.op + "_part" + std::to_string(info.param.part + 1);
                         });

// The device path of the driver, with the host standing in for the device: the reference runs
// as "the implementation under test" through explain, forced dispatch, copies and comparison.
TEST(ops_driver, host_as_the_device_runs_every_op_through_the_device_path) {
  const std::unique_ptr<Memory> host = host_memory();
  DriverOptions options;
  options.device = host.get();
  for (const std::string& op : described_ops()) {
    Summary summary;
    int n = 0;
    for (const OpCase& c : cases(op)) {
      if (c.large || n++ % 16 != 0) continue;  // a sample: the reference's cost twice over
      for (const std::string& failure : run_case(c, options, &summary)) ADD_FAILURE() << failure;
    }
    EXPECT_GT(summary.impls[op + ".reference"].ran + summary.impls[op + ".reference"].refused_invalid, 0) << op;
  }
}

OpCase small_case() {
  for (const OpCase& c : cases("residual_gate_add"))
    if (c.name == "bf16_2x33x128_gate_2x33x1") return c;
  ADD_FAILURE() << "the self-test's case is gone";
  return {};
}

OpCase named(const std::string& op, const std::string& name) {
  const OpCase* c = find_case(op, name);
  if (!c) ADD_FAILURE() << op << "/" << name << ": the self-test's case is gone";
  return c ? *c : OpCase{};
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += x + "\n";
  return s;
}

// The comparison catches a wrong element, a write into a guard and a write into an input.
TEST(ops_driver, catches_corrupted_results) {
  const std::unique_ptr<Memory> host = host_memory();
  const OpCase c = small_case();
  struct Corruption {
    const char* what;
    std::function<void(std::vector<std::vector<uint8_t>>&)> apply;
    const char* reported;
  };
  // Buffers in the case's order: residual, update, gate, out; each starts with a 256-byte guard.
  const std::vector<Corruption> corruptions = {
      {"an output element", [](auto& b) { b[3][256 + 10] ^= 0x40; }, "out: 1 of"},
      {"the guard after out", [](auto& b) { b[3][b[3].size() - 1] ^= 1; }, "the guard after out"},
      {"an input", [](auto& b) { b[1][300] ^= 1; }, "update's buffer"},
  };
  // q in place, [9, 3, 64] bf16 with heads 88 elements apart: the comparisons go a head at a time.
  const OpCase strided = named("qknorm_rope", "T9_Hq3_Hk2_D64_R64_bf16_cache_f32_pos_i64_padded_fp32_aten_headpad24_cachepad5_amp40_eps1e-06");
  const std::vector<Corruption> strided_corruptions = {
      {"q's element 194 (token 1, head 0)", [](auto& b) { b[0][256 + 549] ^= 0x40; }, "q: 1 of 1728 elements differ (first at index 194"},
      {"the gap after q's first head", [](auto& b) { b[0][256 + 128] ^= 1; }, "q's buffer at byte 128 (an input, padding"},
      {"the guard after q", [](auto& b) { b[0][b[0].size() - 1] ^= 1; }, "the guard after q"},
  };
  for (const auto& [variant, list] : {std::pair{c, &corruptions}, std::pair{strided, &strided_corruptions}})
    for (const Corruption& k : *list) {
      DriverOptions options;
      options.device = host.get();
      options.tamper = [&](const std::string&, std::vector<std::vector<uint8_t>>& buffers) { k.apply(buffers); };
      Summary summary;
      const std::vector<std::string> failures = run_case(variant, options, &summary);
      EXPECT_NE(joined(failures).find(k.reported), std::string::npos) << variant.name << ", " << k.what << ":\n" << joined(failures);
    }
}

// A case whose expectation is wrong fails: an invalid input the op accepts, a fragment the
// message lacks, an implementation said unsupported that is eligible.
TEST(ops_driver, wrong_expectations_fail) {
  const std::unique_ptr<Memory> host = host_memory();
  DriverOptions options;
  options.device = host.get();
  Summary summary;
  OpCase c = small_case();
  c.invalid = {"no such message"};
  EXPECT_NE(joined(run_case(c, options, &summary)).find("accepted an invalid input"), std::string::npos);
  c = small_case();
  c.tensors[2].shape = {2, 33, 7};
  c.invalid = {"gate", "no such fragment"};
  EXPECT_NE(joined(run_case(c, options, &summary)).find("lacks 'no such fragment'"), std::string::npos);
  c = small_case();
  c.unsupported = {{"residual_gate_add.reference", "anything"}};
  EXPECT_NE(joined(run_case(c, options, &summary)).find("the case says it is unsupported"), std::string::npos);
}

// An oracle catches a reference that is off by one bit in one element.
TEST(ops_driver, the_oracle_catches_a_wrong_reference) {
  ASSERT_FALSE(oracles("residual_gate_add").empty());
  DriverOptions options;
  Summary summary;
  const OpCase c = small_case();
  EXPECT_EQ(joined(run_case(c, options, &summary)), "");
  options.tamper_reference = [](std::vector<std::vector<uint8_t>>& b) { b[3][256 + 20] ^= 1; };
  const std::string failures = joined(run_case(c, options, &summary));
  EXPECT_NE(failures.find("the reference against the oracle"), std::string::npos) << failures;
  EXPECT_NE(failures.find("out: 1 of"), std::string::npos) << failures;
}

// Special values reach the inputs; a NaN compares equal to any NaN and to nothing else.
TEST(ops_driver, special_values_compare_as_values) {
  const std::string json = cases_json();
  EXPECT_NE(json.find("\"kind\": \"special\", \"scale\": 4.000000, \"offset\": 0.000000, \"modulo\": 3, "
                      "\"patterns\": [0, 32768, 32640, 65408, 32704, 65472"),
            std::string::npos);
  const std::unique_ptr<Memory> host = host_memory();
  const OpCase c = named("residual_gate_add", "bf16_3x5x64_gate_3x5x64_special");
  auto retouch = [](uint16_t nan_to) {
    return [nan_to](const std::string&, std::vector<std::vector<uint8_t>>& b) {
      auto* out = reinterpret_cast<uint16_t*>(b[3].data() + 256);
      for (size_t i = 0; i < (b[3].size() - 512) / 2; ++i)
        if ((out[i] & 0x7F80) == 0x7F80 && (out[i] & 0x7F)) {
          out[i] = nan_to;
          return;
        }
      ADD_FAILURE() << "no NaN in out";
    };
  };
  DriverOptions options;
  options.device = host.get();
  Summary summary;
  options.tamper = retouch(0xFFC1);  // another NaN
  EXPECT_EQ(joined(run_case(c, options, &summary)), "");
  options.tamper = retouch(0x3F80);  // 1.0
  const std::string failures = joined(run_case(c, options, &summary));
  EXPECT_NE(failures.find("against the reference: out: 1 of"), std::string::npos) << failures;
}

// Derived variants move whole buffers, pad rows and set options; they run clean.
TEST(ops_driver, variants_move_buffers_pad_rows_and_set_options) {
  const OpCase c = small_case();
  const OpCase m = misaligned_variant(c, {"residual", "gate"});
  EXPECT_EQ(m.name, c.name + "_misaligned");
  EXPECT_EQ(m.kind, CaseKind::misaligned);
  EXPECT_EQ(m.tensors[0].offset, 1);
  EXPECT_EQ(m.tensors[1].offset, 0);
  EXPECT_EQ(m.tensors[2].offset, 1);
  const OpCase padded = padded_variant(c, {"update"}, 8);
  EXPECT_EQ(padded.tensors[1].strides, (std::vector<int64_t>{33 * 136, 136, 1}));
  EXPECT_TRUE(padded.tensors[0].strides.empty());
  const OpCase o = option_variant(c, {{"use_pdl", "false"}}, "nopdl");
  EXPECT_EQ(o.name, c.name + "_nopdl");
  EXPECT_EQ(o.options.back(), (std::pair<std::string, std::string>{"use_pdl", "false"}));
  std::vector<OpCase> list = {c};
  list[0].kind = CaseKind::model;
  add_variants(list, {{"out"}, 3, {}, 8, {{{{"use_pdl", "false"}}, "nopdl"}}, nullptr});
  ASSERT_EQ(list.size(), 3u);
  EXPECT_EQ(list[1].tensors[3].offset, 3);
  // A variant that repeats a call the list holds already (another name, another seed) is left out.
  list.resize(1);
  OpCase declared = misaligned_variant(c, {"out"}, 3);
  declared.name = "declared_off3";
  declared.seed = c.seed + 1;
  list.push_back(declared);
  add_variants(list, {{"out"}, 3, {}, 8, {}, nullptr});
  EXPECT_EQ(list.size(), 2u);
  // A variant of a call with a tensor above device_only_above runs where a device compares it.
  EXPECT_FALSE(list[0].large);
  add_variants(list, {{"out"}, 1, {}, 8, {}, nullptr, 2 * 33 * 128 - 1});  // out: [2, 33, 128]
  ASSERT_EQ(list.size(), 3u);
  EXPECT_TRUE(list[2].large);
  const std::unique_ptr<Memory> host = host_memory();
  DriverOptions options;
  options.device = host.get();
  Summary summary;
  for (const OpCase& v : {m, o}) EXPECT_EQ(joined(run_case(v, options, &summary)), "") << v.name;
}

// A related case that writes other bytes, or one that is not told apart, fails.
TEST(ops_driver, related_cases_are_compared) {
  DriverOptions options;
  Summary summary;
  OpCase c = named("residual_gate_add", "bf16_2x9x16_gate_2x9x1_transposed");
  ASSERT_EQ(c.same_as, (std::vector<std::string>{"bf16_2x9x16_gate_2x9x1"}));
  EXPECT_EQ(joined(run_case(c, options, &summary)), "");
  c.same_as = {"bf16_2x9x16_gate_2x9x16"};  // a full gate: other values
  EXPECT_NE(joined(run_case(c, options, &summary)).find("written elements differ from"), std::string::npos);
  c.same_as.clear();
  c.differs_from = {"bf16_2x9x16_gate_2x9x1"};
  EXPECT_NE(joined(run_case(c, options, &summary)).find("not told apart"), std::string::npos);
}

// An oracle that bounds a contract bounds every implementation on the device too.
TEST(ops_driver, an_oracle_bounds_every_implementation) {
  const OpCase c = named("fp8_linear", "bf16_M1_N128_K5120_ieee_seed0");
  const std::unique_ptr<Memory> host = host_memory();
  DriverOptions options;
  options.device = host.get();
  Summary summary;
  EXPECT_EQ(joined(run_case(c, options, &summary)), "");
  // Buffers: x, x_scale, w, w_scale, out; out[5]'s exponent moved (a factor of 2^8 or 2^-8).
  options.tamper = [](const std::string&, std::vector<std::vector<uint8_t>>& b) { b[4][256 + 11] ^= 0x04; };
  const std::string failures = joined(run_case(c, options, &summary));
  EXPECT_NE(failures.find("against the oracle (fp64 product within the contract's bound): out: 1 of 128"),
            std::string::npos)
      << failures;
  // A tolerance of its own widens the comparison with the reference, never the contract's bound:
  // the same wrong element within the tolerance still fails against the oracle.
  OpCase tolerant = c;
  tolerant.tolerance_for_impl = {{"fp8_linear.reference", Tolerance{1e9, 1.0, 1.0, 0}}};
  const std::string tolerant_failures = joined(run_case(tolerant, options, &summary));
  EXPECT_EQ(tolerant_failures.find("against the reference"), std::string::npos) << tolerant_failures;
  EXPECT_NE(tolerant_failures.find("against the oracle (fp64 product within the contract's bound): out: 1 of 128"),
            std::string::npos)
      << tolerant_failures;
}

// An oracle that no output holds, for the next test's case alone.
constexpr const char* kNeverHolds = "bf16_2x33x128_gate_2x33x1_oracle_never_holds";
const OracleSet kNever("residual_gate_add", {.name = "never holds",
                                             .expect = [](OracleIo& io) { io.expect(io.id("out"), 0, io.out(io.id("out"), 0) + 1); },
                                             .bounds_implementations = true,
                                             .on_own_outputs = true,
                                             .applies = [](const OpCase& c) { return c.name == kNeverHolds; }});

// An implementation that writes the reference's bytes takes the reference's oracle verdicts
// (computed once per case), failures included; one that writes other bytes is checked on its own.
TEST(ops_driver, an_implementation_with_the_references_bytes_takes_its_oracle_verdicts) {
  const std::unique_ptr<Memory> host = host_memory();
  OpCase c = small_case();
  c.name = kNeverHolds;
  DriverOptions options;
  options.device = host.get();
  Summary summary;
  for (const bool differs : {false, true}) {
    if (differs) options.tamper = [](const std::string&, std::vector<std::vector<uint8_t>>& b) { b[3][256 + 40] ^= 0x40; };
    const std::string failures = joined(run_case(c, options, &summary));
    EXPECT_NE(failures.find("the reference against the oracle (never holds): out: 1 of"), std::string::npos) << failures;
    EXPECT_NE(failures.find("cpu against the oracle (never holds): out: 1 of"), std::string::npos) << failures;
    EXPECT_NE(failures.find("cpu against the oracle on its own outputs (never holds): out: 1 of"), std::string::npos)
        << failures;
    EXPECT_EQ(failures.find("against the reference: out") != std::string::npos, differs) << failures;
  }
}

// A second run that writes other bytes fails.
TEST(ops_driver, run_to_run_differences_fail) {
  const std::unique_ptr<Memory> host = host_memory();
  DriverOptions options;
  options.device = host.get();
  options.tamper = [](const std::string& impl, std::vector<std::vector<uint8_t>>& b) {
    if (impl.size() > 2 && impl.compare(impl.size() - 2, 2, "#2") == 0) b[3][256 + 4] ^= 0x10;
  };
  Summary summary;
  const std::string failures = joined(run_case(small_case(), options, &summary));
  EXPECT_NE(failures.find("run again on other output contents"), std::string::npos) << failures;
}

// Every case of every op prepares, and names are unique per op (the JSON table and the failure
// messages refer to cases by name).
TEST(ops_driver, case_names_are_unique) {
  for (const std::string& op : described_ops()) {
    std::set<std::string> names;
    for (const OpCase& c : cases(op)) EXPECT_TRUE(names.insert(c.name).second) << op << "/" << c.name;
  }
  EXPECT_NE(cases_json().find("\"op\": \"qknorm_rope\""), std::string::npos);
}

}  // namespace
}  // namespace ditops::optest
