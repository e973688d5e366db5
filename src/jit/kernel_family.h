// An op's CUDA kernels (its kernel family), shared by its jit and aot implementations and by its
// entries. An op writes its kernel functions once, as a constant, and the family takes its name,
// the tensor that names the device and the device from the op's description:
//
//   constexpr KernelFunctions<TokenCatFp8Call, TokenCatFp8Key> kKernels{
//       .key = token_cat_fp8_key,          // Key: packed(), a uint64 naming the kernel; to_string(): the template key
//       .request = token_cat_fp8_request,  // KernelRequest of a key
//       .launch = token_cat_fp8_launch,
//       .nothing_to_do = [](const TokenCatFp8Call& c) { return c.rows * c.width == 0; }};  // optional, below
//   using Kernels = OpKernels<describe, kKernels>;
//
// A call's path: the entry matches, dispatch<F>() computes the key once, and the registry hands
// the Dispatched call (core/implementation.h) to the chosen implementation, whose run resolves the
// kernel per (key, device) once (compile or prebuilt load, capture-safe) and launches.
#pragma once

#include <concepts>
#include <cstdint>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/builtin_ops.h"
#include "core/implementation.h"
#include "core/op_builder.h"
#include "jit/cuda_driver.h"
#include "jit/first_use.h"
#include "jit/launch.h"
#include "jit/module_loader.h"
#include "jit/nvrtc.h"

namespace ditops {

// The functions of an op's kernels; those after `launch` are optional.
template <typename Call, typename Key>
struct KernelFunctions {
  using CallType = Call;
  using KeyType = Key;
  Key (*key)(const Call&, const DeviceInfo&) = nullptr;
  KernelRequest (*request)(const Key&) = nullptr;
  void (*launch)(const Call&, const Key&, const jit::LoadedKernel&) = nullptr;
  bool (*nothing_to_do)(const Call&) = nullptr;        // no launch, no compile
  std::string (*refusal)(const Call&) = nullptr;       // CUDA calls no kernel takes
  std::vector<Key> (*prebuilt_keys)() = nullptr;       // aot: the keys compiled into the library
  std::vector<Key> (*variant_keys)() = nullptr;        // every code path (the compile test)
  uint64_t (*extra_signature)(const Call&) = nullptr;  // predicate inputs the key does not carry,
  uint64_t extra_radix = 1;                            //   below extra_radix (decision cache)
  Device (*device)(const Call&) = nullptr;             // default: the description's first tensor's
};

template <typename F>
concept KernelFamily = requires(const typename F::Call& c, const typename F::Key& k, const DeviceInfo& info,
                                const jit::LoadedKernel& kernel) {
  { F::op() } -> std::convertible_to<const std::string&>;
  { F::device_tensor() } -> std::convertible_to<const char*>;
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
  jit::bind_and_check_stream(F::op().c_str(), F::device_tensor(), d, stream);
  const typename F::Key key = F::key(c, info);
  const Dispatched<typename F::Call, typename F::Key> call{c, key, info};
  return Registry::global().dispatch(F::op(), &call, info, options, family_detail::signature<F>(c, key, info)).name;
}

template <KernelFamily F>
DispatchReport explain(const typename F::Call& c, const DispatchOptions& options) {
  const DeviceInfo& info = device_info(F::device(c));
  const typename F::Key key = F::key(c, info);
  const Dispatched<typename F::Call, typename F::Key> call{c, key, info};
  return Registry::global().explain(F::op(), &call, info, options);
}

// ---------------------------------------------------------------- an op's entries, from its description

// The kernel family of the op that `Describe` describes, from its kernel functions. Describe returns
// the op's OpBuilder (core/op_builder.h); the family builds it once, at its first use (a
// registration or a call), and holds it: description(). Its entries and its op-table entry come
// from the family alone:
//
//   using Kernels = OpKernels<describe, kKernels>;
//   DITOPS_OP_ENTRIES(scale_add, Kernels, register_scale_add);  // all of them, below
//   const OpFunction<std::string, ScaleAddCall> scale_add{op_run<Kernels>};
//   const OpFunction<ScaleAddCall, ScaleAddCall> match_scale_add{op_match<Kernels>};
//   describe_op<Kernels>(registry);   // the op-table entry
// (Functions by reference: GCC 12 takes no function pointer inside a class-type template argument.)
template <auto Describe, const auto& Functions>
struct OpKernels {
  using Builder = std::remove_cvref_t<decltype(Describe())>;
  using Call = typename std::remove_cvref_t<decltype(Functions)>::CallType;
  using Key = typename std::remove_cvref_t<decltype(Functions)>::KeyType;
  static_assert(std::is_same_v<typename Builder::CallType, Call>, "the description's call is the kernels' call");
  static const Builder& description() {
    static const Builder b = Describe();
    return b;
  }
  static const std::string& op() { return description().name(); }
  // Named when the stream belongs to another device.
  static const char* device_tensor() { return description().tensor_name(0); }
  static Device device(const Call& c) {
    if constexpr (Functions.device != nullptr) return Functions.device(c);
    else return description().tensor(c, 0).device;
  }
  static Key key(const Call& c, const DeviceInfo& d) { return Functions.key(c, d); }
  static KernelRequest request(const Key& k) { return Functions.request(k); }
  static void launch(const Call& c, const Key& k, const jit::LoadedKernel& l) { Functions.launch(c, k, l); }
  static bool nothing_to_do(const Call& c) requires(Functions.nothing_to_do != nullptr) {
    return Functions.nothing_to_do(c);
  }
  static std::string refusal(const Call& c) requires(Functions.refusal != nullptr) { return Functions.refusal(c); }
  static std::vector<Key> prebuilt_keys() requires(Functions.prebuilt_keys != nullptr) {
    return Functions.prebuilt_keys();
  }
  static std::vector<Key> variant_keys() requires(Functions.variant_keys != nullptr) {
    return Functions.variant_keys();
  }
  static uint64_t extra_signature(const Call& c) requires(Functions.extra_signature != nullptr) {
    return Functions.extra_signature(c);
  }
  static constexpr uint64_t extra_radix = Functions.extra_radix;
};

namespace family_detail {

template <KernelFamily F>
std::string run_op(typename F::Builder::ArgsType& a, Stream stream) {
  const auto& b = F::description();
  if constexpr (F::Builder::kInPlace) {
    b.match_in_place(a, stream);
    b.run_checks(a);
    return dispatch<F>(a, stream, a.options.dispatch);
  } else {
    const typename F::Call c = b.matched(a, stream);
    b.run_checks(c);
    return dispatch<F>(c, stream, c.options.dispatch);
  }
}

template <KernelFamily F>
void match_in_place(typename F::Call& c, Stream stream) {
  F::description().match_in_place(c, stream);
}

template <KernelFamily F>
typename F::Call match_call(typename F::Builder::ArgsType& a, Stream stream) {
  return F::description().matched(a, stream);
}

template <KernelFamily F>
DispatchReport explain_op(typename F::Builder::ArgsType& a) {
  const typename F::Call c = F::description().matched(a, nullptr);
  return explain<F>(c, c.options.dispatch);
}

}  // namespace family_detail

// <op>(...): match, the run's own checks, dispatch.
template <KernelFamily F>
constexpr auto op_run = &family_detail::run_op<F>;

// match_<op>(...): the call every implementation receives.
template <KernelFamily F>
constexpr auto op_match = [] {
  if constexpr (F::Builder::kInPlace) return &family_detail::match_in_place<F>;
  else return &family_detail::match_call<F>;
}();

// The op's table entry (ditops::call, explain, every binding): its run and explain from a generic call.
template <KernelFamily F>
void describe_op(Registry& registry) {
  registry.describe(F::description().build(op_run<F>, &family_detail::explain_op<F>));
}

// An op's registration: its implementations (`add`), then its table entry.
template <KernelFamily F, void (*Add)(Registry&)>
void register_op(Registry& registry) {
  Add(registry);
  describe_op<F>(registry);
}

// An op's entries, for an op whose call struct is what its callers fill: <op>(...), match_<op>(...),
// explain_<op>(call), and its registration with the library's ops (core/builtin_ops.h): `add(registry)`
// adds its implementations, then its op-table entry follows. Trailing arguments name the types of
// the call struct's leading members where they are not TensorViews (include/ditops/op_function.h).
#define DITOPS_OP_ENTRIES(op, Kernels, add, ...)                                                         \
  const ::ditops::OpFunction<std::string, Kernels::Call __VA_OPT__(, ) __VA_ARGS__> op{                  \
      ::ditops::op_run<Kernels>};                                                                        \
  const ::ditops::OpFunction<Kernels::Call, Kernels::Call __VA_OPT__(, ) __VA_ARGS__> match_##op{        \
      ::ditops::op_match<Kernels>};                                                                      \
  ::ditops::DispatchReport explain_##op(const Kernels::Call& call) {                                     \
    return ::ditops::explain<Kernels>(call, call.options.dispatch);                                      \
  }                                                                                                      \
  static const ::ditops::OpRegistration op##_registration("register_" #op, ::ditops::register_op<Kernels, add>)

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
        return jit::first_use(static_cast<CUstream>(c.stream), F::op() + " kernel " + key.to_string(),
                              [&]() -> const jit::LoadedKernel& { return load(key, d.index); });
      });
  jit::bind_primary_context(d.index);
  F::launch(c, key, kernel);
}

}  // namespace family_detail

