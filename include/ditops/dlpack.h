// DLPack interchange. The structs below follow the published DLPack 1.x ABI (field order and
// widths), written out here so that ditops needs no third-party header.
//
// Valid C11 as well as C++: C sees the DLPack structs only (tests/c11_headers.c checks it).
#pragma once

#ifdef __cplusplus
#include <cstdint>
extern "C" {
#else
#include <stdint.h>
#endif

#ifndef DLPACK_MAJOR_VERSION
#define DITOPS_DEFINES_DLPACK 1

typedef enum {
  kDLCPU = 1,
  kDLCUDA = 2,
  kDLCUDAHost = 3,
  kDLCUDAManaged = 13,
} DLDeviceType;

typedef struct {
  int32_t device_type;  // DLDeviceType
  int32_t device_id;
} DLDevice;

typedef enum {
  kDLInt = 0,
  kDLUInt = 1,
  kDLFloat = 2,
  kDLBfloat = 4,
  kDLFloat8_e4m3fn = 10,
  kDLFloat8_e5m2 = 12,
  kDLFloat4_e2m1fn = 17,
} DLDataTypeCode;

typedef struct {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
} DLDataType;

typedef struct {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;  // may be NULL: compact row-major
  uint64_t byte_offset;
} DLTensor;

typedef struct {
  uint32_t major;
  uint32_t minor;
} DLPackVersion;

typedef struct DLManagedTensorVersioned {
  DLPackVersion version;
  void* manager_ctx;
  void (*deleter)(struct DLManagedTensorVersioned* self);
  uint64_t flags;
  DLTensor dl_tensor;
} DLManagedTensorVersioned;

#define DLPACK_FLAG_BITMASK_READ_ONLY (1ULL << 0)
#endif

#ifdef __cplusplus
}  // extern "C"

#include "ditops/tensor.h"

namespace ditops {

// View of a DLTensor (byte_offset folded into data). Throws Error for dtypes, devices or ranks
// ditops does not handle. fp4 e2m1 with lanes == 2 (or bits == 4) maps to fp4e2m1x2 with the
// last dimension counted in bytes.
TensorView from_dlpack(const DLTensor& tensor);
// Throws Error when the producer marked the tensor read-only and `writable` is requested.
TensorView from_dlpack(const DLManagedTensorVersioned& tensor, bool writable = false);

// A managed DLPack tensor describing `view` (the data is borrowed, not copied: the caller keeps
// the memory alive). Shape and strides are owned by the result; call its deleter to free them.
DLManagedTensorVersioned* to_dlpack_versioned(const TensorView& view);
DLDataType to_dlpack_dtype(DType dtype);

}  // namespace ditops
#endif  // __cplusplus
