#include "ditops/c_api.h"

#include <cstring>

#include "ditops/qknorm_rope.h"

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
