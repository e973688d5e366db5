// Every op family registers its implementations here, once, when the global registry is first
// used (no static-initialization order games).
#pragma once

namespace ditops {
class Registry;
void register_builtin_ops(Registry& registry);
void register_qknorm_rope(Registry& registry);
}  // namespace ditops
