// Typed registration: an op adds its implementations with functions that take its own call
// struct. The registry stores them type-erased (KernelSpec); the one cast back happens here, and
// Registry::add refuses an op whose implementations were registered for different call types.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "ditops/registry.h"
#include "core/kernel_request.h"

namespace ditops {

// The address identifies the call type (KernelSpec::call_type).
template <typename Call>
const void* call_type_tag() {
  static const char tag = 0;
  return &tag;
}

template <typename Call>
struct Implementation {
  std::string name;  // "<op>.<variant>"
  Provenance provenance = Provenance::reference;
  std::vector<Capability> capabilities;
  Contract contract;
  std::string description;
  std::function<std::string()> availability;                // "" when usable on this machine
  std::function<std::string(const Call&)> predicate;        // "" when it takes the call
  std::function<std::string(const Call&)> template_key;     // compile-time parameters, or none
  std::function<void(const Call&)> run;
  std::function<std::vector<KernelRequest>()> prebuilt;  // aot only: what the build compiles
  std::function<std::vector<KernelRequest>()> variants;  // jit: what the compile test builds
};

template <typename Call>
void add_implementation(Registry& registry, const std::string& op, Implementation<Call> impl) {
  KernelSpec spec;
  spec.op = op;
  spec.name = std::move(impl.name);
  spec.provenance = impl.provenance;
  spec.capabilities = std::move(impl.capabilities);
  spec.contract = std::move(impl.contract);
  spec.description = std::move(impl.description);
  spec.availability = std::move(impl.availability);
  spec.call_type = call_type_tag<Call>();
  auto as_call = [](const void* p) -> const Call& { return *static_cast<const Call*>(p); };
  spec.predicate = [f = std::move(impl.predicate), as_call](const void* p) { return f ? f(as_call(p)) : ""; };
  if (impl.template_key)
    spec.template_key = [f = std::move(impl.template_key), as_call](const void* p) { return f(as_call(p)); };
  spec.run = [f = std::move(impl.run), as_call](const void* p) { f(as_call(p)); };
  spec.prebuilt = std::move(impl.prebuilt);
  spec.variants = std::move(impl.variants);
  registry.add(std::move(spec));
}

// The CPU reference of an op: takes every call whose tensors are on the CPU.
template <typename Call>
Implementation<Call> reference_implementation(const std::string& op, Device (*device_of)(const Call&),
                                              void (*run)(const Call&), Contract contract, std::string description) {
  Implementation<Call> impl;
  impl.name = op + ".reference";
  impl.provenance = Provenance::reference;
  impl.capabilities = {{DeviceKind::cpu, 0, 1 << 20, 0}};
  impl.contract = std::move(contract);
  impl.description = std::move(description);
  impl.predicate = [device_of](const Call& c) -> std::string {
    return device_of(c).kind == DeviceKind::cpu ? "" : "the tensors are not on the cpu";
  };
  impl.run = run;
  return impl;
}

}  // namespace ditops
