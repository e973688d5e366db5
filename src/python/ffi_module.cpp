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
// Adding an op: one `<op>_entry<kExplain>` below (tensors, then the facade's options in its
// order, then backend, quality and stream) and two export lines; then the Python function in
// python/ditops/__init__.py and the custom op in python/ditops/torch.py (docs/python.md).
#include <tvm/ffi/container/array.h>
#include <tvm/ffi/container/map.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/optional.h>
#include <tvm/ffi/string.h>

#include <string>
#include <utility>

// After tvm-ffi's dlpack/dlpack.h: ditops/dlpack.h then uses those definitions.
#include "ditops/c_api.h"
#include "ditops/dlpack.h"
#include "ditops/layernorm_modulate.h"
#include "ditops/norm_scale_shift.h"
#include "ditops/qknorm_rope.h"
#include "ditops/residual_gate_add.h"
#include "ditops/registry.h"

namespace {

using tvm::ffi::Any;
using tvm::ffi::Array;
using tvm::ffi::Map;
using tvm::ffi::Optional;
using tvm::ffi::String;
using FfiTensor = tvm::ffi::TensorView;

// The one error kind Python maps to ditops.Error (python/ditops/__init__.py registers it).
[[noreturn]] void raise_ditops(const std::string& message) {
  throw tvm::ffi::Error("DitopsError", message, "");
}

// Zero-copy view; a DLPack-level refusal (dtype, device kind, rank) names the tensor.
ditops::TensorView view(const FfiTensor& t, const char* name, const char* op) {
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
    raise_ditops(std::string(op) + ": " + name + ": " + e.what());
  }
}

// An optional tensor (None in Python): absent is the default TensorView (data == nullptr), what
// the facades take for "not given".
ditops::TensorView opt_view(const Optional<FfiTensor>& t, const char* name, const char* op) {
  return t.has_value() ? view(t.value(), name, op) : ditops::TensorView{};
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
                   "' (expected lossless, high or extra-high)");
    o.quality = q;
  }
  return o;
}

// An option given as its name; `choices` maps names to values.
template <typename E, size_t N>
E parse_choice(const char* option, const String& value, const std::pair<const char*, E> (&choices)[N]) {
  std::string expected;
  for (const auto& [name, e] : choices) {
    if (value == name) return e;
    expected += (expected.empty() ? "" : " or ") + std::string(name);
  }
  raise_ditops(std::string("unknown ") + option + " '" + std::string(value) + "' (expected " +
               expected + ")");
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
                       {"text", String(r.format())}};
  out.Set("chosen", r.chosen ? Any(String(r.chosen->name)) : Any(nullptr));
  return out;
}

// Runs `run(stream)` (returns the implementation name) or, when kExplain, the dispatch report of
// `match()`. ditops::Error becomes DitopsError; anything else keeps TVM-FFI's own mapping.
template <bool kExplain, typename Run, typename Explain>
Any run_or_explain(Run&& run, Explain&& explain) {
  try {
    if constexpr (kExplain) {
      return report_to_map(explain());
    } else {
      return String(run());
    }
  } catch (const ditops::Error& e) {
    raise_ditops(e.what());
  }
}

// ---------------------------------------------------------------- ops

