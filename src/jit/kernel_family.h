// An op's CUDA kernels, declared once as a struct of static functions (its kernel family) and
// shared by its jit and aot implementations and by its facade:
//
//   struct TokenCatFp8Kernels {
//     using Call = TokenCatFp8Call;
//     using Key = TokenCatFp8Key;  // packed(): a uint64 naming the kernel; to_string(): the template key
//     static constexpr const char* op = "token_cat_fp8";
//     static constexpr const char* device_tensor = "attn";  // named when the stream is another device's
//     static Device device(const Call&);
//     static Key key(const Call&, const DeviceInfo&);
//     static KernelRequest request(const Key&);
//     static void launch(const Call&, const Key&, const jit::LoadedKernel&);
//     // Optional:
//     static bool nothing_to_do(const Call&);            // no launch, no compile
//     static std::string refusal(const Call&);           // CUDA calls no kernel takes
//     static std::vector<Key> prebuilt_keys();           // aot: the keys compiled into the library
//     static std::vector<Key> variant_keys();            // every code path (the compile test)
//     static uint64_t extra_signature(const Call&);      // predicate inputs the key does not carry,
//     static constexpr uint64_t extra_radix = N;         //   below extra_radix (decision cache)
//   };
//
// A call's path: the facade matches, dispatch<F>() computes the key once, and the registry hands
// the Dispatched call (core/implementation.h) to the chosen implementation, whose run resolves the
// kernel per (key, device) once (compile or prebuilt load, capture-safe) and launches.
#pragma once

#include <concepts>
#include <cstdint>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/implementation.h"
#include "core/op_builder.h"
#include "jit/cuda_driver.h"
#include "jit/first_use.h"
#include "jit/launch.h"
#include "jit/module_loader.h"
#include "jit/nvrtc.h"

