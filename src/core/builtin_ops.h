// Every op family registers its implementations here, once, when the global registry is first
// used (no static-initialization order games).
#pragma once

namespace ditops {
class Registry;
void register_builtin_ops(Registry& registry);
void register_qknorm_rope(Registry& registry);
void register_residual_gate_add(Registry& registry);
void register_layernorm_modulate(Registry& registry);
void register_norm_scale_shift(Registry& registry);
}  // namespace ditops
