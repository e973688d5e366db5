// An op's CUDA kernels (its kernel family), shared by its jit and aot implementations and by its
// entries. An op writes its kernel functions once, as a constant, and the family takes its name,
// the tensor that names the device and the device from the op's description:
//
//   constexpr KernelFunctions<TokenCatFp8Call, TokenCatFp8Key> kKernels{
//       .key = token_cat_fp8_key,          // Key: packed(), a uint64 naming the kernel; to_string(): the template key
//       .request = token_cat_fp8_request,  // KernelRequest of a key
//       .launch = token_cat_fp8_launch,
//       .nothing_to_do = [](const TokenCatFp8Call& c) { return c.rows * c.width == 0; }};  // optional, below
//   using Kernels = OpKernels<description, kKernels>;
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

// An op's description getter (`const OpBuilder<Args, Call>& description()`) and kernel family give
// its C++ entries (include/ditops/op_function.h) and its op-table entry:
//
//   DITOPS_OP_ENTRIES(scale_add, ScaleAddCall, description, Kernels);  // all of them, below
//   const OpFunction<std::string, ScaleAddCall> scale_add{op_run<description, Kernels>};
//   const OpFunction<ScaleAddCall, ScaleAddCall> match_scale_add{op_match<description>};
//   describe_op<description, Kernels>(registry);   // in the op's registration
template <auto Description>
using BuilderOf = std::remove_cvref_t<decltype(Description())>;

// The kernel family of the op `Description` describes, from its kernel functions.
// (Functions by reference: GCC 12 takes no function pointer inside a class-type template argument.)
template <auto Description, const auto& Functions>
struct OpKernels {
  using Call = typename std::remove_cvref_t<decltype(Functions)>::CallType;
  using Key = typename std::remove_cvref_t<decltype(Functions)>::KeyType;
  static const std::string& op() { return Description().name(); }
  // Named when the stream belongs to another device.
  static const char* device_tensor() { return Description().tensor_name(0); }
  static Device device(const Call& c) {
    if constexpr (Functions.device != nullptr) return Functions.device(c);
    else return Description().tensor(c, 0).device;
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

// An op's entries, for an op whose call struct is what its callers fill: <op>(...), match_<op>(...),
// explain_<op>(call) and its op-table entry (registered with the library's ops, right after the op's
// DITOPS_REGISTER_OP(register_<op>): the table keeps the order of the op names).
#define DITOPS_OP_ENTRIES(op, Call, description, Kernels)                                        \
  const ::ditops::OpFunction<std::string, Call> op{::ditops::op_run<description, Kernels>};      \
  const ::ditops::OpFunction<Call, Call> match_##op{::ditops::op_match<description>};            \
  ::ditops::DispatchReport explain_##op(const Call& call) {                                      \
    return ::ditops::explain<Kernels>(call, call.options.dispatch);                              \
  }                                                                                              \
  static const ::ditops::OpRegistration op##_description("register_" #op "_description",            \
                                                           ::ditops::describe_op<description, Kernels>)

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

}  // namespace ditops
