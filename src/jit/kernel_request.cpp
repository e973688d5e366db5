#include "jit/kernel_request.h"

namespace ditops::jit {

std::string wrapper_entry(const KernelRequest& r, const std::string& entry_name) {
  const std::string bounds =
      std::to_string(r.max_threads) + (r.min_blocks > 0 ? ", " + std::to_string(r.min_blocks) : "");
  return "extern \"C\" __global__ void __launch_bounds__(" + bounds + ") " +
         entry_name + "(const __grid_constant__ " + r.params_type + " params) {\n  " + r.function +
         "<" + r.template_args + ">(params);\n}\n";
}

std::string wrapper_source(const KernelRequest& r, const std::string& entry_name) {
  return "#include \"" + r.header + "\"\n" + wrapper_entry(r, entry_name);
}

}  // namespace ditops::jit
