#include "core/matcher.h"

#include <climits>
#include <cstdio>

namespace ditops {

namespace {
template <typename DTypes>
std::string dtype_list(const DTypes& allowed) {
  std::string out;
  size_t i = 0;
  for (DType d : allowed) {
    out += (i == 0 ? "" : i + 1 == allowed.size() ? " or " : ", ");
    out += dtype_name(d);
    ++i;
  }
  return out;
}
}  // namespace

Dim Dim::sum(std::vector<std::string> terms) {
  Dim d(Kind::sum);
  for (const auto& t : terms) d.symbol += (d.symbol.empty() ? "" : "+") + t;
  d.terms = std::move(terms);
  return d;
}

Dim Dim::parse(const std::string& text) {
  if (text == "*") return anything();
  if (!text.empty() && text.find_first_not_of("0123456789") == std::string::npos) return Dim(int64_t{std::stoll(text)});
  if (text.find('+') == std::string::npos) return Dim(text.c_str());
  std::vector<std::string> terms;
  size_t start = 0;
  for (size_t plus; (plus = text.find('+', start)) != std::string::npos; start = plus + 1)
    terms.push_back(text.substr(start, plus - start));
  terms.push_back(text.substr(start));
  return sum(std::move(terms));
}

void Matcher::fail(const std::string& message) const { throw InvalidArgument(std::string(op_) + ": " + message); }

TensorMatch Matcher::tensor(const std::string& name, const TensorView& t) {
  if (t.rank < 0 || t.rank > kMaxRank)
    fail(name + " must have rank in [0, " + std::to_string(kMaxRank) + "] but has rank " + std::to_string(t.rank));
  const int64_t size = static_cast<int64_t>(dtype_size(t.dtype));
  if (size == 0) fail(name + ".dtype is not a ditops dtype (code " + std::to_string(static_cast<int>(t.dtype)) + ")");
  bool empty = false;
  for (int i = 0; i < t.rank; ++i) {
    if (t.shape[i] < 0)
      fail(name + ".shape[" + std::to_string(i) + "] must be >= 0 but is " + std::to_string(t.shape[i]) + " (" +
           t.describe() + ")");
    empty = empty || t.shape[i] == 0;
  }
  // Every view, empty or not, must describe memory that could exist: at most 2^48 elements and
  // 2^56 bytes, counting a zero extent as 1. Then any sum of a few extents, strides or spans, and
  // any extent times a stride of the same view, stays far inside int64 in every later check.
  int64_t numel = 1, span = 1;
  for (int i = 0; i < t.rank; ++i) {
    const int64_t stride = t.strides[i] == INT64_MIN ? INT64_MAX : (t.strides[i] < 0 ? -t.strides[i] : t.strides[i]);
    int64_t bytes = 0;
    if (__builtin_mul_overflow(stride, size, &bytes) || bytes > kMaxViewBytes)
      fail(name + ".stride(" + std::to_string(i) + ") = " + std::to_string(t.strides[i]) +
           " is beyond 2^56 bytes (" + t.describe() + ")");
    const int64_t extent = t.shape[i] == 0 ? 1 : t.shape[i];
    int64_t reach = 0;
    if (__builtin_mul_overflow(extent, numel, &numel) || numel > kMaxViewElements)
      fail(name + " has more than 2^48 elements" + (empty ? " (counting zero extents as 1)" : "") + " (" +
           t.describe() + ")");
    if (__builtin_mul_overflow(extent - 1, stride, &reach) || __builtin_add_overflow(span, reach, &span) ||
        span > kMaxViewBytes / size)
      fail(name + " spans more than 2^56 bytes (" + t.describe() + ")");
  }
  if (empty) return TensorMatch(*this, t, name);
  if (!t.data) fail(name + ".data is NULL but " + name + " has " + std::to_string(numel) + " elements");
  if (reinterpret_cast<uintptr_t>(t.data) % static_cast<uintptr_t>(size) != 0) {
    char at[32];
    std::snprintf(at, sizeof at, "%#llx", static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(t.data)));
    fail(name + ".data must be aligned to its element size (" + std::to_string(size) + " bytes for " +
         dtype_name(t.dtype) + ") but is at " + at);
  }
  return TensorMatch(*this, t, name);
}

void Matcher::require_disjoint(const TensorView& written, const std::string& written_name, const TensorView& read,
                               const std::string& read_name) const {
  if (memory_overlaps(written, read))
    fail(read_name + " overlaps " + written_name + " in memory (" + written_name + " is written while " + read_name +
         " is read): pass separate buffers");
}

void Matcher::require_nonnegative_strides(const TensorView& t, const std::string& name) const {
  for (int i = 0; i < t.rank; ++i)
    if (t.strides[i] < 0)
      fail(name + ".stride(" + std::to_string(i) + ") must be >= 0 but is " + std::to_string(t.strides[i]));
}

