// The fuzzing entry shared by the libFuzzer target (fuzz/fuzz_libfuzzer.cpp, clang,
// -DDITOPS_BUILD_FUZZ=ON) and the deterministic replay test (fuzz/fuzz_replay.cpp, any compiler,
// ctest fuzz_replay). docs/hostile_input.md describes both and a longer run.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace ditops_fuzz {

// The fuzz input as a stream of bytes; zeros past its end.
class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  uint8_t u8() { return pos_ < size_ ? data_[pos_++] : 0; }
  uint64_t u64() {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(u8()) << (8 * i);
    return v;
  }
  int64_t pick(int64_t n) { return n > 0 ? u8() % n : 0; }
  bool flag() { return u8() & 1; }
  // 0 -> 1, ..., n-1 -> 0: a zero byte gives a small valid size.
  int64_t size_or_zero(int64_t n) { return (u8() % n + 1) % n; }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

// A misbehaviour of the library: printed and aborted, so that libFuzzer and fuzz_replay both
// report it with its input.
[[noreturn]] inline void report_finding(const char* target, const std::string& what) {
  std::fprintf(stderr, "ditops fuzz finding%s: %s\n", target, what.c_str());
  std::fflush(stderr);
  std::abort();
}

// Decodes `data` into one hostile call (DLPack import, or one op's C++ facade on CPU tensors in
// a guarded arena) and runs it. Returns normally when ditops accepted the input or threw
// ditops::Error; aborts (a finding) on any other exception, on a call that should have been
// refused but ran, or on an invariant broken by an accepted input. Crashes are findings too.
void run_one(const uint8_t* data, size_t size);

// Outcome counts since the start, per target (0: DLPack import, 1..6: the ops): accepted and
// ran, refused with ditops::Error, skipped (the caller would lie about its memory).
struct Counts {
  size_t ran = 0, refused = 0, skipped = 0;
};
const Counts* counts();  // kTargets entries
constexpr int kTargets = 7;
const char* target_name(int target);

// Hand-written inputs: the repros and one valid call of every op (the fixed corpus).
std::vector<std::vector<uint8_t>> seed_corpus();

// The C ABI target (fuzz/fuzz_c_abi.cpp): one hostile ditops_call or ditops_explain of any op
// of the table on CPU tensors in a guarded arena. Aborts on a finding like run_one.
void run_c_abi(const uint8_t* data, size_t size);
struct CAbiCounts {
  size_t ran = 0, refused = 0, skipped = 0;
};
const CAbiCounts& c_abi_counts();
// A valid call and an explain of every op, unknown and NULL op names, the C ABI repros.
std::vector<std::vector<uint8_t>> c_abi_seed_corpus();

}  // namespace ditops_fuzz