// What an op states of one jit implementation of its family; the family supplies the rest.
struct JitSpec {
  std::string variant = "jit";  // the implementation is "<op>.<variant>"
  int sm_min = 80;              // on CUDA devices from this SM on, with NVRTC
  Contract contract;
  std::string description;
};

// Kernels compiled at first use by NVRTC for the device's exact arch, memoized per key and device.
template <KernelFamily F>
Implementation<typename F::Call, typename F::Key> jit_implementation(const JitSpec& spec) {
  using Call = typename F::Call;
  using Key = typename F::Key;
  Implementation<Call, Key> impl;
  impl.name = F::op() + "." + spec.variant;
  impl.provenance = Provenance::jit;
  impl.capabilities = {{DeviceKind::cuda, spec.sm_min, 1 << 20, kFeatureNvrtc}};
  impl.contract = spec.contract;
  impl.description = spec.description;
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

// Adds the jit implementation `spec` states to the op's.
template <KernelFamily F>
void add_jit(Registry& registry, const JitSpec& spec) {
  add_implementation(registry, F::op(), jit_implementation<F>(spec));
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
  impl.name = F::op() + ".reference";
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

// Adds the op's CPU reference (reference_implementation).
template <KernelFamily F>
void add_reference(Registry& registry, void (*run)(const typename F::Call&), Contract contract,
                   std::string description) {
  add_implementation(registry, F::op(), reference_implementation<F>(run, std::move(contract), std::move(description)));
}

}  // namespace ditops
