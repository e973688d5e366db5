// Kernel requests of the layernorm_modulate family that tests compile directly (no GPU needed
// for NVRTC): every template key the op can request, and the primitives' self-check kernel.
#pragma once

#include <vector>

#include "jit/kernel_request.h"

namespace ditops {

std::vector<KernelRequest> layernorm_modulate_all_requests();
// Entry over kernels/layernorm_modulate.cuh aten_ln_selfcheck_body (AtenLnSelfcheckParams).
KernelRequest aten_ln_selfcheck_request();

}  // namespace ditops
