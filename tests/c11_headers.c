/* The public C headers compile as C11 (tests/CMakeLists.txt: c11_headers, gcc -std=c11
   -fsyntax-only -pedantic-errors). */
#include "ditops/dlpack.h"

int ditops_c11_headers_check(const DLTensor* t) {
  DLManagedTensorVersioned m;
  m.dl_tensor = *t;
  m.flags = DLPACK_FLAG_BITMASK_READ_ONLY;
  return (int)m.dl_tensor.ndim + (int)(m.flags & 1u) + (int)sizeof(DLDataType);
}
