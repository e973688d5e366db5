#include "core/builtin_ops.h"

namespace ditops {
void register_builtin_ops(Registry& registry) {
  register_qknorm_rope(registry);
  register_residual_gate_add(registry);
  register_layernorm_modulate(registry);
  register_norm_scale_shift(registry);
}
}  // namespace ditops