void Matcher::require_disjoint_rows(const TensorView& t, const std::string& name, int64_t width,
                                    const char* width_symbol) const {
  if (t.numel() == 0) return;  // nothing is written; an empty view's strides are arbitrary
  if (t.shape[1] > 1 && t.strides[1] < width)
    fail(name + ".stride(1) must be >= " + (width_symbol ? std::string(width_symbol) + "=" : std::string()) +
         std::to_string(width) + " (rows may not overlap) but is " + std::to_string(t.strides[1]));
  const int64_t span = (t.shape[1] > 1 ? (t.shape[1] - 1) * t.strides[1] : 0) + width;
  if (t.shape[0] > 1 && t.strides[0] < span)
    fail(name + ".stride(0) must be >= " + std::to_string(span) + " (batches may not overlap) but is " +
         std::to_string(t.strides[0]));
}

ByteRange byte_range(const TensorView& t) {
  if (t.rank < 0 || t.rank > kMaxRank) return {};
  for (int i = 0; i < t.rank; ++i)
    if (t.shape[i] <= 0) return {};
  // Unsigned arithmetic: wraps on hostile views instead of overflowing.
  uint64_t low = 0, high = 0;
  for (int i = 0; i < t.rank; ++i) {
    const uint64_t reach = static_cast<uint64_t>(t.shape[i] - 1) * static_cast<uint64_t>(t.strides[i]);
    if (t.strides[i] < 0) low += reach;  // a negative reach, as two's complement
    else high += reach;
  }
  const uint64_t size = dtype_size(t.dtype);
  const auto base = reinterpret_cast<uintptr_t>(t.data);
  return {base + static_cast<uintptr_t>(low * size), base + static_cast<uintptr_t>((high + 1) * size)};
}

bool memory_overlaps(const TensorView& a, const TensorView& b) {
  const ByteRange x = byte_range(a), y = byte_range(b);
  if (x.empty() || y.empty()) return false;
  return x.lo < y.hi && y.lo < x.hi;
}

bool same_view(const TensorView& a, const TensorView& b) {
  if (a.data != b.data || a.dtype != b.dtype || a.rank != b.rank) return false;
  for (int i = 0; i < a.rank; ++i)
    if (a.shape[i] != b.shape[i] || (a.shape[i] > 1 && a.strides[i] != b.strides[i])) return false;
  return true;
}

std::string Matcher::Origin::text() const {
  if (dim < 0) return tensor;
  return tensor + (stride ? ".stride(" : ".shape[") + std::to_string(dim) + (stride ? ")" : "]");
}

void Matcher::bind(const std::string& symbol, int64_t value, const std::string& origin) {
  if (Bound* b = find(sizes_, symbol)) *b = {symbol, value, {origin}};
  else sizes_.push_back({symbol, value, {origin}});
}

std::optional<int64_t> Matcher::value(std::string_view symbol) const {
  const Bound* b = find(sizes_, symbol);
  if (!b) return std::nullopt;
  return b->value;
}

// `stride`: dim i is a stride ("x.stride(1)"), else an extent ("x.shape[1]"); the text is only
// built when a symbol is bound or a check fails (matching runs on every call).
void TensorMatch::check_dim(const Dim& d, int64_t actual, int i, bool stride) {
  auto where = [&] {
    return name_ + (stride ? ".stride(" : ".shape[") + std::to_string(i) + (stride ? ")" : "]");
  };
  switch (d.kind) {
    case Dim::Kind::any:
      return;
    case Dim::Kind::literal:
      if (actual != d.value)
        m_.fail(where() + " must be " + std::to_string(d.value) + " but is " + std::to_string(actual));
      return;
    case Dim::Kind::sum: {
      int64_t total = 0;
      for (const auto& term : d.terms) {
        const Matcher::Bound* b = Matcher::find(m_.sizes_, term);
        if (!b) m_.fail(where() + " is " + d.symbol + " but " + term + " is not bound yet");
        total += b->value;  // bounded extents (kMaxViewElements): no overflow
      }
      if (actual != total) {
        std::string origins;
        for (const auto& term : d.terms)
          origins += (origins.empty() ? "" : " + ") + Matcher::find(m_.sizes_, term)->origin.text();
        m_.fail(where() + " must equal " + d.symbol + "=" + std::to_string(total) + " (" + origins + ") but is " +
                std::to_string(actual));
      }
      return;
    }
    case Dim::Kind::symbol: {
      const Matcher::Bound* b = Matcher::find(m_.sizes_, d.symbol);
      if (!b) {
        m_.sizes_.push_back({d.symbol, actual, {name_, i, stride}});
      } else if (b->value != actual) {
        m_.fail(where() + " must equal " + d.symbol + "=" + std::to_string(b->value) + " (bound by " +
                b->origin.text() + ") but is " + std::to_string(actual));
      }
      return;
    }
  }
}

TensorMatch& TensorMatch::rank(int expected) {
  if (t_.rank != expected)
    m_.fail(name_ + " must have rank " + std::to_string(expected) + " but has rank " +
            std::to_string(t_.rank) + " (" + t_.describe() + ")");
  return *this;
}

TensorMatch& TensorMatch::shape(std::initializer_list<Dim> dims) { return shape_of(dims); }
TensorMatch& TensorMatch::shape(const std::vector<Dim>& dims) { return shape_of(dims); }

