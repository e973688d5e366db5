// Links against an installed ditops through find_package and lists the registry.
#include <ditops/registry.h>

#include <cstdio>

int main() {
  const auto specs = ditops::Registry::global().list("qknorm_rope");
  std::printf("consumer sees %zu qknorm_rope implementations\n", specs.size());
  return specs.empty() ? 1 : 0;
}
