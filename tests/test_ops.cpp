// The op test driver's gtest entry (`ctest -R ops`): one test per described op runs every case
// the op declares (tests/cases/<op>_cases.cpp). Without a GPU the reference's invariants are
// checked (expected errors, nothing written on failure or outside outputs, every output element
// written, aliased equal to unaliased); with one, every CUDA implementation against the reference.
// ops_driver.* checks the driver itself, with the host standing in for the device.
#include <gtest/gtest.h>

#include <cstdio>
#include <set>

#include "op_test_driver.h"

namespace ditops::optest {
namespace {

std::vector<std::string> described_ops() {
  std::vector<std::string> out;
  for (const OpDescription* d : op_descriptions()) out.push_back(d->name);
  return out;
}

class ops : public ::testing::TestWithParam<std::string> {};

TEST_P(ops, every_case_against_the_reference) {
  const std::string op = GetParam();
  const std::vector<OpCase> all = cases(op);
  ASSERT_FALSE(all.empty()) << op << " declares no cases: add tests/cases/<op>_cases.cpp (docs/testing.md)";
  const std::unique_ptr<Memory> device = cuda_memory();
  DriverOptions options;
  options.device = device.get();
  Summary summary;
  int skipped = 0;
  for (const OpCase& c : all) {
    if (c.large && !device) {
      ++skipped;  // the reference alone on a model-sized call: run where a device compares it
      continue;
    }
    for (const std::string& failure : run_case(c, options, &summary)) ADD_FAILURE() << failure;
  }
  std::printf("%s%s(%d large cases left to the device run)\n", summary.format(op).c_str(),
              device ? "" : "no CUDA device: the reference's invariants only ", skipped);
}

INSTANTIATE_TEST_SUITE_P(driver, ops, ::testing::ValuesIn(described_ops()),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

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
      if (c.large || n++ % 7 != 0) continue;  // a sample: the reference's cost twice over
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
  for (const Corruption& k : corruptions) {
    DriverOptions options;
    options.device = host.get();
    options.tamper = [&](const std::string&, std::vector<std::vector<uint8_t>>& buffers) { k.apply(buffers); };
    Summary summary;
    const std::vector<std::string> failures = run_case(c, options, &summary);
    EXPECT_NE(joined(failures).find(k.reported), std::string::npos) << k.what << ":\n" << joined(failures);
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
