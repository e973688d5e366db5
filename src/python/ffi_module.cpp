// The TVM-FFI module the Python package loads (python/ditops/__init__.py): a thin layer that turns
// FFI tensors (any DLPack producer: PyTorch, numpy, CuPy, JAX) into ditops::TensorView without a
// copy, calls the C++ facade and turns ditops::Error into the FFI error kind "DitopsError" (raised
// in Python as ditops.Error with the C++ message). TVM-FFI is the ABI SGLang's and FlashInfer's
// kernels use, so the exported functions can be loaded there too (tvm_ffi.load_module).
//
// Streams: the caller's stream comes from TVMFFIEnvGetStream. TVM-FFI sets it, for the duration
// of a call, to the producer's current stream of the first CUDA tensor (PyTorch: the current torch
// stream, which during graph capture is the capturing stream); other producers set it with
// tvm_ffi.use_raw_stream (ditops.qknorm_rope(..., stream=) does that).
//
// Nothing here is written per op: one generic entry takes any op of the table (ditops/op.h),
// and python/ditops builds each op's function, torch schema and fake from the exported table.
#include <tvm/ffi/container/array.h>
#include <tvm/ffi/container/map.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/optional.h>
#include <tvm/ffi/string.h>

#include <algorithm>
#include <optional>
#include <string>
#include <vector>
#include <utility>

// After tvm-ffi's dlpack/dlpack.h: ditops/dlpack.h then uses those definitions.
#include "ditops/c_api.h"
#include "ditops/dlpack.h"
#include "ditops/op.h"
#include "ditops/registry.h"