template <bool kExplain>
Any qknorm_rope_entry(FfiTensor q, FfiTensor k, FfiTensor q_weight, FfiTensor k_weight,
                      FfiTensor cos_sin_cache, FfiTensor positions, bool is_neox, double eps,
                      int64_t rope_dim, bool cache_full_width, String rounding, String norm_order,
                      bool use_pdl, String backend, String quality, int64_t stream) {
  static constexpr const char* op = "qknorm_rope";
  static constexpr std::pair<const char*, ditops::QkRounding> kRoundings[] = {
      {"rounded", ditops::QkRounding::rounded}, {"fp32", ditops::QkRounding::fp32}};
  static constexpr std::pair<const char*, ditops::QkNormOrder> kOrders[] = {
      {"aten", ditops::QkNormOrder::aten}, {"warp", ditops::QkNormOrder::warp}};
  ditops::QkNormRopeOptions o;
  o.is_neox = is_neox;
  o.eps = static_cast<float>(eps);
  o.rope_dim = static_cast<int>(rope_dim);
  o.cache_full_width = cache_full_width;
  o.rounding = parse_choice("rounding", rounding, kRoundings);
  o.norm_order = parse_choice("norm_order", norm_order, kOrders);
  o.use_pdl = use_pdl;
  o.dispatch = dispatch_options(backend, quality);
  const auto vq = view(q, "q", op), vk = view(k, "k", op), vqw = view(q_weight, "q_weight", op),
             vkw = view(k_weight, "k_weight", op), vc = view(cos_sin_cache, "cos_sin_cache", op),
             vp = view(positions, "positions", op);
  return run_or_explain<kExplain>(
      [&] { return ditops::qknorm_rope(vq, vk, vqw, vkw, vc, vp, o, stream_of(q, stream)); },
      [&] { return ditops::explain_qknorm_rope(ditops::match_qknorm_rope(vq, vk, vqw, vkw, vc, vp, o)); });
}

template <bool kExplain>
Any residual_gate_add_entry(FfiTensor residual, FfiTensor update, FfiTensor gate, FfiTensor out,
                            bool use_pdl, String backend, String quality, int64_t stream) {
  static constexpr const char* op = "residual_gate_add";
  ditops::ResidualGateAddOptions o;
  o.use_pdl = use_pdl;
  o.dispatch = dispatch_options(backend, quality);
  const auto vr = view(residual, "residual", op), vu = view(update, "update", op),
             vg = view(gate, "gate", op), vo = view(out, "out", op);
  return run_or_explain<kExplain>(
      [&] { return ditops::residual_gate_add(vr, vu, vg, vo, o, stream_of(residual, stream)); },
      [&] { return ditops::explain_residual_gate_add(ditops::match_residual_gate_add(vr, vu, vg, vo, o)); });
}

// The options every layernorm_modulate-family facade takes (one struct for the three ops; the
// facade refuses what its op does not use, e.g. stats_out for qk_head_layernorm).
ditops::LayerNormModulateOptions ln_options(const char* op, double eps, const String& fp8_reciprocal,
                                            const String& mapping, const Optional<FfiTensor>& stats_out,
                                            bool use_pdl, const String& backend, const String& quality) {
  static constexpr std::pair<const char*, ditops::Fp8Reciprocal> kReciprocals[] = {
      {"ieee", ditops::Fp8Reciprocal::ieee}, {"div_full", ditops::Fp8Reciprocal::div_full}};
  static constexpr std::pair<const char*, ditops::LnRowMapping> kMappings[] = {
      {"automatic", ditops::LnRowMapping::automatic},
      {"warp", ditops::LnRowMapping::warp},
      {"cta", ditops::LnRowMapping::cta}};
  ditops::LayerNormModulateOptions o;
  o.eps = static_cast<float>(eps);
  o.fp8_reciprocal = parse_choice("fp8_reciprocal", fp8_reciprocal, kReciprocals);
  o.mapping = parse_choice("mapping", mapping, kMappings);
  o.stats_out = opt_view(stats_out, "stats_out", op);
  o.use_pdl = use_pdl;
  o.dispatch = dispatch_options(backend, quality);
  return o;
}

