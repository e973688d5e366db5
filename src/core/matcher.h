// Argument matching in the spirit of SGLang's TensorMatcher: symbolic sizes, strides, dtypes and
// devices are bound at first use and checked after; every failure throws ditops::Error naming
// the op, the tensor, the dimension, the expected and the actual value, e.g.
//   qknorm_rope: k.shape[2] must equal D=128 (bound by q.shape[2]) but is 96
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "ditops/tensor.h"

namespace ditops {

// One dimension (or stride) of a pattern: a literal, a symbol name, a sum of bound symbols
// ("Da+Dm": the symbols must be bound by then), or anything.
struct Dim {
  enum class Kind : uint8_t { literal, symbol, sum, any } kind;
  int64_t value = 0;
  std::string symbol;                 // the symbol, or the sum's text
  std::vector<std::string> terms;     // sum: its symbols
  Dim(int value) : kind(Kind::literal), value(value) {}            // NOLINT: patterns read best
  Dim(int64_t value) : kind(Kind::literal), value(value) {}        // NOLINT  as literals
  Dim(const char* name) : kind(Kind::symbol), symbol(name) {}      // NOLINT  and names
  static Dim anything() { return Dim(Kind::any); }
  static Dim sum(std::vector<std::string> terms);
  // "B" a symbol, "64" a literal, "Da+Dm" a sum, "*" anything.
  static Dim parse(const std::string& text);

 private:
  explicit Dim(Kind k) : kind(k) {}
};

class Matcher;

// Whether a pointer is a multiple of `bytes` (an op's vector paths ask it of every operand).
inline bool is_aligned(const void* p, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(bytes) == 0;
}

class TensorMatch {
 public:
  TensorMatch& rank(int expected);
  TensorMatch& shape(std::initializer_list<Dim> dims);     // also checks the rank
  TensorMatch& shape(const std::vector<Dim>& dims);
  TensorMatch& strides(std::initializer_list<Dim> dims);   // Dim::anything() for a free stride
  TensorMatch& strides(const std::vector<Dim>& dims);
  TensorMatch& dtype(std::initializer_list<DType> allowed);
  TensorMatch& dtype(const std::vector<DType>& allowed);
  // The dtype must equal the one bound to `symbol` (binding it, restricted to `allowed`, on
  // first use).
  TensorMatch& dtype_as(const std::string& symbol, std::initializer_list<DType> allowed = {});
  TensorMatch& dtype_as(const std::string& symbol, const std::vector<DType>& allowed);
  // One of `allowed` or the dtype bound to `symbol` ("f32 or bf16 (as q)").
  TensorMatch& dtype_in_or_as(const std::vector<DType>& allowed, const std::string& symbol);
  // Exactly one element, any rank (a scale read on the device).
  TensorMatch& one_element();
  TensorMatch& device_kind(DeviceKind kind);
  // All tensors naming `symbol` must be on one device.
  TensorMatch& same_device(const std::string& symbol);
  TensorMatch& aligned(int bytes);  // the data pointer
  TensorMatch& contiguous();

