// Prints every op's test cases as JSON (tests/python/test_ops_eager.py reads it): the same cases
// the C++ driver runs, with each implicit output made explicit. `--count`: what the driver checks,
// per op and property, as tab-separated lines (op, property, cases, of them checked without a
// device) for tests/checked_cases.py. Cases of one call (call_key: they differ in name or seed
// alone) count once: each property as often as the case that checks it most often.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <utility>

#include "op_test_driver.h"

int main(int argc, char** argv) {
  using namespace ditops::optest;
  if (argc > 1 && std::strcmp(argv[1], "--count") == 0) {
    using Tally = std::map<std::string, std::pair<int, int>>;  // property -> (checks, of them without a device)
    std::map<std::pair<std::string, std::string>, Tally> calls;  // (op, call key)
    int repeated = 0;
    for (const OpCase& c : cases()) {
      Tally mine;
      for (const CheckedProperty& p : checked_properties(c)) {
        ++mine[p.name].first;
        mine[p.name].second += p.on_cpu;
      }
      const auto [it, fresh] = calls.try_emplace({c.op, call_key(c)});
      repeated += !fresh;
      for (const auto& [name, n] : mine) {
        auto& best = it->second[name];
        best = {std::max(best.first, n.first), std::max(best.second, n.second)};
      }
    }
    std::map<std::pair<std::string, std::string>, std::pair<int, int>> counts;  // (op, property)
    for (const auto& [call, tally] : calls)
      for (const auto& [name, n] : tally) {
        auto& total = counts[{call.first, name}];
        total.first += n.first;
        total.second += n.second;
      }
    for (const auto& [key, n] : counts)
      std::printf("%s\t%s\t%d\t%d\n", key.first.c_str(), key.second.c_str(), n.first, n.second);
    std::fprintf(stderr, "%d cases repeat another case's call (their name or seed apart): counted once\n", repeated);
    return 0;
  }
  std::fputs(cases_json().c_str(), stdout);
  return 0;
}
