// What the FP8 ops share on the host (token_cat_fp8, fp8_static_quant, layernorm_modulate_fp8,
// fp8_linear, norm_scale_shift): the fp8_reciprocal option, the check of a scale the host can
// read, and one implementation per reciprocal mode.
#pragma once

#include <string>
#include <utility>

#include "core/implementation.h"
#include "core/op_builder.h"
#include "ditops/fp8_reciprocal.h"

namespace ditops {

// The fp8_reciprocal option of a description (Member: &<Op>Options::fp8_reciprocal); `scale`
// names the tensor inverted.
template <auto Member, typename Builder>
void describe_fp8_reciprocal(Builder& b, const std::string& scale) {
  b.template choice<Member>({Fp8Reciprocal::ieee, Fp8Reciprocal::div_full},
                            "1/" + scale + " as eager's IEEE division (ieee) or SGLang's div.full (div_full)");
}

// A static scale must be finite and > 0. Checked where reading it costs nothing, on the CPU (an
// InvalidArgument naming the op and the tensor); a CUDA scale is read by the kernel only, which
// computes eager's formula for any value (reading it here would synchronize).
void check_host_scale(const char* op, const char* name, const TensorView& scale);

// "" when an implementation of one reciprocal mode (div_full or ieee) takes a call of `mode`.
std::string fp8_reciprocal_refusal(Fp8Reciprocal mode, bool div_full);

// Registers `impl` once per reciprocal mode: impl.name for ieee and impl.name + "_div_full", each
// refusing the other mode's calls (after impl's own predicate); `adapt(one, div_full)` sets what
// differs (contract, description). The kernel variants are listed once, under the ieee one.
template <typename Call, typename Key, typename Adapt>
void add_per_reciprocal(Registry& registry, const std::string& op, const Implementation<Call, Key>& impl,
                        const Adapt& adapt) {
  for (const bool div_full : {false, true}) {
    Implementation<Call, Key> one = impl;
    one.name = impl.name + (div_full ? "_div_full" : "");
    one.predicate = [div_full, own = impl.predicate](const Call& c, const Key& k) -> std::string {
      if (std::string why = own(c, k); !why.empty()) return why;
      return fp8_reciprocal_refusal(c.options.fp8_reciprocal, div_full);
    };
    if (div_full) one.variants = nullptr;
    adapt(one, div_full);
    add_implementation(registry, op, std::move(one));
  }
}

}  // namespace ditops
