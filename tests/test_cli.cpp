// The CLI as a user types it (issue 22): every bad flag value is refused with a message naming
// the flag, the expected and the actual value; explain can simulate a GPU architecture on any
// machine; list fits the output width.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <sstream>
#include <string>

namespace {

struct CliRun {
  int status = -1;  // exit code
  std::string out;  // stdout and stderr
};

CliRun cli(const std::string& args, const std::string& env = "") {
  CliRun r;
  FILE* pipe = popen((env + (env.empty() ? "" : " ") + DITOPS_CLI_PATH + " " + args + " 2>&1").c_str(), "r");
  if (!pipe) return r;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, pipe)) > 0;) r.out.append(buf, n);
  const int status = pclose(pipe);
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

void expect_error(const std::string& args, const std::string& message) {
  const CliRun r = cli(args);
  EXPECT_EQ(r.status, 1) << args << "\n" << r.out;
  EXPECT_NE(r.out.find("ditops: error: " + message), std::string::npos) << args << "\n" << r.out;
}

// ---------------------------------------------------------------- explain --sm

TEST(CliExplainSimulated, Sm90ExplainsGpuDispatchWithoutAGpu) {
  const CliRun r = cli("explain qknorm_rope --shape 16,24,24,128 --sm 90 --sms 132");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("simulated device: sm_90 with 132 SMs"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("on cuda:0 (sm_90) simulated, 132 SMs"), std::string::npos) << r.out;
  // The CPU reference cannot take CUDA tensors; a CUDA implementation is judged on sm_90.
  EXPECT_NE(r.out.find("qknorm_rope.reference"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("not capable on cuda:0 (sm_90)"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("CUDA unavailable"), std::string::npos) << "the simulated driver is present\n" << r.out;
  // A CUDA implementation is chosen: a prebuilt one (builds with AOT kernels for sm_90) or the
  // JIT (NVRTC on this machine).
  if (r.out.find("features nvrtc") != std::string::npos)
    EXPECT_TRUE(r.out.find("* qknorm_rope.jit ") != std::string::npos ||
                r.out.find("* qknorm_rope.aot ") != std::string::npos)
        << r.out;
}

TEST(CliExplainSimulated, TheArchitectureReachesCapabilitiesAndKeys) {
  // PDL is an sm_90 feature: it enters the template key on sm_90, not on sm_80.
  const CliRun sm90 = cli("explain qknorm_rope --shape 16,24,24,128 --sm 90");
  const CliRun sm80 = cli("explain qknorm_rope --shape 16,24,24,128 --sm 80");
  ASSERT_EQ(sm90.status, 0) << sm90.out;
  ASSERT_EQ(sm80.status, 0) << sm80.out;
  EXPECT_NE(sm90.out.find("132 SMs (--sms default)"), std::string::npos) << sm90.out;
  EXPECT_NE(sm90.out.find(",pdl"), std::string::npos) << sm90.out;
  EXPECT_EQ(sm80.out.find(",pdl"), std::string::npos) << sm80.out;
  // The fp8 LayerNorm needs sm_89: refused on a simulated sm_80 as not capable.
  const CliRun fp8 = cli("explain layernorm_modulate_fp8 --shape 1,16,3072 --sm 80");
  ASSERT_EQ(fp8.status, 0) << fp8.out;
  EXPECT_NE(fp8.out.find("layernorm_modulate_fp8.jit"), std::string::npos) << fp8.out;
  EXPECT_NE(fp8.out.find("not capable on cuda:0 (sm_80)"), std::string::npos) << fp8.out;
}

TEST(CliExplainSimulated, BadValuesAreRefusedByName) {
  const std::string sm = "explain residual_gate_add: --sm must be an integer in [50, 200] "
                         "(compute capability major*10+minor, e.g. 90) but is ";
  expect_error("explain residual_gate_add --sm abc", sm + "'abc'");
  expect_error("explain residual_gate_add --sm 49", sm + "'49'");
  expect_error("explain residual_gate_add --sm 201", sm + "'201'");
  expect_error("explain residual_gate_add --sm -90", sm + "'-90'");
  expect_error("explain residual_gate_add --sm 9.0", sm + "'9.0'");
  expect_error("explain residual_gate_add --sm ''", sm + "''");
  expect_error("explain residual_gate_add --sm 99999999999999999999999", sm + "'99999999999999999999999'");
  expect_error("explain residual_gate_add --sm 90 --sms 0",
               "explain residual_gate_add: --sms must be an integer in [1, 1024] (multiprocessors) but is '0'");
  expect_error("explain residual_gate_add --sms 132",
               "explain residual_gate_add: --sms is the simulated device's SM count and needs --sm");
  expect_error("explain residual_gate_add --sm 90 --device cpu",
               "explain residual_gate_add: --sm simulates a CUDA device but --device is cpu");
}

// ---------------------------------------------------------------- bench flags

TEST(CliBench, NumericFlagsAreCheckedBeforeLookingForAGpu) {
  const std::string reps = "bench residual_gate_add: --reps must be an integer in [1, 100000] "
                           "(repetitions per case) but is ";
  expect_error("bench residual_gate_add --reps 0", reps + "'0'");
  expect_error("bench residual_gate_add --reps abc", reps + "'abc'");
  expect_error("bench residual_gate_add --reps -3", reps + "'-3'");
  expect_error("bench residual_gate_add --reps 1e3", reps + "'1e3'");
  expect_error("bench residual_gate_add --reps 100001", reps + "'100001'");
  expect_error("bench qknorm_rope --reps ''",
               "bench qknorm_rope: --reps must be an integer in [1, 100000] (repetitions per case) but is ''");
  expect_error("bench residual_gate_add --rep 5", "bench residual_gate_add: unknown option --rep");
  expect_error("bench residual_gate_add --host-only", "bench residual_gate_add: unknown option --host-only");
  expect_error("bench residual_gate_add --json ''", "bench residual_gate_add: --json needs a path");
  expect_error("bench", "bench: name one op, one of: ");
  expect_error("bench residual_gate_add extra", "bench: name one op, one of: ");
}

// ---------------------------------------------------------------- list

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::stringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

TEST(CliList, LinesFitTheOutputWidth) {
  for (const char* columns : {"80", "120", "60"}) {
    const CliRun r = cli("list --keys", std::string("COLUMNS=") + columns);
    ASSERT_EQ(r.status, 0) << r.out;
    const size_t width = std::stoul(columns);
    for (const auto& line : lines_of(r.out)) EXPECT_LE(line.size(), width) << "COLUMNS=" << columns << ": " << line;
    EXPECT_NE(r.out.find("qknorm_rope.reference"), std::string::npos) << r.out;
  }
  // Without COLUMNS (not a terminal): 100.
  const CliRun r = cli("list", "COLUMNS=");
  for (const auto& line : lines_of(r.out)) EXPECT_LE(line.size(), 100u) << line;
}

TEST(CliList, ImplementationNamesStayInTheirColumn) {
  const CliRun r = cli("list", "COLUMNS=100");
  ASSERT_EQ(r.status, 0) << r.out;
  const auto lines = lines_of(r.out);
  ASSERT_FALSE(lines.empty());
  const size_t provenance_column = lines[0].find("provenance");
  ASSERT_NE(provenance_column, std::string::npos) << lines[0];
  int rows = 0;
  for (const auto& line : lines) {
    if (line.empty() || line[0] == ' ' || line.find('.') == std::string::npos || line.rfind("prebuilt", 0) == 0)
      continue;
    ++rows;  // an implementation row: name, spaces, then the provenance at its column
    EXPECT_EQ(line.find_first_not_of(' ', line.find(' ')), provenance_column) << line;
  }
  EXPECT_GE(rows, 6) << r.out;
}

// ---------------------------------------------------------------- the rest of issue 22's CLI list

TEST(CliHostile, HelpUnknownOptionsAndBadValues) {
  const CliRun help = cli("--help");
  EXPECT_EQ(help.status, 0) << help.out;
  EXPECT_NE(help.out.find("usage: ditops"), std::string::npos) << help.out;
  expect_error("explain qknorm_rope --shpe 1,2,3,4", "explain qknorm_rope: unknown option --shpe");
  expect_error("explain qknorm_rope --rounding foo", "qknorm_rope: unknown rounding 'foo' (expected rounded or fp32)");
  expect_error("explain qknorm_rope --shape abc", "--shape: T must be a non-negative integer but is 'abc'");
  expect_error("explain qknorm_rope --shape -1,24,24,128", "--shape: T must be a non-negative integer but is '-1'");
  expect_error("list --wide", "list: unknown option --wide (options: --keys)");
  expect_error("demo --fast", "demo: unknown option --fast (no options)");
  expect_error("explain qknorm_rope --shape", "explain qknorm_rope: option --shape needs a value");
  expect_error("list --wide 1", "list: unknown option --wide (options: --keys)");
  expect_error("info --verbose", "info: unknown option --verbose (no options)");
  expect_error("cache clear --dry-run", "cache: unknown option --dry-run (no options)");
  expect_error("cache clear --dry-run yes", "cache: unknown option --dry-run (no options)");
  expect_error("cache clear everything", "cache: expected 'list' or 'clear' alone but got 'everything'");
  // Sizes whose tensors cannot have distinct addresses: refused as such, not as an overlap.
  expect_error("explain qknorm_rope --shape 999999999999999,24,24,128 --device cpu",
               "qknorm_rope: the tensors of this call would take more than 2^56 bytes (q has 3 dims of sizes "
               "999999999999999,24,128)");
  const CliRun rga = cli("explain residual_gate_add --device cpu");
  EXPECT_EQ(rga.status, 0) << rga.out;
  EXPECT_NE(rga.out.find("* residual_gate_add.reference"), std::string::npos) << rga.out;
}

}  // namespace
