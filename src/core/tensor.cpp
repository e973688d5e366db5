#include <sstream>

#include "ditops/tensor.h"

namespace ditops {

namespace {
struct DTypeInfo {
  DType dtype;
  const char* name;
  size_t size;
};
constexpr DTypeInfo kDTypes[] = {
    {DType::f32, "f32", 4},           {DType::f16, "f16", 2},
    {DType::bf16, "bf16", 2},         {DType::f8e4m3fn, "f8e4m3fn", 1},
    {DType::f8e5m2, "f8e5m2", 1},     {DType::fp4e2m1x2, "fp4e2m1x2", 1},
    {DType::u8, "u8", 1},             {DType::i32, "i32", 4},
    {DType::i64, "i64", 8},
};
}  // namespace

const char* dtype_name(DType dtype) {
  for (const auto& info : kDTypes)
    if (info.dtype == dtype) return info.name;
  return "?";
}

size_t dtype_size(DType dtype) {
  for (const auto& info : kDTypes)
    if (info.dtype == dtype) return info.size;
  return 0;
}

bool parse_dtype(const std::string& name, DType* out) {
  static const std::pair<const char*, DType> aliases[] = {
      {"float32", DType::f32}, {"fp32", DType::f32},  {"float16", DType::f16},
      {"fp16", DType::f16},    {"half", DType::f16},  {"bfloat16", DType::bf16},
      {"int32", DType::i32},   {"int64", DType::i64}, {"uint8", DType::u8},
  };
  for (const auto& info : kDTypes)
    if (name == info.name) return *out = info.dtype, true;
  for (const auto& [alias, dtype] : aliases)
    if (name == alias) return *out = dtype, true;
  return false;
}

std::string device_name(Device device) {
  if (device.kind == DeviceKind::cpu) return "cpu";
  return "cuda:" + std::to_string(device.index);
}

TensorView TensorView::contiguous(void* data, DType dtype, Device device,
                                  std::initializer_list<int64_t> shape) {
  return contiguous(data, dtype, device, shape.begin(), static_cast<int>(shape.size()));
}

TensorView TensorView::contiguous(void* data, DType dtype, Device device, const std::vector<int64_t>& shape) {
  return contiguous(data, dtype, device, shape.data(), static_cast<int>(shape.size()));
}

namespace {
// Products of extents and strides wrap (two's complement) instead of overflowing: a view whose
// element count or span passes 2^63 gets meaningless strides, and every op refuses it in
// Matcher::tensor before reading them (libFuzzer, C ABI target: contiguous() of a [2^60, 64]
// shape was signed overflow).
int64_t wrapping_mul(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b));
}
int64_t wrapping_add(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
}
}  // namespace

TensorView TensorView::contiguous(void* data, DType dtype, Device device, const int64_t* shape, int rank) {
  if (rank < 0 || rank > kMaxRank)
    throw Error("TensorView: rank " + std::to_string(rank) + " exceeds " + std::to_string(kMaxRank));
  TensorView view;
  view.data = data;
  view.dtype = dtype;
  view.device = device;
  view.rank = rank;
  for (int d = 0; d < rank; ++d) view.shape[d] = shape[d];
  int64_t stride = 1;
  for (int i = view.rank - 1; i >= 0; --i) {
    view.strides[i] = stride;
    stride = wrapping_mul(stride, view.shape[i]);
  }
  return view;
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int i = 0; i < rank; ++i) n = wrapping_mul(n, shape[i]);
  return n;
}

bool TensorView::is_contiguous() const {
  for (int i = 0; i < rank; ++i)
    if (shape[i] == 0) return true;  // no element: any strides (PyTorch's empty tensors)
  int64_t expected = 1;
  for (int i = rank - 1; i >= 0; --i) {
    if (shape[i] != 1 && strides[i] != expected) return false;
    expected = wrapping_mul(expected, shape[i]);
  }
  return true;
}

int64_t TensorView::span_bytes() const {
  if (numel() == 0) return 0;
  int64_t last = 0;
  for (int i = 0; i < rank; ++i) last = wrapping_add(last, wrapping_mul(wrapping_add(shape[i], -1), strides[i]));
  return wrapping_mul(wrapping_add(last, 1), static_cast<int64_t>(dtype_size(dtype)));
}

std::string TensorView::describe() const {
  std::ostringstream out;
  out << dtype_name(dtype) << "[";
  for (int i = 0; i < rank; ++i) out << (i ? ", " : "") << shape[i];
  out << "] strides (";
  for (int i = 0; i < rank; ++i) out << (i ? ", " : "") << strides[i];
  out << ") on " << device_name(device);
  return out.str();
}

}  // namespace ditops
