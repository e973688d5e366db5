// Tensor views, dtypes, devices and errors: the vocabulary every ditops API speaks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <vector>

namespace ditops {

// Every failure ditops reports to a caller: bad arguments (the message names the op, the tensor,
// the dimension, the expected and the actual value), no eligible implementation, CUDA/NVRTC errors.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// An argument an implementation finds invalid only while it runs, from the data (e.g. a position
// outside the cos/sin cache, read from host memory by the CPU reference). It is thrown before
// anything is written, and the dispatcher passes it to the caller instead of counting it as a
// failure of the implementation and falling back.
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

enum class DType : uint8_t {
  f32,
  f16,
  bf16,
  f8e4m3fn,
  f8e5m2,
  fp4e2m1x2,  // packed E2M1, two values per byte; the view counts bytes
  u8,         // raw scale bytes (e.g. UE4M3 block scales)
  i32,
  i64,
};

const char* dtype_name(DType dtype);
// Size of one element of the view in bytes (fp4e2m1x2 counts a byte holding two values).
size_t dtype_size(DType dtype);
bool parse_dtype(const std::string& name, DType* out);

enum class DeviceKind : uint8_t { cpu, cuda };

struct Device {
  DeviceKind kind = DeviceKind::cpu;
  int index = 0;
  bool operator==(const Device& other) const { return kind == other.kind && index == other.index; }
  bool operator!=(const Device& other) const { return !(*this == other); }
};

std::string device_name(Device device);  // "cpu", "cuda:0"

constexpr int kMaxRank = 8;

// A non-owning strided view. Shapes and strides count elements and are 64-bit throughout.
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::f32;
  Device device{};
  int rank = 0;
  int64_t shape[kMaxRank] = {};
  int64_t strides[kMaxRank] = {};

  // Contiguous (row-major) view over `data`.
  static TensorView contiguous(void* data, DType dtype, Device device,
                               std::initializer_list<int64_t> shape);
  // The same with the shape known at run time (rank = shape.size() <= kMaxRank).
  static TensorView contiguous(void* data, DType dtype, Device device, const std::vector<int64_t>& shape);
  // The same for `rank` extents at `shape`.
  static TensorView contiguous(void* data, DType dtype, Device device, const int64_t* shape, int rank);

  int64_t size(int dim) const { return shape[dim < 0 ? dim + rank : dim]; }
  int64_t stride(int dim) const { return strides[dim < 0 ? dim + rank : dim]; }
  int64_t numel() const;
  bool is_contiguous() const;
  // Extent in bytes from the first to one past the last addressed element (0 if empty).
  int64_t span_bytes() const;
  template <typename T>
  T* ptr() const {
    return static_cast<T*>(data);
  }
  std::string describe() const;  // "bf16[4608, 24, 128] strides (3072, 128, 1) on cuda:0"
};

// A stream handle as the caller's framework gives it (CUstream / cudaStream_t); nullptr is the
// legacy default stream. Ignored by CPU implementations.
using Stream = void*;

}  // namespace ditops
