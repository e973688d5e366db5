#include "core/builtin_ops.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

namespace ditops {

namespace {
// Filled during static initialization of the library's op files (a function-local static, so the
// order in which those files initialize does not matter).
std::vector<std::pair<std::string, RegisterOp>>& registrations() {
  static std::vector<std::pair<std::string, RegisterOp>> list;
  return list;
}
}  // namespace

OpRegistration::OpRegistration(const char* name, RegisterOp registration) {
  registrations().emplace_back(name, registration);
}

void register_builtin_ops(Registry& registry) {
  auto list = registrations();
  std::sort(list.begin(), list.end());  // the same op order whatever the link order
  for (const auto& [name, registration] : list) registration(registry);
}

}  // namespace ditops