template <bool kExplain>
Any layernorm_modulate_entry(FfiTensor x, FfiTensor scale, Optional<FfiTensor> shift, FfiTensor out,
                             double eps, String fp8_reciprocal, String mapping,
                             Optional<FfiTensor> stats_out, bool use_pdl, String backend,
                             String quality, int64_t stream) {
  static constexpr const char* op = "layernorm_modulate";
  const auto o = ln_options(op, eps, fp8_reciprocal, mapping, stats_out, use_pdl, backend, quality);
  const auto vx = view(x, "x", op), vs = view(scale, "scale", op), vsh = opt_view(shift, "shift", op),
             vo = view(out, "out", op);
  return run_or_explain<kExplain>(
      [&] { return ditops::layernorm_modulate(vx, vs, vsh, vo, o, stream_of(x, stream)); },
      [&] { return ditops::explain_layernorm_modulate(ditops::match_layernorm_modulate(vx, vs, vsh, vo, o)); });
}

template <bool kExplain>
Any layernorm_modulate_fp8_entry(FfiTensor x, FfiTensor scale, Optional<FfiTensor> shift,
                                 FfiTensor input_scale, FfiTensor out, double eps,
                                 String fp8_reciprocal, String mapping, Optional<FfiTensor> stats_out,
                                 bool use_pdl, String backend, String quality, int64_t stream) {
  static constexpr const char* op = "layernorm_modulate_fp8";
  const auto o = ln_options(op, eps, fp8_reciprocal, mapping, stats_out, use_pdl, backend, quality);
  const auto vx = view(x, "x", op), vs = view(scale, "scale", op), vsh = opt_view(shift, "shift", op),
             vi = view(input_scale, "input_scale", op), vo = view(out, "out", op);
  return run_or_explain<kExplain>(
      [&] { return ditops::layernorm_modulate_fp8(vx, vs, vsh, vi, vo, o, stream_of(x, stream)); },
      [&] {
        return ditops::explain_layernorm_modulate(ditops::match_layernorm_modulate_fp8(vx, vs, vsh, vi, vo, o));
      });
}

template <bool kExplain>
Any qk_head_layernorm_entry(FfiTensor q, FfiTensor k, FfiTensor q_out, FfiTensor k_out, double eps,
                            String fp8_reciprocal, String mapping, Optional<FfiTensor> stats_out,
                            bool use_pdl, String backend, String quality, int64_t stream) {
  static constexpr const char* op = "qk_head_layernorm";
  const auto o = ln_options(op, eps, fp8_reciprocal, mapping, stats_out, use_pdl, backend, quality);
  const auto vq = view(q, "q", op), vk = view(k, "k", op), vqo = view(q_out, "q_out", op),
             vko = view(k_out, "k_out", op);
  return run_or_explain<kExplain>(
      [&] { return ditops::qk_head_layernorm(vq, vk, vqo, vko, o, stream_of(q, stream)); },
      [&] { return ditops::explain_layernorm_modulate(ditops::match_qk_head_layernorm(vq, vk, vqo, vko, o)); });
}

