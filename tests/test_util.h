// Small helpers shared by the C++ tests.
#pragma once

#include <cstdlib>
#include <functional>
#include <optional>
#include <string>

#include "ditops/registry.h"
#include "ditops/tensor.h"

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

}  // namespace ditops::test_util
