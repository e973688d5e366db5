// Every op family registers its description and implementations with one DITOPS_REGISTER_OP line
// in its host file. The global registry runs the registrations, ordered by op, when it is first
// used; nothing else lists the ops.
#pragma once

namespace ditops {
class Registry;

using RegisterOp = void (*)(Registry&);
void register_builtin_ops(Registry& registry);

struct OpRegistration {
  OpRegistration(const char* name, RegisterOp registration);
};

}  // namespace ditops

#define DITOPS_REGISTER_OP(function) \
  static const ::ditops::OpRegistration function##_registration(#function, function)
