// Small helpers shared by the CLI's commands.
#pragma once

#include <cstdint>
#include <ctime>
#include <map>
#include <string>
#include <vector>

namespace ditops::cli {

// "--flag value" and "--switch" arguments after the command words.
struct Args {
  std::vector<std::string> words;
  std::map<std::string, std::string> flags;
  std::vector<std::string> missing_value;  // flags given last without their value
  std::vector<std::string> repeated;       // flags given more than once (refused)
  std::string get(const std::string& flag, const std::string& fallback) const {
    auto it = flags.find(flag);
    return it == flags.end() ? fallback : it->second;
  }
  bool has(const std::string& flag) const { return flags.count(flag) != 0; }
};

// An integer flag's value: decimal digits (an optional leading '-') in [lo, hi]; otherwise throws
// Error("<command>: <flag> must be an integer in [lo, hi] but is '<text>'") (`what` adds a hint).
int64_t int_flag(const Args& args, const std::string& command, const std::string& flag, int64_t fallback, int64_t lo,
                 int64_t hi, const std::string& what = "");

inline std::string today() {
  char buf[16];
  std::time_t now = std::time(nullptr);
  std::strftime(buf, sizeof buf, "%Y-%m-%d", std::gmtime(&now));
  return buf;
}

// Exit codes: 0 done, 1 an error (the message on stderr), 2 a usage error (no command, an unknown
// one), 3 `bench` without a usable CUDA GPU (nothing was measured; the reason on stderr).
inline constexpr int kExitError = 1;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitNoGpu = 3;

int run_demo(const Args& args);
int cmd_cache(const Args& args);  // tools/cli_cache.cpp

}  // namespace ditops::cli