// Inputs (NormScaleShiftInputs' order), outputs (NormScaleShiftOutputs'), then the options; every
// optional tensor may be None.
template <bool kExplain>
Any norm_scale_shift_entry(FfiTensor x, Optional<FfiTensor> residual, Optional<FfiTensor> gate,
                           Optional<FfiTensor> weight, Optional<FfiTensor> bias, FfiTensor scale,
                           Optional<FfiTensor> shift, Optional<FfiTensor> input_scale,
                           Optional<FfiTensor> global_scale, Optional<FfiTensor> y,
                           Optional<FfiTensor> residual_out, Optional<FfiTensor> fp8,
                           Optional<FfiTensor> nvfp4_packed, Optional<FfiTensor> nvfp4_scales,
                           String norm, double eps, String numerics, String fp8_reciprocal,
                           String e2m1, bool use_pdl, String backend, String quality, int64_t stream) {
  static constexpr const char* op = "norm_scale_shift";
  static constexpr std::pair<const char*, ditops::NormType> kNorms[] = {
      {"layer", ditops::NormType::layer}, {"rms", ditops::NormType::rms}};
  static constexpr std::pair<const char*, ditops::NssNumerics> kNumerics[] = {
      {"eager", ditops::NssNumerics::eager}, {"sglang", ditops::NssNumerics::sglang}};
  static constexpr std::pair<const char*, ditops::Fp8Reciprocal> kReciprocals[] = {
      {"ieee", ditops::Fp8Reciprocal::ieee}, {"div_full", ditops::Fp8Reciprocal::div_full}};
  static constexpr std::pair<const char*, ditops::E2m1Conversion> kE2m1[] = {
      {"automatic", ditops::E2m1Conversion::automatic},
      {"software", ditops::E2m1Conversion::software},
      {"hardware", ditops::E2m1Conversion::hardware}};
  ditops::NormScaleShiftOptions o;
  o.norm = parse_choice("norm", norm, kNorms);
  o.eps = static_cast<float>(eps);
  o.numerics = parse_choice("numerics", numerics, kNumerics);
  o.fp8_reciprocal = parse_choice("fp8_reciprocal", fp8_reciprocal, kReciprocals);
  o.e2m1 = parse_choice("e2m1", e2m1, kE2m1);
  o.use_pdl = use_pdl;
  o.dispatch = dispatch_options(backend, quality);
  ditops::NormScaleShiftInputs in;
  in.x = view(x, "x", op);
  in.residual = opt_view(residual, "residual", op);
  in.gate = opt_view(gate, "gate", op);
  in.weight = opt_view(weight, "weight", op);
  in.bias = opt_view(bias, "bias", op);
  in.scale = view(scale, "scale", op);
  in.shift = opt_view(shift, "shift", op);
  in.input_scale = opt_view(input_scale, "input_scale", op);
  in.global_scale = opt_view(global_scale, "global_scale", op);
  ditops::NormScaleShiftOutputs outs;
  outs.y = opt_view(y, "y", op);
  outs.residual_out = opt_view(residual_out, "residual_out", op);
  outs.fp8 = opt_view(fp8, "fp8", op);
  outs.nvfp4_packed = opt_view(nvfp4_packed, "nvfp4_packed", op);
  outs.nvfp4_scales = opt_view(nvfp4_scales, "nvfp4_scales", op);
  return run_or_explain<kExplain>(
      [&] { return ditops::norm_scale_shift(in, outs, o, stream_of(x, stream)); },
      [&] { return ditops::explain_norm_scale_shift(ditops::match_norm_scale_shift(in, outs, o)); });
}

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
        {"description", String(s->description)},
        // "" when usable on this machine, else why not.
        {"unavailable", String(s->availability ? s->availability() : std::string())}};
    if (s->evidence) {
      rec.Set("evidence", Map<String, Any>{{"shapes", String(s->evidence->shapes)},
                                           {"oracle", String(s->evidence->oracle)},
                                           {"speedup", String(s->evidence->speedup)},
                                           {"device", String(s->evidence->device)},
                                           {"date", String(s->evidence->date)}});
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

TVM_FFI_DLL_EXPORT_TYPED_FUNC(qknorm_rope, qknorm_rope_entry<false>);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(qknorm_rope_explain, qknorm_rope_entry<true>);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(residual_gate_add, residual_gate_add_entry<false>);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(residual_gate_add_explain, residual_gate_add_entry<true>);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(layernorm_modulate, layernorm_modulate_entry<false>);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(layernorm_modulate_explain, layernorm_modulate_entry<true>);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(layernorm_modulate_fp8, layernorm_modulate_fp8_entry<false>);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(layernorm_modulate_fp8_explain, layernorm_modulate_fp8_entry<true>);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(qk_head_layernorm, qk_head_layernorm_entry<false>);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(qk_head_layernorm_explain, qk_head_layernorm_entry<true>);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(norm_scale_shift, norm_scale_shift_entry<false>);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(norm_scale_shift_explain, norm_scale_shift_entry<true>);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(list_kernels, list_kernels);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(version, version);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(reload_config, reload_config);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(clear_failures, clear_failures);
