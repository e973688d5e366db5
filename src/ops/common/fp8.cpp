#include "ops/common/fp8.h"

#include "core/enum_name.h"

#include <cmath>

namespace ditops {

const char* fp8_reciprocal_name(Fp8Reciprocal mode) { return enumerator_name(mode); }

void check_host_scale(const char* op, const char* name, const TensorView& scale) {
  if (scale.device.kind != DeviceKind::cpu || !scale.data) return;
  const float s = *static_cast<const float*>(scale.data);
  if (!(s > 0.0f) || !std::isfinite(s))
    throw InvalidArgument(std::string(op) + ": " + name + " must be finite and > 0 but is " + std::to_string(s) +
                          " (checked on the cpu only: a CUDA scale is read by the kernel)");
}

std::string fp8_reciprocal_refusal(Fp8Reciprocal mode, bool div_full) {
  if ((mode == Fp8Reciprocal::div_full) == div_full) return "";
  return std::string("handles fp8_reciprocal=") + (div_full ? "div_full" : "ieee") + " only";
}

}  // namespace ditops
