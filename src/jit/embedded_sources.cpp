#include "jit/embedded_sources.h"

#include <string>

namespace ditops::jit {

namespace generated {
struct EmbeddedFile {
  const char* name;
  const unsigned char* data;
  size_t size;
};
extern const EmbeddedFile kEmbeddedKernelFiles[];  // terminated by {nullptr, ...}
}  // namespace generated

const std::vector<SourceFile>& embedded_sources() {
  static const std::vector<SourceFile>* files = [] {
    auto* v = new std::vector<SourceFile>();
    for (const auto* f = generated::kEmbeddedKernelFiles; f->name; ++f)
      v->push_back({f->name, std::string(reinterpret_cast<const char*>(f->data), f->size)});
    return v;
  }();
  return *files;
}

uint64_t embedded_sources_hash() {
  static const uint64_t hash = [] {
    uint64_t h = fnv1a("", 0);
    for (const auto& f : embedded_sources()) {
      h = fnv1a(f.name.data(), f.name.size(), h);
      h = fnv1a(f.contents.data(), f.contents.size(), h);
    }
    return h;
  }();
  return hash;
}

}  // namespace ditops::jit
