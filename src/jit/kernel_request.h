// What the JIT and the AOT build need to know about one kernel instance, and the source they
// compile for it. Plain data and strings, no dependency on the driver: the registry lists an
// implementation's instances as these (KernelSpec::prebuilt, ::variants), the JIT (src/jit)
// compiles them and the build-time AOT generator (tools/aotgen.cpp) reads them.
#pragma once

#include <concepts>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <type_traits>

#include "ditops/tensor.h"

namespace ditops {

// A __device__ function template of a kernel header instantiated with template arguments; it is
// wrapped in an extern "C" __global__ entry taking the Params struct by value
// (__grid_constant__). The JIT (NVRTC) and the AOT build (nvcc) compile the same wrapper.
struct KernelRequest {
  std::string header;         // "qknorm_rope.cuh"
  std::string function;       // "ditops::qknorm_rope_body"
  std::string template_args;  // "ditops::kernel::bf16, float, ..."
  std::string params_type;    // "ditops::QkNormRopeParams"
  int max_threads = 256;      // __launch_bounds__
  int min_blocks = 0;         // __launch_bounds__' minimum resident blocks per SM (0: ptxas decides)
  std::string template_key;   // human-readable key, part of the cache key
};

namespace jit {

// Template arguments as the kernel sources spell them: the device type of a DType
// ("ditops::kernel::bf16", "float", "long long", ...) and a bool ("true"/"false").
const char* kernel_type_name(DType dtype);
inline const char* kernel_bool(bool b) { return b ? "true" : "false"; }

// One template argument as the kernel sources spell it: a DType its device type, a bool
// "true"/"false", an integer its digits, a string (a constant's name) itself.
inline std::string kernel_arg(DType dtype) { return kernel_type_name(dtype); }
inline std::string kernel_arg(const char* s) { return s; }
inline std::string kernel_arg(const std::string& s) { return s; }
template <typename T>
  requires std::same_as<T, bool>
std::string kernel_arg(T b) {
  return kernel_bool(b);
}
template <typename T>
  requires(std::is_integral_v<T> && !std::same_as<T, bool>)
std::string kernel_arg(T v) {
  return std::to_string(v);
}

// A request's template_args: the arguments in the kernel template's order, ", "-separated.
template <typename... Args>
std::string kernel_args(const Args&... args) {
  std::string out;
  ((out += (out.empty() ? "" : ", ") + kernel_arg(args)), ...);
  return out;
}

}  // namespace jit

// One field of a kernel key as a digit of its packed() number: a bool, a DType, or a value with
// the count of values the field can take (an enum's, a bucketed integer's).
struct KeyDigit {
  uint64_t value;
  uint64_t bound;
  template <typename T>
    requires std::same_as<T, bool>
  constexpr KeyDigit(T b) : value(b), bound(2) {}
  constexpr KeyDigit(DType d) : value(static_cast<uint64_t>(d)), bound(static_cast<uint64_t>(DType::i64) + 1) {}
  template <typename T>
    requires(std::is_enum_v<T> || (std::is_integral_v<T> && !std::same_as<T, bool>))
  constexpr KeyDigit(T v, uint64_t bound) : value(static_cast<uint64_t>(v)), bound(bound) {}
};

// A kernel key's packed() (the kernel memo's and the decision cache's number for it): its fields
// as digits, each below its bound, so two keys get one number only when every field is equal. A
// value at or past its bound, or bounds whose product passes 64 bits, would alias another
// kernel: either throws Error naming the digit.
// Inline, so that the bounds (constants) fold and a bool digit costs what `v * 2 + b` does.
[[noreturn]] void throw_key_digit_error(int digit, uint64_t value, uint64_t bound);
constexpr uint64_t pack_key(std::initializer_list<KeyDigit> digits) {
  uint64_t v = 0, room = 1;
  int i = 0;
  for (const KeyDigit& d : digits) {
    if (d.value >= d.bound || __builtin_mul_overflow(room, d.bound, &room)) throw_key_digit_error(i, d.value, d.bound);
    v = v * d.bound + d.value;
    ++i;
  }
  return v;
}

namespace jit {

// The JIT's name for `request`'s entry: "ditops_" and the op its template key starts with
// ("fp8_rowwise_quant:..." -> ditops_fp8_rowwise_quant), so that a profiler's kernel list tells the
// ops apart; "ditops_entry" for a request without a key.
std::string jit_entry_name(const KernelRequest& request);

// Source of the wrapper translation unit for `request`, with its entry named `entry_name`.
std::string wrapper_source(const KernelRequest& request, const std::string& entry_name);
// Only the entry definition (no #include), for concatenating several entries into one unit.
std::string wrapper_entry(const KernelRequest& request, const std::string& entry_name);

}  // namespace jit
}  // namespace ditops
