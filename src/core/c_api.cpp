#include "ditops/c_api.h"

#include <cstring>

#include "ditops/layernorm_modulate.h"
#include "ditops/norm_scale_shift.h"
#include "ditops/qknorm_rope.h"
#include "ditops/residual_gate_add.h"

namespace {

void copy_out(const std::string& s, char* out, size_t size) {
  if (!out || size == 0) return;
  const size_t n = std::min(size - 1, s.size());
  std::memcpy(out, s.data(), n);
  out[n] = '\0';
}

ditops::QkNormRopeOptions to_options(const ditops_qknorm_rope_options* o) {
  ditops::QkNormRopeOptions opts;
  if (!o) return opts;
  opts.is_neox = o->is_neox != 0;
  opts.eps = o->eps;
  opts.rope_dim = o->rope_dim;
  opts.cache_full_width = o->cache_full_width != 0;
  opts.rounding = o->rounding ? ditops::QkRounding::fp32 : ditops::QkRounding::rounded;
  opts.norm_order = o->norm_order ? ditops::QkNormOrder::warp : ditops::QkNormOrder::aten;
  opts.use_pdl = o->use_pdl != 0;
  if (o->backend && *o->backend) {
    ditops::Provenance p;
    if (!ditops::parse_provenance(o->backend, &p))
      throw ditops::Error(std::string("unknown backend '") + o->backend + "'");
    opts.dispatch.backend = p;
  }
  if (o->quality && *o->quality) {
    ditops::Quality q;
    if (!ditops::parse_quality(o->quality, &q))
      throw ditops::Error(std::string("unknown quality '") + o->quality + "'");
    opts.dispatch.quality = q;
  }
  return opts;
}

template <typename F>
int guarded(char* error, size_t error_size, F&& f) {
  try {
    f();
    copy_out("", error, error_size);
    return 0;
  } catch (const std::exception& e) {
    copy_out(e.what(), error, error_size);
    return 1;
  }
}

}  // namespace

extern "C" int ditops_qknorm_rope(const DLTensor* q, const DLTensor* k, const DLTensor* q_weight,
                                  const DLTensor* k_weight, const DLTensor* cos_sin_cache,
                                  const DLTensor* positions, const ditops_qknorm_rope_options* options,
                                  void* stream, char* impl, size_t impl_size, char* error,
                                  size_t error_size) {
  return guarded(error, error_size, [&] {
    const std::string ran = ditops::qknorm_rope(
        ditops::from_dlpack(*q), ditops::from_dlpack(*k), ditops::from_dlpack(*q_weight),
        ditops::from_dlpack(*k_weight), ditops::from_dlpack(*cos_sin_cache),
        ditops::from_dlpack(*positions), to_options(options), stream);
    copy_out(ran, impl, impl_size);
  });
}

extern "C" int ditops_qknorm_rope_explain(const DLTensor* q, const DLTensor* k,
                                          const DLTensor* q_weight, const DLTensor* k_weight,
                                          const DLTensor* cos_sin_cache, const DLTensor* positions,
                                          const ditops_qknorm_rope_options* options, char* report,
                                          size_t report_size, char* error, size_t error_size) {
  return guarded(error, error_size, [&] {
    const auto call = ditops::match_qknorm_rope(
        ditops::from_dlpack(*q), ditops::from_dlpack(*k), ditops::from_dlpack(*q_weight),
        ditops::from_dlpack(*k_weight), ditops::from_dlpack(*cos_sin_cache),
        ditops::from_dlpack(*positions), to_options(options));
    copy_out(ditops::explain_qknorm_rope(call).format(), report, report_size);
  });
}

extern "C" int ditops_list_kernels(char* out, size_t out_size) {
  std::string text;
  for (const auto* s : ditops::Registry::global().list())
    text += s->name + "\t" + ditops::provenance_name(s->provenance) + "\t" + s->contract.describe() + "\n";
  copy_out(text, out, out_size);
  return 0;
}

extern "C" const char* ditops_version(void) { return DITOPS_VERSION; }

namespace {
ditops::ResidualGateAddOptions to_rga_options(const ditops_residual_gate_add_options* o) {
  ditops::ResidualGateAddOptions opts;
  if (!o) return opts;
  opts.use_pdl = o->use_pdl != 0;
  // The dispatch fields parse exactly as qknorm_rope's do.
  ditops_qknorm_rope_options shared{};
  shared.backend = o->backend;
  shared.quality = o->quality;
  opts.dispatch = to_options(&shared).dispatch;
  return opts;
}
}  // namespace