namespace ditops {

template <typename F>
concept KernelFamily = requires(const typename F::Call& c, const typename F::Key& k, const DeviceInfo& info,
                                const jit::LoadedKernel& kernel) {
  { F::op } -> std::convertible_to<const char*>;
  { F::device_tensor } -> std::convertible_to<const char*>;
  { F::device(c) } -> std::same_as<Device>;
  { F::key(c, info) } -> std::same_as<typename F::Key>;
  { F::request(k) } -> std::same_as<KernelRequest>;
  F::launch(c, k, kernel);
  { k.packed() } -> std::same_as<uint64_t>;
  { k.to_string() } -> std::same_as<std::string>;
};

namespace family_detail {

template <typename F>
bool nothing_to_do(const typename F::Call& c) {
  if constexpr (requires { F::nothing_to_do(c); }) return F::nothing_to_do(c);
  else return false;
}

// Everything the implementations' predicates and template keys read from a call: its kernel key,
// the predicate inputs the key does not carry and the device kind.
template <typename F>
uint64_t signature(const typename F::Call& c, const typename F::Key& key, const DeviceInfo& info) {
  uint64_t radix = 1, extra = 0;
  if constexpr (requires { F::extra_signature(c); }) {
    radix = F::extra_radix;
    extra = F::extra_signature(c);
  }
  return ((key.packed() * radix + extra) * 4) + static_cast<uint64_t>(info.device.kind) + 1;
}

}  // namespace family_detail

// The op's facade after matching: checks the stream, computes the kernel key once and dispatches
// with the decision cache. Returns the implementation that ran.
template <KernelFamily F>
std::string dispatch(const typename F::Call& c, Stream stream, const DispatchOptions& options) {
  const Device d = F::device(c);
  const DeviceInfo& info = device_info(d);
  jit::bind_and_check_stream(F::op, F::device_tensor, d, stream);
  const typename F::Key key = F::key(c, info);
  const Dispatched<typename F::Call, typename F::Key> call{c, key, info};
  return Registry::global().dispatch(F::op, &call, info, options, family_detail::signature<F>(c, key, info)).name;
}

template <KernelFamily F>
DispatchReport explain(const typename F::Call& c, const DispatchOptions& options) {
  const DeviceInfo& info = device_info(F::device(c));
  const typename F::Key key = F::key(c, info);
  const Dispatched<typename F::Call, typename F::Key> call{c, key, info};
  return Registry::global().explain(F::op, &call, info, options);
}

// ---------------------------------------------------------------- an op's entries, from its description

// An op's description getter (`const OpBuilder<Args, Call>& description()`) and kernel family give
// its C++ entries (include/ditops/op_function.h) and its op-table entry:
//
//   const OpFunction<std::string, ScaleAddCall> scale_add{op_run<description, Kernels>};
//   const OpFunction<ScaleAddCall, ScaleAddCall> match_scale_add{op_match<description>};
//   describe_op<description, Kernels>(registry);   // in the op's registration
template <auto Description>
using BuilderOf = std::remove_cvref_t<decltype(Description())>;

namespace family_detail {

template <auto Description, KernelFamily F>
std::string run_op(typename BuilderOf<Description>::ArgsType& a, Stream stream) {
  const auto& b = Description();
  if constexpr (BuilderOf<Description>::kInPlace) {
    b.match_in_place(a, stream);
    b.run_checks(a);
    return dispatch<F>(a, stream, a.options.dispatch);
  } else {
    const typename F::Call c = b.matched(a, stream);
    b.run_checks(c);
    return dispatch<F>(c, stream, c.options.dispatch);
  }
}

template <auto Description>
void match_in_place(typename BuilderOf<Description>::CallType& c, Stream stream) {
  Description().match_in_place(c, stream);
}

template <auto Description>
typename BuilderOf<Description>::CallType match_call(typename BuilderOf<Description>::ArgsType& a, Stream stream) {
  return Description().matched(a, stream);
}

template <auto Description, KernelFamily F>
DispatchReport explain_op(typename BuilderOf<Description>::ArgsType& a) {
  const typename F::Call c = Description().matched(a, nullptr);
  return explain<F>(c, c.options.dispatch);
}

}  // namespace family_detail

// <op>(...): match, the run's own checks, dispatch.
template <auto Description, KernelFamily F>
constexpr auto op_run = &family_detail::run_op<Description, F>;

// match_<op>(...): the call every implementation receives.
template <auto Description>
constexpr auto op_match = [] {
  if constexpr (BuilderOf<Description>::kInPlace) return &family_detail::match_in_place<Description>;
  else return &family_detail::match_call<Description>;
}();

// The op's table entry (ditops::call, explain, every binding): its run and explain from a generic call.
template <auto Description, KernelFamily F>
void describe_op(Registry& registry) {
  registry.describe(Description().build(op_run<Description, F>, &family_detail::explain_op<Description, F>));
}

namespace jit {
inline std::string nvrtc_availability() {
  std::string why;
  if (!cuda_driver(&why)) return why;
  if (nvrtc_version(&why) == 0) return why;
  return "";
}
}  // namespace jit

namespace family_detail {

template <KernelFamily F>
std::string cuda_refusal(const typename F::Call& c) {
  if (F::device(c).kind != DeviceKind::cuda) return "the tensors are on the cpu";
  if constexpr (requires { F::refusal(c); }) return F::refusal(c);
  else return "";
}

template <KernelFamily F>
std::vector<KernelRequest> requests(const std::vector<typename F::Key>& keys) {
  std::vector<KernelRequest> out;
  for (const auto& key : keys) out.push_back(F::request(key));
  return out;
}

// The run of a jit or aot implementation: the call's kernel from `memo` (resolved by load(key,
// device index) the first time per key and device, capture-safe: jit/first_use.h), the launch.
template <KernelFamily F, typename Load>
void run_memoized(jit::KernelMemo& memo, const typename F::Call& c, const typename F::Key& key, const Load& load) {
  if (nothing_to_do<F>(c)) return;
  const Device d = F::device(c);
  const jit::LoadedKernel& kernel =
      memo.get(key.packed() * 64 + static_cast<uint64_t>(d.index), [&]() -> const jit::LoadedKernel& {
        return jit::first_use(static_cast<CUstream>(c.stream), std::string(F::op) + " kernel " + key.to_string(),
                              [&]() -> const jit::LoadedKernel& { return load(key, d.index); });
      });
  jit::bind_primary_context(d.index);
  F::launch(c, key, kernel);
}

}  // namespace family_detail

// Kernels compiled at first use by NVRTC for the device's exact arch, memoized per key and device.
template <KernelFamily F>
Implementation<typename F::Call, typename F::Key> jit_implementation() {
  using Call = typename F::Call;
  using Key = typename F::Key;
  Implementation<Call, Key> impl;
  impl.provenance = Provenance::jit;
  impl.availability = jit::nvrtc_availability;
  impl.predicate = [](const Call& c, const Key&) { return family_detail::cuda_refusal<F>(c); };
  impl.run = [](const Call& c, const Key& key) {
    static jit::KernelMemo memo;
    family_detail::run_memoized<F>(memo, c, key, [](const Key& k, int device) -> const jit::LoadedKernel& {
      return jit::jit_kernel(F::request(k), device);
    });
  };
  if constexpr (requires { F::variant_keys(); })
    impl.variants = [] { return family_detail::requests<F>(F::variant_keys()); };
  return impl;
}

// Kernels compiled by nvcc at build time for the keys F::prebuilt_keys lists; a call whose key is
// not among them is refused by the predicate (the jit takes it).
template <KernelFamily F>
Implementation<typename F::Call, typename F::Key> aot_implementation() {
  using Call = typename F::Call;
  using Key = typename F::Key;
  Implementation<Call, Key> impl;
  impl.provenance = Provenance::aot;
  impl.availability = [] {
    if (jit::aot_entries().empty()) return std::string("built without prebuilt kernels");
    std::string why;
    return jit::cuda_driver(&why) ? std::string() : why;
  };
  impl.predicate = [](const Call& c, const Key& key) -> std::string {
    if (std::string why = family_detail::cuda_refusal<F>(c); !why.empty()) return why;
    if (!jit::find_aot(F::request(key).template_key)) return "no prebuilt cubin for key " + key.to_string();
    return "";
  };
  impl.run = [](const Call& c, const Key& key) {
    static jit::KernelMemo memo;
    family_detail::run_memoized<F>(memo, c, key, [](const Key& k, int device) -> const jit::LoadedKernel& {
      const KernelRequest request = F::request(k);
      const jit::AotEntry* entry = jit::find_aot(request.template_key);
      if (!entry) throw Error("no prebuilt cubin for " + k.to_string());
      const jit::LoadedKernel* loaded = jit::aot_kernel(entry->entry_name, request.max_threads, device);
      if (!loaded)
        throw Error("the prebuilt fatbin has no image for sm_" +
                    std::to_string(device_info({DeviceKind::cuda, device}).sm));
      return *loaded;
    });
  };
  impl.prebuilt = [] { return family_detail::requests<F>(F::prebuilt_keys()); };
  return impl;
}

// The CPU reference of an op: takes every call whose tensors are on the CPU.
template <KernelFamily F>
Implementation<typename F::Call, typename F::Key> reference_implementation(void (*run)(const typename F::Call&),
                                                                           Contract contract, std::string description) {
  using Call = typename F::Call;
  using Key = typename F::Key;
  Implementation<Call, Key> impl;
  impl.name = std::string(F::op) + ".reference";
  impl.provenance = Provenance::reference;
  impl.capabilities = {{DeviceKind::cpu, 0, 1 << 20, 0}};
  impl.contract = std::move(contract);
  impl.description = std::move(description);
  impl.predicate = [](const Call& c, const Key&) -> std::string {
    return F::device(c).kind == DeviceKind::cpu ? "" : "the tensors are not on the cpu";
  };
  impl.run = [run](const Call& c, const Key&) { run(c); };
  return impl;
}

}  // namespace ditops
