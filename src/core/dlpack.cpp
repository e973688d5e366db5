#include "ditops/dlpack.h"

#include <string>

namespace ditops {

namespace {

// No allocation, host or device, reaches 2^48 bytes (256 TiB): a byte_offset or a span past it
// is a corrupt tensor, refused before an address is formed from it.
constexpr int64_t kMaxBytes = int64_t{1} << 48;

bool dtype_from_dlpack(DLDataType t, DType* out) {
  if (t.code == kDLFloat && t.bits == 32 && t.lanes == 1) return *out = DType::f32, true;
  if (t.code == kDLFloat && t.bits == 16 && t.lanes == 1) return *out = DType::f16, true;
  if (t.code == kDLBfloat && t.bits == 16 && t.lanes == 1) return *out = DType::bf16, true;
  if (t.code == kDLFloat8_e4m3fn && t.bits == 8 && t.lanes == 1) return *out = DType::f8e4m3fn, true;
  if (t.code == kDLFloat8_e5m2 && t.bits == 8 && t.lanes == 1) return *out = DType::f8e5m2, true;
  // Packed fp4 pairs: two 4-bit lanes, or one byte holding the pair.
  if (t.code == kDLFloat4_e2m1fn && ((t.bits == 4 && t.lanes == 2) || (t.bits == 8 && t.lanes == 1)))
    return *out = DType::fp4e2m1x2, true;
  if (t.code == kDLUInt && t.bits == 8 && t.lanes == 1) return *out = DType::u8, true;
  if (t.code == kDLInt && t.bits == 32 && t.lanes == 1) return *out = DType::i32, true;
  if (t.code == kDLInt && t.bits == 64 && t.lanes == 1) return *out = DType::i64, true;
  return false;
}

// A DLPack dtype as numpy and torch name it (float64, complex64, bool, int16, float32x4), with
// its codes: what an unsupported tensor is, for the message.
std::string dlpack_dtype_text(DLDataType t) {
  const char* base = t.code == kDLInt ? "int" : t.code == kDLUInt ? "uint" : t.code == kDLFloat ? "float"
                   : t.code == kDLBfloat ? "bfloat" : t.code == 5 ? "complex" : t.code == 6 ? "bool" : nullptr;
  std::string name = base ? std::string(base) + (t.code == 6 ? "" : std::to_string(t.bits)) : "an unknown dtype";
  if (base && t.lanes != 1) name += "x" + std::to_string(t.lanes);
  return name + " (DLPack code " + std::to_string(t.code) + ", bits " + std::to_string(t.bits) + ", lanes " +
         std::to_string(t.lanes) + ")";
}

struct ManagedHolder {
  DLManagedTensorVersioned managed;
  int64_t shape[kMaxRank];
  int64_t strides[kMaxRank];
};

void delete_holder(DLManagedTensorVersioned* self) {
  delete static_cast<ManagedHolder*>(self->manager_ctx);
}

}  // namespace

DLDataType to_dlpack_dtype(DType dtype) {
  switch (dtype) {
    case DType::f32: return {kDLFloat, 32, 1};
    case DType::f16: return {kDLFloat, 16, 1};
    case DType::bf16: return {kDLBfloat, 16, 1};
    case DType::f8e4m3fn: return {kDLFloat8_e4m3fn, 8, 1};
    case DType::f8e5m2: return {kDLFloat8_e5m2, 8, 1};
    case DType::fp4e2m1x2: return {kDLFloat4_e2m1fn, 4, 2};
    case DType::u8: return {kDLUInt, 8, 1};
    case DType::i32: return {kDLInt, 32, 1};
    case DType::i64: return {kDLInt, 64, 1};
  }
  return {kDLUInt, 8, 1};
}

TensorView from_dlpack(const DLTensor& tensor) {
  TensorView view;
  if (tensor.ndim < 0 || tensor.ndim > kMaxRank)
    throw Error("from_dlpack: rank " + std::to_string(tensor.ndim) + " is outside [0, " +
                std::to_string(kMaxRank) + "]");
  if (!dtype_from_dlpack(tensor.dtype, &view.dtype))
    throw Error("from_dlpack: unsupported dtype " + dlpack_dtype_text(tensor.dtype) +
                "; the dtypes ditops takes: f32, f16, bf16, f8e4m3fn, f8e5m2, fp4e2m1x2, u8, i32, i64");
  switch (tensor.device.device_type) {
    case kDLCPU:
    case kDLCUDAHost:
      view.device = {DeviceKind::cpu, 0};
      break;
    case kDLCUDA:
    case kDLCUDAManaged:
      if (tensor.device.device_id < 0)
        throw Error("from_dlpack: device_id must be >= 0 but is " + std::to_string(tensor.device.device_id));
      view.device = {DeviceKind::cuda, tensor.device.device_id};
      break;
    default:
      throw Error("from_dlpack: unsupported device type " +
                  std::to_string(tensor.device.device_type));
  }
  if (tensor.ndim > 0 && !tensor.shape) throw Error("from_dlpack: shape is NULL for rank " + std::to_string(tensor.ndim));
  bool empty = false;
  for (int i = 0; i < tensor.ndim; ++i) {
    if (tensor.shape[i] < 0)
      throw Error("from_dlpack: shape[" + std::to_string(i) + "] must be >= 0 but is " + std::to_string(tensor.shape[i]));
    empty = empty || tensor.shape[i] == 0;
  }
  view.rank = tensor.ndim;
  int64_t compact = 1;
  for (int i = view.rank - 1; i >= 0; --i) {
    view.shape[i] = tensor.shape[i];
    view.strides[i] = tensor.strides ? tensor.strides[i] : compact;
    // The compact strides of an empty tensor may overflow; they address nothing.
    if (__builtin_mul_overflow(compact, tensor.shape[i], &compact)) compact = 0;
  }
  if (tensor.byte_offset > static_cast<uint64_t>(kMaxBytes))
    throw Error("from_dlpack: byte_offset " + std::to_string(tensor.byte_offset) +
                " is larger than any allocation (2^48 bytes)");
  if (empty) {  // addresses nothing: data may be NULL and byte_offset anything sane
    view.data = reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(tensor.data) + tensor.byte_offset);
    return view;
  }
  // The bytes the view addresses, relative to data + byte_offset: [low, high + size).
  int64_t numel = 1, low = 0, high = 0;
  const int64_t size = static_cast<int64_t>(dtype_size(view.dtype));
  for (int i = 0; i < view.rank; ++i) {
    int64_t reach = 0;
    if (__builtin_mul_overflow(numel, view.shape[i], &numel) ||
        __builtin_mul_overflow(view.shape[i] - 1, view.strides[i], &reach) ||
        __builtin_mul_overflow(reach, size, &reach) ||
        __builtin_add_overflow(reach < 0 ? low : high, reach, reach < 0 ? &low : &high))
      throw Error("from_dlpack: shape and strides address more than 2^63 bytes (" + view.describe() + ")");
  }
  const uint64_t span = static_cast<uint64_t>(high) + static_cast<uint64_t>(size) - static_cast<uint64_t>(low);
  if (span > static_cast<uint64_t>(kMaxBytes))
    throw Error("from_dlpack: the tensor spans " + std::to_string(span) +
                " bytes, more than any allocation (2^48) (" + view.describe() + ")");
  if (!tensor.data)
    throw Error("from_dlpack: data is NULL but the tensor has " + std::to_string(numel) + " elements (" +
                view.describe() + ")");
  const auto base = reinterpret_cast<uintptr_t>(tensor.data);
  uintptr_t first = 0, end = 0;
  if (__builtin_add_overflow(base, static_cast<uintptr_t>(tensor.byte_offset), &first) ||
      first < uintptr_t{0} - static_cast<uintptr_t>(low) ||
      __builtin_add_overflow(first, static_cast<uintptr_t>(high) + static_cast<uintptr_t>(size), &end))
    throw Error("from_dlpack: data + byte_offset (" + std::to_string(base) + " + " +
                std::to_string(tensor.byte_offset) + ") and the strides wrap around the address space");
  view.data = reinterpret_cast<void*>(first);
  return view;
}

