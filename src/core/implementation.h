// Typed registration: an op adds its implementations with functions that take its own call
// struct and kernel key. The registry stores them type-erased (KernelSpec: functions of a
// `const void*`); that pointer is always a Dispatched<Call, Key>, made once per call by the op's
// dispatch, and the one cast back happens here (checked). Registry::add refuses an op whose
// implementations were registered for different call types.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "ditops/registry.h"

namespace ditops {

// The address identifies the call type (KernelSpec::call_type).
template <typename T>
const void* call_type_tag() {
  static const char tag = 0;
  return &tag;
}

// One call as every implementation of an op receives it: the matched call, its kernel key
// (computed once per call by the op's dispatch and passed on) and the device it runs on. `type`
// comes first so that a KernelSpec function handed anything else (the op's call struct itself)
// throws instead of reading it as a Dispatched.
template <typename Call, typename Key>
struct Dispatched {
  Dispatched(const Call& c, const Key& k, const DeviceInfo& d) : call(c), key(k), device(d) {}
  const void* const type = call_type_tag<Dispatched>();
  const Call& call;
  const Key& key;
  const DeviceInfo& device;
};

template <typename Call, typename Key>
struct Implementation {
  std::string name;  // "<op>.<variant>"
  Provenance provenance = Provenance::reference;
  std::vector<Capability> capabilities;
  Contract contract;
  std::string description;
  std::function<std::string()> availability;                       // "" when usable on this machine
  std::function<std::string(const Call&, const Key&)> predicate;   // "" when it takes the call
  std::function<void(const Call&, const Key&)> run;
  std::function<std::vector<KernelRequest>()> prebuilt;  // aot only: what the build compiles
  std::function<std::vector<KernelRequest>()> variants;  // jit: what the compile test builds
};

// The Dispatched call behind a KernelSpec function's `const void*`.
template <typename D>
const D& dispatched_call(const void* p, const std::string& name) {
  const D& d = *static_cast<const D*>(p);
  if (d.type != call_type_tag<D>())
    throw Error(name + ": a KernelSpec function takes the Dispatched call dispatch() makes (core/implementation.h), "
                "not the op's call struct: run the op through its facade or the registry");
  return d;
}

template <typename Call, typename Key>
void add_implementation(Registry& registry, const std::string& op, Implementation<Call, Key> impl) {
  using D = Dispatched<Call, Key>;
  KernelSpec spec;
  spec.op = op;
  spec.name = std::move(impl.name);
  spec.provenance = impl.provenance;
  spec.capabilities = std::move(impl.capabilities);
  spec.contract = std::move(impl.contract);
  spec.description = std::move(impl.description);
  spec.availability = std::move(impl.availability);
  spec.call_type = call_type_tag<D>();
  spec.predicate = [f = std::move(impl.predicate), name = spec.name](const void* p) {
    const D& d = dispatched_call<D>(p, name);
    return f ? f(d.call, d.key) : std::string();
  };
  // The kernel's compile-time parameters; a CPU call has none.
  spec.template_key = [name = spec.name](const void* p) {
    const D& d = dispatched_call<D>(p, name);
    return d.device.device.kind == DeviceKind::cuda ? d.key.to_string() : std::string();
  };
  spec.run = [f = std::move(impl.run), name = spec.name](const void* p) {
    const D& d = dispatched_call<D>(p, name);
    f(d.call, d.key);
  };
  spec.prebuilt = std::move(impl.prebuilt);
  spec.variants = std::move(impl.variants);
  registry.add(std::move(spec));
}

}  // namespace ditops