namespace {

using tvm::ffi::Any;
using tvm::ffi::Array;
using tvm::ffi::Map;
using tvm::ffi::Optional;
using tvm::ffi::String;
using FfiTensor = tvm::ffi::TensorView;

// The error kinds Python maps to ditops.Error and its subclass ditops.NoImplementation
// (python/ditops/__init__.py registers them): the torch ops fall back to the eager chain on the
// second only, so a user error can never turn into a fallback.
[[noreturn]] void raise_ditops(const std::string& message) {
  throw tvm::ffi::Error("DitopsError", message, "");
}
[[noreturn]] void raise_no_implementation(const std::string& message) {
  throw tvm::ffi::Error("DitopsNoImplementation", message, "");
}

// Zero-copy view; a DLPack-level refusal (dtype, device kind, rank) names the tensor.
// A slot's dtype rule in words: "bf16|f16|f32", "=x|f32" -> "x's dtype or f32".
std::string dtype_rule_text(const std::string& rule) {
  std::string out;
  size_t start = 0;
  while (start <= rule.size()) {
    const size_t bar = std::min(rule.find('|', start), rule.size());
    const std::string part = rule.substr(start, bar - start);
    out += (out.empty() ? "" : " or ") + (part.rfind('=', 0) == 0 ? part.substr(1) + "'s dtype" : part);
    start = bar + 1;
  }
  return out;
}

ditops::TensorView view(const FfiTensor& t, const ditops::TensorSlot& slot, const char* op) {
  const char* name = slot.name.c_str();
  DLTensor dl{};
  dl.data = t.data_ptr();
  dl.device = t.device();
  dl.ndim = t.ndim();
  dl.dtype = t.dtype();
  dl.shape = const_cast<int64_t*>(t.shape().data());
  // TVM-FFI fills strides for every tensor it creates; NULL (compact) is still handled.
  dl.strides = t.ndim() > 0 ? const_cast<int64_t*>(t.strides().data()) : nullptr;
  dl.byte_offset = t.byte_offset();
  // An empty tensor addresses nothing, so its strides carry no layout; producers disagree on
  // them (numpy gives 0 for every dim, torch compact ones). Empty tensors get compact strides
  // so the facade's layout checks see what torch would have passed.
  bool empty = false;
  for (int i = 0; i < dl.ndim; ++i) empty = empty || dl.shape[i] == 0;
  if (empty) dl.strides = nullptr;
  try {
    return ditops::from_dlpack(dl);
  } catch (const ditops::Error& e) {
    // An unsupported dtype: what this tensor takes too.
    const bool dtype_refused = std::string(e.what()).find("unsupported dtype") != std::string::npos;
    raise_ditops(std::string(op) + ": " + name + ": " + e.what() +
                 (dtype_refused && !slot.dtypes.empty() ? "; " + slot.name + " takes " + dtype_rule_text(slot.dtypes) : ""));
  }
}

// Every entry's last argument: a raw stream handle, or -1 for the stream TVM-FFI set for this
// call (nullptr for CPU tensors: the reference ignores it).
constexpr int64_t kEnvStream = -1;
ditops::Stream stream_of(const FfiTensor& t, int64_t stream) {
  const DLDevice d = t.device();
  if (d.device_type != kDLCUDA && d.device_type != kDLCUDAManaged) return nullptr;
  if (stream != kEnvStream) return reinterpret_cast<ditops::Stream>(static_cast<intptr_t>(stream));
  return TVMFFIEnvGetStream(kDLCUDA, d.device_id);
}

ditops::DispatchOptions dispatch_options(const String& backend, const String& quality) {
  ditops::DispatchOptions o;
  if (!backend.empty()) {
    ditops::Provenance p;
    if (!ditops::parse_provenance(std::string(backend), &p))
      raise_ditops("unknown backend '" + std::string(backend) +
                   "' (expected kda, aot, jit, vendor or reference)");
    o.backend = p;
  }
  if (!quality.empty()) {
    ditops::Quality q;
    if (!ditops::parse_quality(std::string(quality), &q))
      raise_ditops("unknown quality '" + std::string(quality) +
                   "' (expected exact, lossless or high)");
    o.quality = q;
  }
  return o;
}

Map<String, Any> report_to_map(const ditops::DispatchReport& r) {
  Array<Any> candidates;
  for (const auto& c : r.candidates) {
    candidates.push_back(Map<String, Any>{{"name", String(c.name)},
                                          {"provenance", String(ditops::provenance_name(c.provenance))},
                                          {"eligible", c.eligible},
                                          {"chosen", c.chosen},
                                          {"reason", String(c.reason)}});
  }
  Map<String, Any> out{{"op", String(r.op)},
                       {"device", String(r.device)},
                       {"template_key", String(r.template_key)},
                       {"candidates", candidates},
                       {"quality", String(ditops::quality_name(r.quality))},
                       {"text", String(r.format())}};
  out.Set("chosen", r.chosen ? Any(String(r.chosen->name)) : Any(nullptr));
  out.Set("admitting_quality",
          r.admitting_quality ? Any(String(ditops::quality_name(*r.admitting_quality))) : Any(nullptr));
  out.Set("admitting_choice", String(r.admitting_choice));
  return out;
}

// ---------------------------------------------------------------- ops

// The described ops, in the order of the table Python reads (op_table); fixed once registered.
const std::vector<const ditops::OpDescription*>& described_ops() {
  static const std::vector<const ditops::OpDescription*> ops = ditops::op_descriptions();
  return ops;
}

const ditops::OpDescription& described_op(int64_t index) {
  const auto& ops = described_ops();
  if (index < 0 || index >= static_cast<int64_t>(ops.size()))
    raise_ditops("no op with index " + std::to_string(index) + " (the table has " + std::to_string(ops.size()) + ")");
  return *ops[index];
}

ditops::OptionValue option_value(const ditops::OpDescription& op, const ditops::OptionSlot& slot,
                                 const tvm::ffi::AnyView& v) {
  if (v.type_index() == kTVMFFINone) return std::monostate{};
  auto fail = [&](const char* expected) -> ditops::OptionValue {
    raise_ditops(op.name + ": option '" + slot.name + "' must be " + expected + " but is " + v.GetTypeKey());
  };
  switch (slot.kind) {
    case ditops::OptionKind::boolean:
    case ditops::OptionKind::optional_boolean:
      if (auto b = v.try_cast<bool>()) return *b;
      return fail("a bool");
    case ditops::OptionKind::integer:
      if (v.type_index() == kTVMFFIInt || v.type_index() == kTVMFFIBool) return v.cast<int64_t>();
      return fail("an integer");
    case ditops::OptionKind::real:
      if (auto d = v.try_cast<double>()) return *d;
      return fail("a number");
    case ditops::OptionKind::choice:
      if (auto s = v.try_cast<String>()) return std::string(*s);
      return fail("a string");
  }
  return fail("valid");
}

// call(op_index, explain, stream, *tensors, *options, backend, quality): the op's tensors in
// slot order (None when absent), its option values in slot order (None: the C++ default), then
// backend and quality ("" or None: not given). Returns the implementation that ran, or with
// explain the dispatch report. Python builds each op's function from the table (op_table).
Any generic_entry(const tvm::ffi::AnyView* args, int32_t num_args) {
  if (num_args < 3) raise_ditops("call: expected (op_index, explain, stream, ...)");
  const ditops::OpDescription& op = described_op(args[0].cast<int64_t>());
  const bool explain = args[1].cast<bool>();
  const int64_t stream = args[2].cast<int64_t>();
  const size_t nt = op.tensors.size(), no = op.options.size();
  if (static_cast<size_t>(num_args) != 3 + nt + no + 2)
    raise_ditops(op.name + ": expected " + std::to_string(nt + no + 2) + " arguments after the op but got " +
                 std::to_string(num_args - 3));
  ditops::GenericCall call = ditops::generic_call(op);
  std::optional<FfiTensor> first_tensor;
  for (size_t i = 0; i < nt; ++i) {
    const tvm::ffi::AnyView& a = args[3 + i];
    if (a.type_index() == kTVMFFINone) continue;
    auto t = a.try_cast<FfiTensor>();
    if (!t) raise_ditops(op.name + ": " + op.tensors[i].name + " must be a tensor but is " + a.GetTypeKey());
    call.tensors[i] = view(*t, op.tensors[i], op.name.c_str());
    call.given[i] = true;
    if (!first_tensor) first_tensor = *t;
  }
  for (size_t i = 0; i < no; ++i) call.options[i] = option_value(op, op.options[i], args[3 + nt + i]);
  auto text = [&](const tvm::ffi::AnyView& a) {
    return a.type_index() == kTVMFFINone ? String("") : a.cast<String>();
  };
  call.dispatch = dispatch_options(text(args[3 + nt + no]), text(args[3 + nt + no + 1]));
  try {
    if (explain) return report_to_map(op.explain(call));
    const ditops::Stream s = first_tensor ? stream_of(*first_tensor, stream) : nullptr;
    return String(op.run(call, s));
  } catch (const ditops::NoImplementation& e) {
    raise_no_implementation(e.what());
  } catch (const ditops::Error& e) {
    raise_ditops(e.what());
  }
}

// The op table (JSON text): every op's slots, kinds, defaults and allocation rules.
String op_table() { return String(ditops::op_table_json()); }

// ---------------------------------------------------------------- registry

// Every implementation of every op: what `ditops list` prints, as records.
Array<Any> list_kernels(String op) {
  Array<Any> out;
  for (const ditops::KernelSpec* s : ditops::Registry::global().list(std::string(op))) {
    Array<Any> caps;
    for (const auto& c : s->capabilities) caps.push_back(String(c.describe()));
    Map<String, Any> rec{
        {"op", String(s->op)},
        {"name", String(s->name)},
        {"provenance", String(ditops::provenance_name(s->provenance))},
        {"capabilities", caps},
        {"contract", String(s->contract.kind == ditops::Contract::Kind::bit_exact ? "bit_exact" : "close")},
        {"oracle", String(s->contract.oracle)},
        {"bounds", String(s->contract.bounds)},
        {"verification", String(s->contract.verification)},
        {"admission", String(s->contract.admission)},
        {"description", String(s->description)},
        // "" when usable on this machine, else why not.
        {"unavailable", String(s->availability ? s->availability() : std::string())}};
    if (s->evidence) {
      rec.Set("evidence", Map<String, Any>{{"shapes", String(s->evidence->shapes)},
                                           {"oracle", String(s->evidence->oracle)},
                                           {"tolerance", String(s->evidence->tolerance)},
                                           {"speedup", String(s->evidence->speedup)},
                                           {"device", String(s->evidence->device)},
                                           {"date", String(s->evidence->date)},
                                           {"commit", String(s->evidence->commit)}});
    }
    out.push_back(rec);
  }
  return out;
}

String version() { return String(ditops_version()); }

// Re-reads DITOPS_* environment variables (they are read once and cached otherwise).
void reload_config() { ditops::reload_config(); }

// Forgets implementations that failed to resolve or launch (they are skipped until then).
void clear_failures() { ditops::Registry::global().clear_failures(); }

}  // namespace

// The generic op entry, exported in the packed calling convention (a variable argument list).
extern "C" TVM_FFI_DLL_EXPORT int __tvm_ffi_call(void*, const TVMFFIAny* args, int32_t num_args, TVMFFIAny* result) {
  TVM_FFI_SAFE_CALL_BEGIN();
  *reinterpret_cast<Any*>(result) = generic_entry(reinterpret_cast<const tvm::ffi::AnyView*>(args), num_args);
  TVM_FFI_SAFE_CALL_END();
}
TVM_FFI_DLL_EXPORT_TYPED_FUNC(op_table, op_table);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(list_kernels, list_kernels);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(version, version);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(reload_config, reload_config);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(clear_failures, clear_failures);