template <typename Dims>
TensorMatch& TensorMatch::shape_of(const Dims& dims) {
  rank(static_cast<int>(dims.size()));
  int i = 0;
  for (const Dim& d : dims) {
    check_dim(d, t_.shape[i], i, false);
    ++i;
  }
  return *this;
}

TensorMatch& TensorMatch::strides(std::initializer_list<Dim> dims) { return strides_of(dims); }
TensorMatch& TensorMatch::strides(const std::vector<Dim>& dims) { return strides_of(dims); }

template <typename Dims>
TensorMatch& TensorMatch::strides_of(const Dims& dims) {
  rank(static_cast<int>(dims.size()));
  int i = 0;
  for (const Dim& d : dims) {
    // A stride of an extent-1 dimension is never used to address memory: accept any value,
    // as PyTorch does for contiguity.
    if (t_.shape[i] != 1) check_dim(d, t_.strides[i], i, true);
    ++i;
  }
  return *this;
}

TensorMatch& TensorMatch::dtype(std::initializer_list<DType> allowed) { return dtype_of(allowed); }
TensorMatch& TensorMatch::dtype(const std::vector<DType>& allowed) { return dtype_of(allowed); }

template <typename DTypes>
TensorMatch& TensorMatch::dtype_of(const DTypes& allowed) {
  for (DType d : allowed)
    if (d == t_.dtype) return *this;
  m_.fail(name_ + ".dtype must be " + dtype_list(allowed) + " but is " + dtype_name(t_.dtype));
}

TensorMatch& TensorMatch::dtype_as(const std::string& symbol, std::initializer_list<DType> allowed) {
  return dtype_as_of(symbol, allowed);
}
TensorMatch& TensorMatch::dtype_as(const std::string& symbol, const std::vector<DType>& allowed) {
  return dtype_as_of(symbol, allowed);
}

TensorMatch& TensorMatch::dtype_in_or_as(const std::vector<DType>& allowed, const std::string& symbol) {
  for (DType d : allowed)
    if (d == t_.dtype) return *this;
  const Matcher::BoundDType* b = Matcher::find(m_.dtypes_, symbol);
  if (!b || b->dtype == t_.dtype) return *this;
  m_.fail(name_ + ".dtype must be " + dtype_list(allowed) + " or " + dtype_name(b->dtype) + " (as " + b->origin +
          ") but is " + dtype_name(t_.dtype));
}

TensorMatch& TensorMatch::one_element() {
  if (t_.numel() != 1)
    m_.fail(name_ + " must have exactly 1 element but has " + std::to_string(t_.numel()) + " (" + t_.describe() + ")");
  return *this;
}

template <typename DTypes>
TensorMatch& TensorMatch::dtype_as_of(const std::string& symbol, const DTypes& allowed) {
  const Matcher::BoundDType* b = Matcher::find(m_.dtypes_, symbol);
  if (!b) {
    if (allowed.size()) dtype_of(allowed);
    m_.dtypes_.push_back({symbol, t_.dtype, name_});
  } else if (b->dtype != t_.dtype) {
    m_.fail(name_ + ".dtype must be " + dtype_name(b->dtype) + " (as " + b->origin + ") but is " +
            dtype_name(t_.dtype));
  }
  return *this;
}

TensorMatch& TensorMatch::device_kind(DeviceKind kind) {
  if (t_.device.kind != kind)
    m_.fail(name_ + " must be on " + (kind == DeviceKind::cpu ? "the cpu" : "a cuda device") +
            " but is on " + device_name(t_.device));
  return *this;
}

TensorMatch& TensorMatch::same_device(const std::string& symbol) {
  const Matcher::BoundDevice* b = Matcher::find(m_.devices_, symbol);
  if (!b) {
    m_.devices_.push_back({symbol, t_.device, name_});
  } else if (b->device != t_.device) {
    m_.fail(name_ + ".device must be " + device_name(b->device) + " (as " + b->origin + ") but is " +
            device_name(t_.device));
  }
  return *this;
}

TensorMatch& TensorMatch::aligned(int bytes) {
  if (bytes <= 0) m_.fail("alignment must be positive but is " + std::to_string(bytes));
  const auto address = reinterpret_cast<uintptr_t>(t_.data);
  if (address % bytes != 0) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%#llx", static_cast<unsigned long long>(address));
    m_.fail(name_ + ".data must be " + std::to_string(bytes) + "-byte aligned but is at " + buf);
  }
  return *this;
}

int dense_layout_mismatch(const TensorView& t, const int* order, int64_t* expected) {
  for (int d = 0; d < t.rank; ++d)
    if (t.shape[d] == 0) return -1;
  int64_t want = 1;
  for (int i = t.rank - 1; i >= 0; --i) {
    const int d = order ? order[i] : i;
    if (t.shape[d] != 1 && t.strides[d] != want) {
      *expected = want;
      return d;
    }
    want *= t.shape[d];
  }
  return -1;
}

TensorMatch& TensorMatch::contiguous() {
  if (!t_.is_contiguous()) m_.fail(name_ + " must be contiguous but is " + t_.describe());
  return *this;
}

}  // namespace ditops