extern "C" int ditops_residual_gate_add(const DLTensor* residual, const DLTensor* update, const DLTensor* gate,
                                        const DLTensor* out, const ditops_residual_gate_add_options* options,
                                        void* stream, char* impl, size_t impl_size, char* error,
                                        size_t error_size) {
  return guarded(error, error_size, [&] {
    const std::string ran = ditops::residual_gate_add(ditops::from_dlpack(*residual), ditops::from_dlpack(*update),
                                                      ditops::from_dlpack(*gate), ditops::from_dlpack(*out),
                                                      to_rga_options(options), stream);
    copy_out(ran, impl, impl_size);
  });
}

extern "C" int ditops_residual_gate_add_explain(const DLTensor* residual, const DLTensor* update,
                                                const DLTensor* gate, const DLTensor* out,
                                                const ditops_residual_gate_add_options* options, char* report,
                                                size_t report_size, char* error, size_t error_size) {
  return guarded(error, error_size, [&] {
    const auto call = ditops::match_residual_gate_add(ditops::from_dlpack(*residual), ditops::from_dlpack(*update),
                                                      ditops::from_dlpack(*gate), ditops::from_dlpack(*out),
                                                      to_rga_options(options));
    copy_out(ditops::explain_residual_gate_add(call).format(), report, report_size);
  });
}

namespace {
ditops::LayerNormModulateOptions to_lnm_options(const ditops_layernorm_modulate_options* o) {
  ditops::LayerNormModulateOptions opts;
  if (!o) return opts;
  opts.eps = o->eps;
  if (o->fp8_reciprocal != 0 && o->fp8_reciprocal != 1)
    throw ditops::Error("fp8_reciprocal must be 0 (ieee) or 1 (div_full) but is " + std::to_string(o->fp8_reciprocal));
  opts.fp8_reciprocal = o->fp8_reciprocal ? ditops::Fp8Reciprocal::div_full : ditops::Fp8Reciprocal::ieee;
  if (o->mapping < 0 || o->mapping > 2)
    throw ditops::Error("mapping must be 0 (automatic), 1 (warp) or 2 (cta) but is " + std::to_string(o->mapping));
  opts.mapping = static_cast<ditops::LnRowMapping>(o->mapping);
  opts.use_pdl = o->use_pdl != 0;
  ditops_qknorm_rope_options shared{};  // the dispatch fields parse exactly as qknorm_rope's do
  shared.backend = o->backend;
  shared.quality = o->quality;
  opts.dispatch = to_options(&shared).dispatch;
  return opts;
}
ditops::TensorView optional_view(const DLTensor* t) { return t ? ditops::from_dlpack(*t) : ditops::TensorView{}; }
}  // namespace

extern "C" int ditops_layernorm_modulate(const DLTensor* x, const DLTensor* scale, const DLTensor* shift,
                                         const DLTensor* out, const ditops_layernorm_modulate_options* options,
                                         void* stream, char* impl, size_t impl_size, char* error,
                                         size_t error_size) {
  return guarded(error, error_size, [&] {
    copy_out(ditops::layernorm_modulate(ditops::from_dlpack(*x), ditops::from_dlpack(*scale), optional_view(shift),
                                        ditops::from_dlpack(*out), to_lnm_options(options), stream),
             impl, impl_size);
  });
}

extern "C" int ditops_layernorm_modulate_fp8(const DLTensor* x, const DLTensor* scale, const DLTensor* shift,
                                             const DLTensor* input_scale, const DLTensor* out,
                                             const ditops_layernorm_modulate_options* options, void* stream,
                                             char* impl, size_t impl_size, char* error, size_t error_size) {
  return guarded(error, error_size, [&] {
    copy_out(ditops::layernorm_modulate_fp8(ditops::from_dlpack(*x), ditops::from_dlpack(*scale),
                                            optional_view(shift), ditops::from_dlpack(*input_scale),
                                            ditops::from_dlpack(*out), to_lnm_options(options), stream),
             impl, impl_size);
  });
}

extern "C" int ditops_qk_head_layernorm(const DLTensor* q, const DLTensor* k, const DLTensor* q_out,
                                        const DLTensor* k_out, const ditops_layernorm_modulate_options* options,
                                        void* stream, char* impl, size_t impl_size, char* error,
                                        size_t error_size) {
  return guarded(error, error_size, [&] {
    copy_out(ditops::qk_head_layernorm(ditops::from_dlpack(*q), ditops::from_dlpack(*k), ditops::from_dlpack(*q_out),
                                       ditops::from_dlpack(*k_out), to_lnm_options(options), stream),
             impl, impl_size);
  });
}

