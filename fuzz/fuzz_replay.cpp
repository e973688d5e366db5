// Deterministic replay of the fuzz targets (ctest fuzz_replay; any compiler): for each target
// (`entry`: DLPack import and the C++ facades, fuzz/fuzz_entry.cpp; `c_abi`: ditops_call and
// ditops_explain, fuzz/fuzz_c_abi.cpp) the seed corpus, files given on the command line (e.g.
// crash-* files from a libFuzzer run), then N inputs from a seeded PRNG, half of them mutations
// of the seeds.
//   fuzz_replay [--target entry|c_abi|all] [--random N] [--random-c-abi N] [--seed S]
//               [--write-corpus DIR] [FILE|DIR ...]
// --random-c-abi: the random inputs of the C ABI target (default: --random; its calls run the
// references at larger sizes, about 5x slower per input).
// --write-corpus writes the seeds of one target (default entry) for a libFuzzer run.
#include <fcntl.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "fuzz/fuzz_entry.h"

namespace fs = std::filesystem;

namespace {
// The input being run, written to fuzz-crash.bin (in the working directory) when it crashes or
// aborts, for `fuzz_replay fuzz-crash.bin` or the libFuzzer binary.
const std::vector<uint8_t>* g_current = nullptr;

void dump_current(int sig) {
  if (g_current) {
    const int fd = open("fuzz-crash.bin", O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      ssize_t unused = write(fd, g_current->data(), g_current->size());
      (void)unused;
      close(fd);
    }
    const char msg[] = "fuzz_replay: the crashing input is in fuzz-crash.bin\n";
    ssize_t unused = write(2, msg, sizeof msg - 1);
    (void)unused;
  }
  signal(sig, SIG_DFL);
  raise(sig);
}

std::vector<uint8_t> read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The seeds, the files and `random_inputs` PRNG inputs through `run`; returns the seed count.
size_t replay(const std::vector<std::vector<uint8_t>>& corpus, void (*run)(const uint8_t*, size_t),
              const std::vector<fs::path>& paths, long random_inputs, unsigned long seed, size_t* files) {
  for (const auto& input : corpus) {
    g_current = &input;
    run(input.data(), input.size());
  }
  for (const fs::path& p : paths) {
    std::vector<fs::path> list;
    if (fs::is_directory(p)) {
      for (const auto& e : fs::directory_iterator(p))
        if (e.is_regular_file()) list.push_back(e.path());
    } else {
      list.push_back(p);
    }
    for (const fs::path& f : list) {
      const auto bytes = read_file(f);
      g_current = &bytes;
      std::printf("replay %s (%zu bytes)\n", f.c_str(), bytes.size());
      std::fflush(stdout);
      run(bytes.data(), bytes.size());
      ++*files;
    }
  }
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> input;
  for (long n = 0; n < random_inputs; ++n) {
    if (n % 2 == 0) {  // fresh bytes, the first one a target
      input.resize(1 + rng() % 160);
      for (auto& b : input) b = static_cast<uint8_t>(rng());
    } else {  // a seed with a few bytes changed or appended
      input = corpus[rng() % corpus.size()];
      const int edits = 1 + static_cast<int>(rng() % 4);
      for (int e = 0; e < edits; ++e) {
        const size_t at = rng() % (input.size() + 8);
        if (at >= input.size()) input.resize(at + 1);
        input[at] = static_cast<uint8_t>(rng());
      }
    }
    g_current = &input;
    run(input.data(), input.size());
  }
  return corpus.size();
}

}  // namespace

int main(int argc, char** argv) {
  long random_inputs = 20000, random_c_abi = -1;
  unsigned long seed = 1;
  std::string write_dir;
  std::string target = "all";
  std::vector<fs::path> paths;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--target" && i + 1 < argc) target = argv[++i];
    else if (a == "--random" && i + 1 < argc) random_inputs = std::atol(argv[++i]);
    else if (a == "--random-c-abi" && i + 1 < argc) random_c_abi = std::atol(argv[++i]);
    else if (a == "--seed" && i + 1 < argc) seed = std::strtoul(argv[++i], nullptr, 10);
    else if (a == "--write-corpus" && i + 1 < argc) write_dir = argv[++i];
    else paths.emplace_back(a);
  }
  if (target != "entry" && target != "c_abi" && target != "all") {
    std::fprintf(stderr, "fuzz_replay: --target must be entry, c_abi or all but is '%s'\n", target.c_str());
    return 2;
  }
  for (int sig : {SIGSEGV, SIGBUS, SIGABRT, SIGFPE, SIGILL}) signal(sig, dump_current);
  if (!write_dir.empty()) {
    const auto corpus = target == "c_abi" ? ditops_fuzz::c_abi_seed_corpus() : ditops_fuzz::seed_corpus();
    fs::create_directories(write_dir);
    for (size_t i = 0; i < corpus.size(); ++i) {
      std::ofstream out(fs::path(write_dir) / ("seed-" + std::to_string(i)), std::ios::binary);
      out.write(reinterpret_cast<const char*>(corpus[i].data()), static_cast<std::streamsize>(corpus[i].size()));
    }
    std::printf("wrote %zu seeds to %s\n", corpus.size(), write_dir.c_str());
    return 0;
  }
  size_t seeds = 0, files = 0;
  for (const bool c_abi : {false, true}) {
    if (target != "all" && (target == "c_abi") != c_abi) continue;
    seeds += replay(c_abi ? ditops_fuzz::c_abi_seed_corpus() : ditops_fuzz::seed_corpus(),
                    c_abi ? ditops_fuzz::run_c_abi : ditops_fuzz::run_one, paths,
                    c_abi && random_c_abi >= 0 ? random_c_abi : random_inputs, seed, &files);
  }
  g_current = nullptr;
  for (int t = 0; t < ditops_fuzz::kTargets; ++t) {
    const auto& c = ditops_fuzz::counts()[t];
    std::printf("  %-24s ran %6zu  refused %6zu  skipped %6zu\n", ditops_fuzz::target_name(t), c.ran, c.refused,
                c.skipped);
  }
  const auto& c = ditops_fuzz::c_abi_counts();
  std::printf("  %-24s ran %6zu  refused %6zu  skipped %6zu\n", "c_abi (ditops_call)", c.ran, c.refused, c.skipped);
  std::printf("fuzz_replay: %zu seeds, %zu files, %ld random inputs (C ABI: %ld) (seed %lu): no finding\n", seeds,
              files, random_inputs, random_c_abi >= 0 ? random_c_abi : random_inputs, seed);
  return 0;
}
