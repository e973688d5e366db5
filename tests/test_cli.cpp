// The CLI as a user types it (issue 22): every bad flag value is refused with a message naming
// the flag, the expected and the actual value; explain can simulate a GPU architecture on any
// machine; list fits the output width.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>

namespace {

struct CliRun {
  int status = -1;   // exit code
  std::string out;   // stdout and stderr
  std::string err;   // stderr alone (cli_streams)
};

std::string read_all(FILE* f) {
  std::string text;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, f)) > 0;) text.append(buf, n);
  return text;
}

CliRun cli(const std::string& args, const std::string& env = "") {
  CliRun r;
  FILE* pipe = popen((env + (env.empty() ? "" : " ") + DITOPS_CLI_PATH + " " + args + " 2>&1").c_str(), "r");
  if (!pipe) return r;
  r.out = read_all(pipe);
  const int status = pclose(pipe);
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// The same with stdout in `out` and stderr in `err`, apart.
CliRun cli_streams(const std::string& args) {
  CliRun r;
  char path[] = "/tmp/ditops_cli_stderr_XXXXXX";
  const int fd = mkstemp(path);
  if (fd < 0) return r;
  close(fd);
  FILE* pipe = popen((std::string(DITOPS_CLI_PATH) + " " + args + " 2>" + path).c_str(), "r");
  if (pipe) {
    r.out = read_all(pipe);
    const int status = pclose(pipe);
    r.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  if (FILE* f = fopen(path, "r")) {
    r.err = read_all(f);
    fclose(f);
  }
  unlink(path);
  return r;
}

bool gpu_present() { return cli("info").out.find("cuda driver:") != std::string::npos; }

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
  expect_error("bench residual_gate_add extra", "bench: name one op, one of: ");
}

// An op without a benchmark of its own gets the generic one from the op table: explain's sizing
// flags, checked before the GPU is looked for.
TEST(CliBench, EveryDescribedOpHasABenchWithTheTableFlags) {
  expect_error("bench qk_head_layernorm --rep 3", "bench qk_head_layernorm: unknown option --rep");
  expect_error("bench qk_head_layernorm --reps 0", "bench qk_head_layernorm: --reps must be an integer");
  expect_error("bench qk_head_layernorm --dims Q=5", "--dims: qk_head_layernorm has no dim 'Q'");
  expect_error("bench no_such_op", "unknown op 'no_such_op' (known: ");
  const CliRun r = cli("bench qk_head_layernorm --reps 2 --dims S=8");
  if (!gpu_present()) {
    EXPECT_EQ(r.status, 3) << r.out;  // no GPU here: nothing measured, its own exit code
    EXPECT_NE(r.out.find("needs a CUDA GPU"), std::string::npos) << r.out;
  } else {
    EXPECT_EQ(r.status, 0) << r.out;
    EXPECT_NE(r.out.find("qk_head_layernorm.jit"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("device_copy"), std::string::npos) << r.out;
  }
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
  // Sizes past what a flag takes: "too large" with the largest, not "not an integer".
  expect_error("explain qknorm_rope --shape 99999999999999999999,24,24,128",
               "--shape: T is too large: at most 999999999999999 but is 99999999999999999999");
  expect_error("explain qknorm_rope --dims T=9999999999999999",
               "--dims: T is too large: at most 999999999999999 but is 9999999999999999");
  EXPECT_EQ(cli("explain qknorm_rope --shape 00000000000000016,24,24,128 --device cpu").status, 0);
  // Sizes whose tensors cannot have distinct addresses: refused as such, not as an overlap.
  expect_error("explain qknorm_rope --shape 999999999999999,24,24,128 --device cpu",
               "qknorm_rope: the tensors of this call would take more than 2^56 bytes (q has 3 dims of sizes "
               "999999999999999,24,128)");
  const CliRun rga = cli("explain residual_gate_add --device cpu");
  EXPECT_EQ(rga.status, 0) << rga.out;
  EXPECT_NE(rga.out.find("* residual_gate_add.reference"), std::string::npos) << rga.out;
}

// ---------------------------------------------------------------- what a new user trips over (issue 33)

// Options are printed with hyphens, and both spellings are the same option everywhere.
TEST(CliNewUser, OptionNamesTakeHyphensOrUnderscores) {
  const CliRun ops = cli("ops qknorm_rope");
  ASSERT_EQ(ops.status, 0) << ops.out;
  EXPECT_NE(ops.out.find("option --is-neox "), std::string::npos) << ops.out;
  EXPECT_NE(ops.out.find("option --norm-weight-rounding "), std::string::npos) << ops.out;
  EXPECT_EQ(ops.out.find("--is_neox"), std::string::npos) << ops.out;
  const CliRun conv = cli("ops causal_conv3d_cat_pad");
  EXPECT_NE(conv.out.find("option --pad-w-left "), std::string::npos) << conv.out;
  // The same call either way; a bad value is refused under either spelling.
  const std::string call = "explain qknorm_rope --shape 16,24,24,128,32,64 --device cpu";
  const CliRun hyphen = cli(call + " --is-neox true --rope-dim 64"), underscore = cli(call + " --is_neox true --rope_dim 64");
  ASSERT_EQ(hyphen.status, 0) << hyphen.out;
  ASSERT_EQ(underscore.status, 0) << underscore.out;
  EXPECT_EQ(hyphen.out, underscore.out);
  expect_error("explain qknorm_rope --rope_dim abc", "qknorm_rope: option 'rope_dim' must be an integer but is 'abc'");
  expect_error("explain qknorm_rope --is_neox 1 --is-neox 0",
               "explain qknorm_rope: option --is-neox is given more than once");
  expect_error("explain causal_conv3d_cat_pad --pad_w_left 1 --pad_w_left 2",
               "explain causal_conv3d_cat_pad: option --pad-w-left is given more than once");
}

// A bench without a GPU: the reason on stderr, nothing on stdout, exit code 3 (not 0: a script
// must not take it for a measurement).
TEST(CliNewUser, BenchWithoutAGpuFailsOnStderr) {
  if (gpu_present()) GTEST_SKIP() << "a CUDA GPU is present: the bench runs";
  for (const char* op : {"qknorm_rope", "residual_gate_add", "fp8_linear"}) {
    const CliRun r = cli_streams(std::string("bench ") + op + " --reps 2");
    EXPECT_EQ(r.status, 3) << op << "\n" << r.out << r.err;
    EXPECT_EQ(r.out, "") << op;
    EXPECT_NE(r.err.find(std::string("ditops bench ") + op + ": "), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("needs a CUDA GPU"), std::string::npos) << r.err;
  }
}

// Words and sizes a command would have ignored or filled in are refused by name.
TEST(CliNewUser, ExtraWordsShortShapesAndRepeatedDimsAreRefused) {
  expect_error("ops extra", "unknown op 'extra' (known: ");
  expect_error("list extra", "list: unexpected argument 'extra' (list takes none)");
  expect_error("info extra", "info: unexpected argument 'extra' (info takes none)");
  expect_error("demo extra", "demo: unexpected argument 'extra' (demo takes none)");
  const CliRun one = cli("ops residual_gate_add");  // a named op: that op alone
  ASSERT_EQ(one.status, 0) << one.out;
  EXPECT_EQ(one.out.rfind("residual_gate_add: ", 0), 0u) << one.out;
  EXPECT_EQ(one.out.find("qknorm_rope:"), std::string::npos) << one.out;
  // qknorm_rope's P and R follow T and D, so 4 to 6 sizes; every dim of causal_conv3d_cat_pad is free.
  expect_error("explain qknorm_rope --shape 1,2",
               "--shape takes 4 to 6 sizes (T,Hq,Hk,D[,P,R]) but has 2; to set some dims only, use --dims NAME=N");
  expect_error("explain causal_conv3d_cat_pad --shape 1,2,3",
               "--shape takes 6 sizes (B,C,T,H,W,CT) but has 3");
  expect_error("explain qknorm_rope --shape 1,2,3,4,5,6,7", "--shape takes 4 to 6 sizes (T,Hq,Hk,D[,P,R]) but has 7");
  expect_error("explain qknorm_rope --dims D=128,D=64", "--dims names D twice (D=128 and D=64)");
  EXPECT_EQ(cli("explain qknorm_rope --shape 16,24,24,128 --device cpu").status, 0);
  EXPECT_EQ(cli("explain qknorm_rope --shape 16,24,24,128,32,64 --device cpu").status, 0);
}

TEST(CliNewUser, VersionAndShortHelp) {
  const CliRun version = cli_streams("--version");
  EXPECT_EQ(version.status, 0) << version.out << version.err;
  EXPECT_EQ(version.out.rfind("ditops ", 0), 0u) << version.out;
  EXPECT_EQ(version.out.find('\n'), version.out.size() - 1) << "one line: " << version.out;
  EXPECT_EQ(cli("info").out.find(version.out), 0u) << "info starts with the same version line";
  const CliRun h = cli_streams("-h"), help = cli_streams("--help");
  EXPECT_EQ(h.status, 0) << h.err;
  EXPECT_NE(h.out.find("usage: ditops"), std::string::npos) << h.out;
  EXPECT_EQ(h.out, help.out);
  const CliRun sub = cli_streams("explain -h");
  EXPECT_EQ(sub.status, 0) << sub.err;
  EXPECT_EQ(sub.out, help.out);
  // No command: the usage on stderr, exit 2; an unknown command says which.
  const CliRun none = cli_streams("");
  EXPECT_EQ(none.status, 2);
  EXPECT_EQ(none.out, "");
  EXPECT_NE(none.err.find("usage: ditops"), std::string::npos) << none.err;
  // A command that needs a word after it, given none: the usage on stderr, exit 2.
  for (const char* bare : {"cache", "bench"}) {
    const CliRun r = cli_streams(bare);
    EXPECT_EQ(r.status, 2) << bare << "\n" << r.err;
    EXPECT_EQ(r.out, "") << bare;
    EXPECT_NE(r.err.find(std::string("ditops ") + bare + ": "), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("usage: ditops"), std::string::npos) << r.err;
  }
  const CliRun unknown = cli_streams("lst");
  EXPECT_EQ(unknown.status, 2);
  EXPECT_EQ(unknown.out, "");
  EXPECT_NE(unknown.err.find("ditops: unknown command 'lst'"), std::string::npos) << unknown.err;
  // Errors go to stderr alone.
  const CliRun error = cli_streams("list --wide");
  EXPECT_EQ(error.status, 1);
  EXPECT_EQ(error.out, "");
  EXPECT_NE(error.err.find("ditops: error: list: unknown option --wide"), std::string::npos) << error.err;
}

// Nothing eligible at the default quality, but a close implementation would take the call at a
// higher tier: explain says which tier and which implementation (here qknorm_rope's fp32 rounding,
// whose kernels are close, on a simulated sm_90 where the CPU reference cannot run).
TEST(CliNewUser, ExplainNamesTheTierThatWouldChooseAnImplementation) {
  const CliRun r = cli("explain qknorm_rope --shape 16,24,24,128 --rounding fp32 --sm 90");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("no eligible implementation at quality exact; quality "), std::string::npos) << r.out;
  const size_t at = r.out.find(" would choose qknorm_rope.");
  ASSERT_NE(at, std::string::npos) << r.out;
  // The named implementation is what that tier chooses.
  const std::string tier = r.out.substr(r.out.rfind("quality ", at) + 8, at - r.out.rfind("quality ", at) - 8);
  const std::string chosen = r.out.substr(at + 14, r.out.find(' ', at + 14) - at - 14);
  const CliRun at_tier = cli("explain qknorm_rope --shape 16,24,24,128 --rounding fp32 --sm 90 --quality " + tier);
  EXPECT_NE(at_tier.out.find("* " + chosen + " "), std::string::npos) << tier << " " << chosen << "\n" << at_tier.out;
  EXPECT_EQ(at_tier.out.find("would choose"), std::string::npos) << at_tier.out;
  // Refused for another reason than the contract (the CPU reference on a CUDA device): no tier named.
  const CliRun cpu_only = cli("explain qknorm_rope --shape 16,24,24,128 --device cpu --backend jit");
  EXPECT_EQ(cpu_only.out.find("would choose"), std::string::npos) << cpu_only.out;
  // NVFP4 with the hardware E2M1 conversion on sm_90, which lacks the instruction: the device is
  // named, and no quality tier (none would change it).
  const CliRun nvfp4 =
      cli("explain norm_scale_shift --with nvfp4_packed,nvfp4_scales,global_scale --e2m1 hardware --sm 90");
  ASSERT_EQ(nvfp4.status, 0) << nvfp4.out;
  EXPECT_NE(nvfp4.out.find("needs cvt.rn.satfinite.e2m1x2.f32 (sm_100a / sm_103a / sm_120a); this device is sm_90"),
            std::string::npos) << nvfp4.out;
  EXPECT_NE(nvfp4.out.find("no eligible implementation at any quality"), std::string::npos) << nvfp4.out;
  EXPECT_EQ(nvfp4.out.find("at quality exact"), std::string::npos) << nvfp4.out;
  // The default conversion (automatic) takes the software E2M1 there.
  const CliRun automatic = cli("explain norm_scale_shift --with nvfp4_packed,nvfp4_scales,global_scale --sm 90");
  EXPECT_NE(automatic.out.find("* norm_scale_shift.jit "), std::string::npos) << automatic.out;
  EXPECT_NE(automatic.out.find("fp4sw"), std::string::npos) << automatic.out;
}

// Without a GPU the demo runs the CPU reference and says that nothing was compared.
TEST(CliNewUser, DemoSaysWhatItDid) {
  const CliRun r = cli("demo");
  ASSERT_EQ(r.status, 0) << r.out;
  if (gpu_present()) {
    EXPECT_NE(r.out.find("check against the CPU reference"), std::string::npos) << r.out;
  } else {
    EXPECT_NE(r.out.find("ran qknorm_rope.reference (the CPU reference)"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("nothing was checked"), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("check against"), std::string::npos) << r.out;
  }
}

// Configure without the CUDA headers stops at once and says what is missing, where it looked and
// how to point at a toolkit (not later, at the first #include <cuda.h> of the build).
TEST(CliNewUser, ConfigureWithoutTheCudaHeadersNamesWhatIsMissing) {
  const std::string work = std::string(DITOPS_TEST_WORK_DIR) + "/configure-without-cuda";
  const std::string fake = work + "/fake-toolkit";
  std::system(("rm -rf '" + work + "' && mkdir -p '" + fake + "/include' && touch '" + fake + "/include/cuda.h'").c_str());
  auto configure = [&](const std::string& root) {
    CliRun r;
    const std::string command = std::string("'") + DITOPS_CMAKE_COMMAND + "' -S '" + DITOPS_SOURCE_DIR + "' -B '" + work +
                                "/build' -DDITOPS_CUDA_ROOT=" + root + " -DCUDAToolkit_ROOT=" + root +
                                " -DDITOPS_BUILD_TESTS=OFF -DDITOPS_BUILD_PYTHON=OFF 2>&1";
    FILE* pipe = popen(command.c_str(), "r");
    if (!pipe) return r;
    r.out = read_all(pipe);
    const int status = pclose(pipe);
    r.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    std::system(("rm -rf '" + work + "/build'").c_str());
    return r;
  };
  // CMake wraps the message at spaces: compare with the spaces and line breaks taken out.
  auto flat = [](std::string text) {
    std::string out;
    for (char c : text)
      if (c != ' ' && c != '\n') out += c;
    return out;
  };
  const CliRun none = configure("/nonexistent");
  EXPECT_NE(none.status, 0) << none.out;
  EXPECT_NE(flat(none.out).find(flat("missing CUDA toolkit headers: cuda.h, nvrtc.h, cublasLt.h (looked in "
                                     "/nonexistent/include: DITOPS_CUDA_ROOT=/nonexistent)")),
            std::string::npos) << none.out;
  EXPECT_NE(flat(none.out).find(flat("-DDITOPS_CUDA_ROOT=/path/to/cuda")), std::string::npos) << none.out;
  // A pip user passes CMake definitions through scikit-build-core's config settings.
  EXPECT_NE(flat(none.out).find(flat("pip install . -C cmake.define.DITOPS_CUDA_ROOT=/path/to/cuda")), std::string::npos)
      << none.out;
  EXPECT_EQ(none.out.find("Generating done"), std::string::npos) << none.out;
  // A toolkit folder with cuda.h alone: the two others are named.
  const CliRun half = configure(fake);
  EXPECT_NE(half.status, 0) << half.out;
  EXPECT_NE(flat(half.out).find(flat("missing CUDA toolkit headers: nvrtc.h, cublasLt.h (looked in " + fake + "/include:")),
            std::string::npos) << half.out;
  // cuda.h and nvrtc.h without the cuBLAS development headers: cublasLt.h alone, at configure.
  std::system(("touch '" + fake + "/include/nvrtc.h'").c_str());
  const CliRun no_cublas = configure(fake);
  EXPECT_NE(no_cublas.status, 0) << no_cublas.out;
  EXPECT_NE(flat(no_cublas.out).find(flat("missing CUDA toolkit headers: cublasLt.h (looked in " + fake + "/include:")),
            std::string::npos) << no_cublas.out;
  std::system(("rm -rf '" + work + "'").c_str());
}

}  // namespace