extern "C" int ditops_layernorm_modulate_explain(const DLTensor* x, const DLTensor* scale, const DLTensor* shift,
                                                 const DLTensor* input_scale, const DLTensor* out,
                                                 const ditops_layernorm_modulate_options* options, char* report,
                                                 size_t report_size, char* error, size_t error_size) {
  return guarded(error, error_size, [&] {
    const auto opts = to_lnm_options(options);
    const auto call = input_scale
        ? ditops::match_layernorm_modulate_fp8(ditops::from_dlpack(*x), ditops::from_dlpack(*scale),
                                               optional_view(shift), ditops::from_dlpack(*input_scale),
                                               ditops::from_dlpack(*out), opts)
        : ditops::match_layernorm_modulate(ditops::from_dlpack(*x), ditops::from_dlpack(*scale),
                                           optional_view(shift), ditops::from_dlpack(*out), opts);
    copy_out(ditops::explain_layernorm_modulate(call).format(), report, report_size);
  });
}

namespace {
ditops::TensorView nss_view(const DLTensor* t) { return t ? ditops::from_dlpack(*t) : ditops::TensorView{}; }

void nss_unpack(const ditops_norm_scale_shift_tensors* t, const ditops_norm_scale_shift_options* o,
                ditops::NormScaleShiftInputs* in, ditops::NormScaleShiftOutputs* out,
                ditops::NormScaleShiftOptions* opts) {
  if (!t) throw ditops::Error("norm_scale_shift: tensors is NULL");
  in->x = nss_view(t->x);
  in->residual = nss_view(t->residual);
  in->gate = nss_view(t->gate);
  in->weight = nss_view(t->weight);
  in->bias = nss_view(t->bias);
  in->scale = nss_view(t->scale);
  in->shift = nss_view(t->shift);
  in->input_scale = nss_view(t->input_scale);
  in->global_scale = nss_view(t->global_scale);
  out->y = nss_view(t->y);
  out->residual_out = nss_view(t->residual_out);
  out->fp8 = nss_view(t->fp8);
  out->nvfp4_packed = nss_view(t->nvfp4_packed);
  out->nvfp4_scales = nss_view(t->nvfp4_scales);
  if (!o) return;
  opts->norm = o->norm_type ? ditops::NormType::rms : ditops::NormType::layer;
  opts->eps = o->eps;
  opts->numerics = o->numerics ? ditops::NssNumerics::sglang : ditops::NssNumerics::eager;
  opts->fp8_reciprocal = o->fp8_reciprocal ? ditops::Fp8Reciprocal::div_full : ditops::Fp8Reciprocal::ieee;
  opts->e2m1 = o->e2m1 == 1   ? ditops::E2m1Conversion::software
               : o->e2m1 == 2 ? ditops::E2m1Conversion::hardware
                              : ditops::E2m1Conversion::automatic;
  opts->use_pdl = o->use_pdl != 0;
  if (o->backend && *o->backend) {
    ditops::Provenance p;
    if (!ditops::parse_provenance(o->backend, &p)) throw ditops::Error(std::string("unknown backend '") + o->backend + "'");
    opts->dispatch.backend = p;
  }
  if (o->quality && *o->quality) {
    ditops::Quality q;
    if (!ditops::parse_quality(o->quality, &q)) throw ditops::Error(std::string("unknown quality '") + o->quality + "'");
    opts->dispatch.quality = q;
  }
}
}  // namespace

extern "C" int ditops_norm_scale_shift(const ditops_norm_scale_shift_tensors* tensors,
                                       const ditops_norm_scale_shift_options* options, void* stream, char* impl,
                                       size_t impl_size, char* error, size_t error_size) {
  return guarded(error, error_size, [&] {
    ditops::NormScaleShiftInputs in;
    ditops::NormScaleShiftOutputs out;
    ditops::NormScaleShiftOptions opts;
    nss_unpack(tensors, options, &in, &out, &opts);
    copy_out(ditops::norm_scale_shift(in, out, opts, stream), impl, impl_size);
  });
}

extern "C" int ditops_norm_scale_shift_explain(const ditops_norm_scale_shift_tensors* tensors,
                                               const ditops_norm_scale_shift_options* options, char* report,
                                               size_t report_size, char* error, size_t error_size) {
  return guarded(error, error_size, [&] {
    ditops::NormScaleShiftInputs in;
    ditops::NormScaleShiftOutputs out;
    ditops::NormScaleShiftOptions opts;
    nss_unpack(tensors, options, &in, &out, &opts);
    copy_out(ditops::explain_norm_scale_shift(ditops::match_norm_scale_shift(in, out, opts)).format(), report,
             report_size);
  });
}
