// Prints every op's test cases as JSON (tests/python/test_ops_eager.py reads it): the same cases
// the C++ driver runs, with each implicit output made explicit.
#include <cstdio>

#include "op_test_driver.h"

int main() {
  std::fputs(ditops::optest::cases_json().c_str(), stdout);
  return 0;
}
