// An empty prebuilt kernel table, for ditops_aotgen itself (it generates the real one).
#include <cstddef>

namespace ditops::jit::generated {
struct AotTableEntry {
  const char* template_key;
  const char* entry_name;
};
extern const AotTableEntry kAotEntries[] = {{nullptr, nullptr}};
alignas(64) extern const unsigned char kAotFatbin[] = {0};
extern const size_t kAotFatbinSize = 0;
}  // namespace ditops::jit::generated
