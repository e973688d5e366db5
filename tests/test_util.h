// Small helpers shared by the C++ tests.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "ditops/registry.h"
#include "ditops/tensor.h"
#include "reference/half.h"

namespace ditops::test_util {

// The message of the ditops::Error `f` throws; "" when it throws none.
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Sets an environment variable (nullptr: unsets it) and re-reads ditops' configuration; the
// destructor restores the previous value and re-reads it again.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) previous_ = old;
    set(value);
  }
  ~ScopedEnv() { set(previous_ ? previous_->c_str() : nullptr); }
  void set(const char* value) {
    if (value) setenv(name_.c_str(), value, 1);
    else unsetenv(name_.c_str());
    reload_config();
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_;
  std::optional<std::string> previous_;
};

// Zeroed host memory under a contiguous CPU view of `shape`: 16-byte aligned, or `offset_bytes`
// past that (a misaligned view), with slack behind it.
struct HostTensor {
  std::vector<uint8_t> bytes;
  TensorView view;
  HostTensor(DType dtype, std::vector<int64_t> shape, int offset_bytes = 0) {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    bytes.assign(static_cast<size_t>(n) * dtype_size(dtype) + 64, 0);
    uint8_t* base = bytes.data() + (16 - reinterpret_cast<uintptr_t>(bytes.data()) % 16) % 16 + offset_bytes;
    view = TensorView::contiguous(base, dtype, {DeviceKind::cpu, 0}, shape);
  }
  // One f32 value: a scale.
  static HostTensor scalar(float value) {
    HostTensor t(DType::f32, {1});
    t.set(0, value);
    return t;
  }
  float get(int64_t i) const { return ref::load_act(view.data, i, view.dtype); }  // f32, f16, bf16
  void set(int64_t i, float v) { ref::store_act(view.data, i, view.dtype, v); }
  void set_bits(int64_t i, uint16_t b) { u16()[i] = b; }
  uint8_t byte(int64_t i) const { return u8()[i]; }
  uint8_t* u8() const { return static_cast<uint8_t*>(view.data); }
  uint16_t* u16() const { return static_cast<uint16_t*>(view.data); }
};

}  // namespace ditops::test_util