TensorView from_dlpack(const DLManagedTensorVersioned& tensor, bool writable) {
  if (tensor.version.major != 1)
    throw Error("from_dlpack: DLPack major version " + std::to_string(tensor.version.major) +
                " is not supported (expected 1)");
  if (writable && (tensor.flags & DLPACK_FLAG_BITMASK_READ_ONLY))
    throw Error("from_dlpack: the tensor is read-only but the op writes to it");
  return from_dlpack(tensor.dl_tensor);
}

DLManagedTensorVersioned* to_dlpack_versioned(const TensorView& view) {
  auto* holder = new ManagedHolder{};
  for (int i = 0; i < view.rank; ++i) {
    holder->shape[i] = view.shape[i];
    holder->strides[i] = view.strides[i];
  }
  DLManagedTensorVersioned& m = holder->managed;
  m.version = {1, 0};
  m.manager_ctx = holder;
  m.deleter = delete_holder;
  m.flags = 0;
  m.dl_tensor.data = view.data;
  m.dl_tensor.device = view.device.kind == DeviceKind::cpu
                           ? DLDevice{kDLCPU, 0}
                           : DLDevice{kDLCUDA, view.device.index};
  m.dl_tensor.ndim = view.rank;
  m.dl_tensor.dtype = to_dlpack_dtype(view.dtype);
  m.dl_tensor.shape = holder->shape;
  m.dl_tensor.strides = holder->strides;
  m.dl_tensor.byte_offset = 0;
  return &m;
}

}  // namespace ditops
