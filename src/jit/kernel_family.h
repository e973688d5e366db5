// An op's CUDA kernels, declared once and shared by its jit and aot implementations and by its
// facade: which device a call runs on, the kernel key it selects, the request that compiles that
// key and the launch. From these come the implementations' availability, predicate, template
// key, memoized compile or load, launch and prebuilt listing, and the decision-cache signature.
//
// Key is a value type with packed() (a uint64 that identifies the kernel: every field the
// predicates read) and to_string() (the human-readable template key).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/implementation.h"
#include "jit/cuda_driver.h"
#include "jit/first_use.h"
#include "jit/launch.h"
#include "jit/module_loader.h"
#include "jit/nvrtc.h"

namespace ditops {

template <typename Call, typename Key>
struct KernelFamily {
  const char* op = "";
  const char* device_tensor = "";      // the tensor named when the stream is on another device
  Device (*device)(const Call&) = nullptr;
  Key (*key)(const Call&, const DeviceInfo&) = nullptr;
  jit::KernelRequest (*request)(const Key&) = nullptr;
  void (*launch)(const Call&, const Key&, const jit::LoadedKernel&) = nullptr;
  bool (*nothing_to_do)(const Call&) = nullptr;     // optional: no launch, no compile
  std::string (*refusal)(const Call&) = nullptr;    // optional: CUDA calls no kernel takes
  std::vector<Key> (*prebuilt_keys)() = nullptr;    // aot: the keys compiled into the library
  std::vector<Key> (*variant_keys)() = nullptr;     // keys covering every code path (compile test)
  // Predicate inputs outside the key (an option the key does not carry), as a number below
  // extra_radix; part of the decision-cache signature.
  uint64_t (*extra_signature)(const Call&) = nullptr;
  uint64_t extra_radix = 1;

  std::string template_key(const Call& c) const {
    const Device d = device(c);
    return d.kind == DeviceKind::cuda ? key(c, device_info(d)).to_string() : "";
  }
  std::string cuda_refusal(const Call& c) const {
    if (device(c).kind != DeviceKind::cuda) return "the tensors are on the cpu";
    return refusal ? refusal(c) : "";
  }
  // Everything the implementations' predicates and template keys read from a call: its kernel
  // key, the extra predicate inputs and the device kind.
  uint64_t signature(const Call& c, const DeviceInfo& info) const {
    const uint64_t extra = extra_signature ? extra_signature(c) : 0;
    return ((key(c, info).packed() * extra_radix + extra) * 4) + static_cast<uint64_t>(info.device.kind) + 1;
  }

  // The op's facade after matching: checks the stream and dispatches with the decision cache.
  std::string dispatch(const Call& c, Stream stream, const DispatchOptions& options) const {
    const Device d = device(c);
    const DeviceInfo& info = device_info(d);
    jit::bind_and_check_stream(op, device_tensor, d, stream);
    return Registry::global().dispatch(op, &c, info, options, signature(c, info)).name;
  }
  DispatchReport explain(const Call& c, const DispatchOptions& options) const {
    return Registry::global().explain(op, &c, device_info(device(c)), options);
  }
};

namespace jit {
inline std::string nvrtc_availability() {
  std::string why;
  if (!cuda_driver(&why)) return why;
  if (nvrtc_version(&why) == 0) return why;
  return "";
}
}  // namespace jit

template <typename Call, typename Key>
std::vector<jit::KernelRequest> requests(const KernelFamily<Call, Key>& family, const std::vector<Key>& keys) {
  std::vector<jit::KernelRequest> out;
  for (const Key& key : keys) out.push_back(family.request(key));
  return out;
}

// The run of a jit or aot implementation: the call's key, its kernel from `memo` (resolved by
// load(key, device index) the first time per key and device, capture-safe: jit/first_use.h), the
// launch.
template <typename Call, typename Key, typename Load>
void run_memoized(const KernelFamily<Call, Key>& family, jit::KernelMemo& memo, const Call& c, const Load& load) {
  if (family.nothing_to_do && family.nothing_to_do(c)) return;
  const Device d = family.device(c);
  const Key key = family.key(c, device_info(d));
  const jit::LoadedKernel& kernel =
      memo.get(key.packed() * 64 + static_cast<uint64_t>(d.index), [&]() -> const jit::LoadedKernel& {
        return jit::first_use(static_cast<CUstream>(c.stream), std::string(family.op) + " kernel " + key.to_string(),
                              [&]() -> const jit::LoadedKernel& { return load(key, d.index); });
      });
  jit::bind_primary_context(d.index);
  family.launch(c, key, kernel);
}

// Kernels compiled at first use by NVRTC for the device's exact arch, memoized per key and device.
template <typename Call, typename Key>
Implementation<Call> jit_implementation(const KernelFamily<Call, Key>& family) {
  Implementation<Call> impl;
  impl.provenance = Provenance::jit;
  impl.availability = jit::nvrtc_availability;
  impl.predicate = [family](const Call& c) { return family.cuda_refusal(c); };
  impl.template_key = [family](const Call& c) { return family.template_key(c); };
  auto memo = std::make_shared<jit::KernelMemo>();
  impl.run = [family, memo](const Call& c) {
    run_memoized(family, *memo, c, [&](const Key& key, int device) -> const jit::LoadedKernel& {
      return jit::jit_kernel(family.request(key), device);
    });
  };
  if (family.variant_keys) impl.variants = [family] { return requests(family, family.variant_keys()); };
  return impl;
}

// Kernels compiled by nvcc at build time for the keys family.prebuilt_keys lists; a call whose
// key is not among them is refused by the predicate (the jit takes it).
template <typename Call, typename Key>
Implementation<Call> aot_implementation(const KernelFamily<Call, Key>& family) {
  Implementation<Call> impl;
  impl.provenance = Provenance::aot;
  impl.availability = [] {
    if (jit::aot_entries().empty()) return std::string("built without prebuilt kernels");
    std::string why;
    return jit::cuda_driver(&why) ? std::string() : why;
  };
  impl.predicate = [family](const Call& c) -> std::string {
    if (std::string why = family.cuda_refusal(c); !why.empty()) return why;
    const Key key = family.key(c, device_info(family.device(c)));
    if (!jit::find_aot(family.request(key).template_key)) return "no prebuilt cubin for key " + key.to_string();
    return "";
  };
  impl.template_key = [family](const Call& c) { return family.template_key(c); };
  auto memo = std::make_shared<jit::KernelMemo>();
  impl.run = [family, memo](const Call& c) {
    run_memoized(family, *memo, c, [&](const Key& key, int device) -> const jit::LoadedKernel& {
      const jit::KernelRequest request = family.request(key);
      const jit::AotEntry* entry = jit::find_aot(request.template_key);
      if (!entry) throw Error("no prebuilt cubin for " + key.to_string());
      const jit::LoadedKernel* loaded = jit::aot_kernel(entry->entry_name, request.max_threads, device);
      if (!loaded)
        throw Error("the prebuilt fatbin has no image for sm_" +
                    std::to_string(device_info({DeviceKind::cuda, device}).sm));
      return *loaded;
    });
  };
  impl.prebuilt = [family] { return requests(family, family.prebuilt_keys()); };
  return impl;
}

}  // namespace ditops
