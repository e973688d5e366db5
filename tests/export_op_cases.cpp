// Prints every op's test cases as JSON (tests/python/test_ops_eager.py reads it): the same cases
// the C++ driver runs, with each implicit output made explicit. `--count`: what the driver checks,
// per op and property, as tab-separated lines (op, property, cases, of them checked without a
// device) for tests/checked_cases.py.
#include <cstdio>
#include <cstring>
#include <map>
#include <utility>

#include "op_test_driver.h"

int main(int argc, char** argv) {
  using namespace ditops::optest;
  if (argc > 1 && std::strcmp(argv[1], "--count") == 0) {
    std::map<std::pair<std::string, std::string>, std::pair<int, int>> counts;
    for (const OpCase& c : cases())
      for (const CheckedProperty& p : checked_properties(c)) {
        auto& n = counts[{c.op, p.name}];
        ++n.first;
        n.second += p.on_cpu;
      }
    for (const auto& [key, n] : counts)
      std::printf("%s\t%s\t%d\t%d\n", key.first.c_str(), key.second.c_str(), n.first, n.second);
    return 0;
  }
  std::fputs(cases_json().c_str(), stdout);
  return 0;
}
