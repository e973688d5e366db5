// The C ABI: a generic call over the op table. Every op is reachable through ditops_call with
// the messages the C++ facade gives; nothing here is written per op.
#include "ditops/c_api.h"

#include <cstring>
#include <string>

#include "ditops/op.h"

namespace {

size_t copy_out(const std::string& s, char* out, size_t size) {
  if (out && size > 0) {
    const size_t n = std::min(size - 1, s.size());
    std::memcpy(out, s.data(), n);
    out[n] = '\0';
  }
  return s.size();
}

template <typename F>
int guarded(char* error, size_t error_size, F&& f) {
  try {
    f();
    copy_out("", error, error_size);
    return 0;
  } catch (const std::exception& e) {
    copy_out(e.what(), error, error_size);
    return 1;
  } catch (...) {
    copy_out("unknown error", error, error_size);
    return 1;
  }
}

// The generic call from C arguments; throws Error naming the op and the slot.
ditops::GenericCall to_call(const ditops::OpDescription& op, const DLTensor* const* tensors, size_t num_tensors,
                            const ditops_option* options, size_t num_options) {
  if (num_tensors != op.tensors.size())
    throw ditops::Error(op.name + ": expected " + std::to_string(op.tensors.size()) + " tensors but got " +
                        std::to_string(num_tensors));
  if (num_tensors > 0 && !tensors) throw ditops::Error(op.name + ": the tensor array is NULL");
  if (num_options > 0 && !options) throw ditops::Error(op.name + ": the option array is NULL");
  ditops::GenericCall c = ditops::generic_call(op);
  for (size_t i = 0; i < num_tensors; ++i) {
    if (!tensors[i]) continue;  // absent: the op says whether that is allowed
    try {
      c.tensors[i] = ditops::from_dlpack(*tensors[i]);
    } catch (const ditops::Error& e) {
      throw ditops::Error(op.name + ": " + op.tensors[i].name + ": " + e.what());
    }
    c.given[i] = true;
  }
  for (size_t i = 0; i < num_options; ++i) {
    const ditops_option& o = options[i];
    if (!o.name || !o.value) throw ditops::Error(op.name + ": option " + std::to_string(i) + " has a NULL name or value");
    const std::string name = o.name, value = o.value;
    if (name == "backend") {
      ditops::Provenance p;
      if (!ditops::parse_provenance(value, &p))
        throw ditops::Error(op.name + ": unknown backend '" + value + "' (expected kda, aot, jit, vendor or reference)");
      c.dispatch.backend = p;
    } else if (name == "quality") {
      ditops::Quality q;
      if (!ditops::parse_quality(value, &q))
        throw ditops::Error(op.name + ": unknown quality '" + value + "' (expected exact, lossless or high)");
      c.dispatch.quality = q;
    } else {
      const int k = op.option_index(name);
      if (k < 0) {
        std::string known;
        for (const auto& s : op.options) known += (known.empty() ? "" : ", ") + s.name;
        throw ditops::Error(op.name + ": unknown option '" + name + "' (options: " + known + ", backend, quality)");
      }
      c.options[k] = ditops::parse_option(op, op.options[k], value);
    }
  }
  return c;
}

}  // namespace

extern "C" int ditops_call(const char* op, const DLTensor* const* tensors, size_t num_tensors,
                           const ditops_option* options, size_t num_options, void* stream, char* impl,
                           size_t impl_size, char* error, size_t error_size) {
  return guarded(error, error_size, [&] {
    if (!op) throw ditops::Error("ditops_call: op is NULL");
    const ditops::OpDescription& d = ditops::op(op);
    copy_out(d.run(to_call(d, tensors, num_tensors, options, num_options), stream), impl, impl_size);
  });
}

extern "C" int ditops_explain(const char* op, const DLTensor* const* tensors, size_t num_tensors,
                              const ditops_option* options, size_t num_options, char* report, size_t report_size,
                              char* error, size_t error_size) {
  return guarded(error, error_size, [&] {
    if (!op) throw ditops::Error("ditops_explain: op is NULL");
    const ditops::OpDescription& d = ditops::op(op);
    copy_out(d.explain(to_call(d, tensors, num_tensors, options, num_options)).format(), report, report_size);
  });
}

extern "C" size_t ditops_op_table(char* out, size_t out_size) {
  try {
    return copy_out(ditops::op_table_json(), out, out_size);
  } catch (...) {
    return copy_out("", out, out_size);
  }
}

extern "C" size_t ditops_list_kernels(char* out, size_t out_size) {
  std::string text;
  for (const auto* s : ditops::Registry::global().list())
    text += s->name + "\t" + ditops::provenance_name(s->provenance) + "\t" + s->contract.describe() + "\n";
  return copy_out(text, out, out_size);
}

extern "C" const char* ditops_version(void) { return DITOPS_VERSION; }
