#include "core/builtin_ops.h"

namespace ditops {
void register_builtin_ops(Registry& registry) { register_qknorm_rope(registry); }
}  // namespace ditops
