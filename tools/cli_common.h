// Small helpers shared by the CLI's commands.
#pragma once

#include <ctime>
#include <map>
#include <string>
#include <vector>

namespace ditops::cli {

// "--flag value" and "--switch" arguments after the command words.
struct Args {
  std::vector<std::string> words;
  std::map<std::string, std::string> flags;
  std::string get(const std::string& flag, const std::string& fallback) const {
    auto it = flags.find(flag);
    return it == flags.end() ? fallback : it->second;
  }
  bool has(const std::string& flag) const { return flags.count(flag) != 0; }
};

inline std::string today() {
  char buf[16];
  std::time_t now = std::time(nullptr);
  std::strftime(buf, sizeof buf, "%Y-%m-%d", std::gmtime(&now));
  return buf;
}

int run_demo(const Args& args);
int cmd_cache(const Args& args);  // tools/cli_cache.cpp

}  // namespace ditops::cli