 private:
  friend class Matcher;
  TensorMatch(Matcher& m, const TensorView& t, std::string name) : m_(m), t_(t), name_(std::move(name)) {}
  void check_dim(const Dim& d, int64_t actual, int i, bool stride);
  template <typename Dims>
  TensorMatch& shape_of(const Dims& dims);
  template <typename Dims>
  TensorMatch& strides_of(const Dims& dims);
  template <typename DTypes>
  TensorMatch& dtype_of(const DTypes& allowed);
  template <typename DTypes>
  TensorMatch& dtype_as_of(const std::string& symbol, const DTypes& allowed);
  Matcher& m_;
  const TensorView& t_;
  std::string name_;
};

// Bounds on every matched view: far beyond any device's memory, and small enough that the checks
// after matching add a few extents, strides or spans, or multiply an extent by a stride of the
// same view, without leaving int64.
constexpr int64_t kMaxViewElements = int64_t{1} << 48;
constexpr int64_t kMaxViewBytes = int64_t{1} << 56;

class Matcher {
 public:
  // `op` names the op in every message; the text outlives the matcher (an op's description holds
  // it), so a call copies no string.
  explicit Matcher(std::string_view op) : op_(op) {
    sizes_.reserve(12);
    dtypes_.reserve(4);
    devices_.reserve(1);
  }
  // Starts matching `t`; first checks what every view must satisfy: rank in [0, kMaxRank],
  // extents >= 0, at most kMaxViewElements elements and kMaxViewBytes of span and of any stride
  // (an empty view too, its zero extents counted as 1), and data != NULL (aligned to the element
  // size) when it has elements.
  TensorMatch tensor(const std::string& name, const TensorView& t);
  // Bind a symbol up front (e.g. D from an option) so tensors are checked against it.
  void bind(const std::string& symbol, int64_t value, const std::string& origin);
  std::optional<int64_t> value(std::string_view symbol) const;
  [[noreturn]] void fail(const std::string& message) const;
  std::string_view op() const { return op_; }
  // `read` must not share a byte with `written` (the op writes one while it reads the other):
  // fails with "<read> overlaps <written> in memory (...)". Views without elements never overlap.
  void require_disjoint(const TensorView& written, const std::string& written_name, const TensorView& read,
                        const std::string& read_name) const;
  // Every stride of `t` is >= 0 (what an op's row and overlap arithmetic assumes):
  // "<name>.stride(i) must be >= 0 but is -3".
  void require_nonnegative_strides(const TensorView& t, const std::string& name) const;
  // The rows of a written [A, B, width] view (unit last stride) do not overlap one another: in the
  // message the width reads `width_symbol`=width ("D=96"), or the number alone without a symbol.
  void require_disjoint_rows(const TensorView& t, const std::string& name, int64_t width,
                             const char* width_symbol = nullptr) const;

 private:
  friend class TensorMatch;
  // Where a symbol was bound: `tensor`.shape[dim] / .stride(dim), or `tensor` alone as the text
  // (dim < 0). The text is built only for a message (matching runs on every call).
  struct Origin {
    std::string tensor;
    int dim = -1;
    bool stride = false;
    std::string text() const;
  };
  struct Bound {
    std::string symbol;
    int64_t value;
    Origin origin;
  };
  struct BoundDType {
    std::string symbol;
    DType dtype;
    std::string origin;
  };
  struct BoundDevice {
    std::string symbol;
    Device device;
    std::string origin;
  };
  // A call binds a handful of each: a linear search of a small vector beats a map's nodes.
  template <typename T>
  static T* find(std::vector<T>& v, std::string_view symbol) {
    for (T& e : v)
      if (e.symbol == symbol) return &e;
    return nullptr;
  }
  template <typename T>
  static const T* find(const std::vector<T>& v, std::string_view symbol) {
    for (const T& e : v)
      if (e.symbol == symbol) return &e;
    return nullptr;
  }
  std::string_view op_;
  std::vector<Bound> sizes_;
  std::vector<BoundDType> dtypes_;
  std::vector<BoundDevice> devices_;
};

// The first dim of t whose stride is not that of a dense tensor with its dims laid out in `order`
// (outermost first; nullptr: row-major), -1 if none, with the stride it should have. Extent-1 dims
// and views without elements address nothing and take any stride, as in PyTorch (its empty
// [2, 0, 64] has strides (64, 64, 1)).
int dense_layout_mismatch(const TensorView& t, const int* order, int64_t* expected);

// The bytes [lo, hi) a view addresses (lo == hi when it has no elements); negative strides count.
// Wraps instead of overflowing: call it on views a Matcher accepted.
struct ByteRange {
  uintptr_t lo = 0, hi = 0;
  bool empty() const { return lo == hi; }
};
ByteRange byte_range(const TensorView& t);
// Whether the byte ranges of two views meet (the test every op's aliasing checks share).
bool memory_overlaps(const TensorView& a, const TensorView& b);
// Whether two views are one (what in place means): the same data, dtype and shape, and the same
// stride wherever the extent is above 1.
bool same_view(const TensorView& a, const TensorView& b);

}  // namespace ditops
