#include "jit/kernel_request.h"

#include <cctype>

namespace ditops {

void throw_key_digit_error(int digit, uint64_t value, uint64_t bound) {
  if (value >= bound)
    throw Error("kernel key: digit " + std::to_string(digit) + " is " + std::to_string(value) + ", not below its bound " +
                std::to_string(bound) + " (it would alias another kernel)");
  throw Error("kernel key: the bounds up to digit " + std::to_string(digit) + " pass 64 bits");
}

}  // namespace ditops

namespace ditops::jit {

const char* kernel_type_name(DType dtype) {
  switch (dtype) {
    case DType::bf16: return "ditops::kernel::bf16";
    case DType::f16: return "ditops::kernel::f16";
    case DType::f8e4m3fn: return "ditops::kernel::e4m3";
    case DType::f32: return "float";
    case DType::i32: return "int";
    case DType::i64: return "long long";
    default: throw Error(std::string("no kernel type for dtype ") + dtype_name(dtype));
  }
}

std::string wrapper_entry(const KernelRequest& r, const std::string& entry_name) {
  const std::string bounds =
      std::to_string(r.max_threads) + (r.min_blocks > 0 ? ", " + std::to_string(r.min_blocks) : "");
  return "extern \"C\" __global__ void __launch_bounds__(" + bounds + ") " +
         entry_name + "(const __grid_constant__ " + r.params_type + " params) {\n  " + r.function +
         "<" + r.template_args + ">(params);\n}\n";
}

std::string jit_entry_name(const KernelRequest& r) {
  const std::string op = r.template_key.substr(0, r.template_key.find(':'));
  if (op.empty()) return "ditops_entry";
  std::string name = "ditops_";
  for (char c : op) name += (std::isalnum(static_cast<unsigned char>(c)) || c == '_') ? c : '_';
  return name;
}

std::string wrapper_source(const KernelRequest& r, const std::string& entry_name) {
  return "#include \"" + r.header + "\"\n" + wrapper_entry(r, entry_name);
}

}  // namespace ditops::jit
