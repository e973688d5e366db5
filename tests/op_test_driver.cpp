// The op test driver (op_test_driver.h): buffers with guards, the reference run and its
// invariants, every other implementation against it.
#include "op_test_driver.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <thread>

#include "jit/cuda_driver.h"
#include "reference/fp8_fp4.h"
#include "reference/half.h"

namespace ditops::optest {

namespace {

constexpr size_t kGuard = 256;  // sentinel bytes before and after every buffer
constexpr uint8_t kSentinel = 0xA5, kOtherSentinel = 0x5A;

std::string join(const std::vector<int64_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s;
}

int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t e : shape) n *= e;
  return n;
}

std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (int d = static_cast<int>(shape.size()) - 2; d >= 0; --d) s[d] = s[d + 1] * std::max<int64_t>(shape[d + 1], 1);
  return s;
}

// Calls fn(element offset) for every element of a strided view, in index order.
void for_each_element(const std::vector<int64_t>& shape, const std::vector<int64_t>& strides,
                      const std::function<void(int64_t)>& fn) {
  if (numel(shape) == 0) return;
  std::vector<int64_t> index(shape.size(), 0);
  for (;;) {
    int64_t at = 0;
    for (size_t d = 0; d < shape.size(); ++d) at += index[d] * strides[d];
    fn(at);
    int d = static_cast<int>(shape.size()) - 1;
    for (; d >= 0; --d) {
      if (++index[d] < shape[d]) break;
      index[d] = 0;
    }
    if (d < 0) return;
  }
}

// ---------------------------------------------------------------- memory

class HostMemory : public Memory {
 public:
  Device device() const override { return {DeviceKind::cpu, 0}; }
  void* allocate(size_t bytes) override { return std::aligned_alloc(256, (bytes + 255) / 256 * 256 + 256); }
  void release(void* data) override { std::free(data); }
  void upload(void* dst, const std::vector<uint8_t>& src) override { std::memcpy(dst, src.data(), src.size()); }
  std::vector<uint8_t> download(const void* src, size_t bytes) override {
    const auto* p = static_cast<const uint8_t*>(src);
    return std::vector<uint8_t>(p, p + bytes);
  }
  void synchronize() override {}
};

class CudaMemory : public Memory {
 public:
  CudaMemory() : driver_(jit::require_cuda_driver()) { jit::bind_primary_context(0); }
  Device device() const override { return {DeviceKind::cuda, 0}; }
  void* allocate(size_t bytes) override {
    CUdeviceptr p = 0;  // cuMemAlloc aligns to at least 256 bytes
    jit::check_cu(driver_.cuMemAlloc(&p, std::max<size_t>(bytes, 16)), "cuMemAlloc");
    return reinterpret_cast<void*>(p);
  }
  void release(void* data) override { driver_.cuMemFree(reinterpret_cast<CUdeviceptr>(data)); }
  void upload(void* dst, const std::vector<uint8_t>& src) override {
    jit::check_cu(driver_.cuMemcpyHtoD(reinterpret_cast<CUdeviceptr>(dst), src.data(), src.size()), "h2d");
  }
  std::vector<uint8_t> download(const void* src, size_t bytes) override {
    std::vector<uint8_t> out(bytes);
    jit::check_cu(driver_.cuMemcpyDtoH(out.data(), reinterpret_cast<CUdeviceptr>(src), bytes), "d2h");
    return out;
  }
  void synchronize() override { jit::check_cu(driver_.cuCtxSynchronize(), "cuCtxSynchronize"); }

 private:
  const jit::CudaDriver& driver_;
};

// ---------------------------------------------------------------- values

void store(uint8_t* base, int64_t i, DType dt, double v) {
  switch (dt) {
    case DType::f32:
    case DType::f16:
    case DType::bf16: ref::store_act(base, i, dt, static_cast<float>(v)); return;
    case DType::f8e4m3fn: base[i] = ref::float_to_e4m3_satfinite(static_cast<float>(v)); return;
    case DType::i32: reinterpret_cast<int32_t*>(base)[i] = static_cast<int32_t>(v); return;
    case DType::i64: reinterpret_cast<int64_t*>(base)[i] = static_cast<int64_t>(v); return;
    default: base[i] = static_cast<uint8_t>(static_cast<int64_t>(v)); return;  // u8 and packed bytes
  }
}

// The value of element `i` of a float-like dtype (fp8 decoded); NaN-free inputs are assumed.
double load(const uint8_t* base, int64_t i, DType dt) {
  switch (dt) {
    case DType::f32:
    case DType::f16:
    case DType::bf16: return ref::load_act(base, i, dt);
    case DType::f8e4m3fn: return ref::e4m3_to_float(base[i]);
    default: return 0.0;
  }
}

bool is_float(DType dt) {
  return dt == DType::f32 || dt == DType::f16 || dt == DType::bf16 || dt == DType::f8e4m3fn;
}

// The spacing of the dtype's values in [1, 2).
double unit_ulp(DType dt) {
  switch (dt) {
    case DType::f32: return 0x1p-23;
    case DType::f16: return 0x1p-10;
    case DType::bf16: return 0x1p-7;
    default: return 0x1p-3;  // e4m3
  }
}

uint32_t name_hash(const std::string& s) {
  uint32_t h = 2166136261u;
  for (char ch : s) h = (h ^ static_cast<uint8_t>(ch)) * 16777619u;
  return h;
}

// Bell-shaped values of unit variance from one 64-bit splitmix draw: the sum of its four 16-bit
// uniforms (Irwin-Hall), ten times cheaper than std::normal_distribution over mt19937.
struct QuickNormal {
  uint64_t state;
  double operator()() {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const double sum = static_cast<double>(z & 0xFFFF) + static_cast<double>(z >> 16 & 0xFFFF) +
                       static_cast<double>(z >> 32 & 0xFFFF) + static_cast<double>(z >> 48);
    return (sum / 65536.0 - 2.0) * 1.7320508075688772;  // variance of the sum: 4 / 12
  }
};

// Elements [first, last) of a fill. `quick`: the bell-shaped generator above instead of
// std::normal_distribution (the chunks of a large tensor past its first).
void fill_range(uint8_t* body, int64_t first, int64_t last, DType dt, const Fill& f, uint32_t seed, bool quick) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> std_normal(0.0, 1.0);
  QuickNormal quick_normal{seed};
  auto normal = [&](std::mt19937& r) { return quick ? quick_normal() : std_normal(r); };
  for (int64_t i = first; i < last; ++i) {
    double v = 0;
    switch (f.kind) {
      case Fill::Kind::normal:
        v = f.scale * (normal(rng) + f.offset);
        if (i % 97 == 0) v = (i / 97) % 2 ? -0.0 : 0.0;  // signed zeros
        break;
      case Fill::Kind::positive: v = f.offset + f.scale * std::fabs(normal(rng)); break;
      case Fill::Kind::index: v = static_cast<double>((7 * i + 3) % std::max<int64_t>(f.modulo, 1)); break;
      case Fill::Kind::wave: v = std::sin(0.37 * static_cast<double>(i)); break;
      case Fill::Kind::constant: v = f.scale; break;
      case Fill::Kind::sentinel: return;
    }
    store(body, i, dt, v);
  }
}

// Chunks of 2^22 elements, each its own generator (seeded from the tensor's seed and the chunk's
// index; the first keeps the seed and std::normal_distribution, so smaller tensors are as they
// were), filled on every core: a model-sized weight of 10^8 values would otherwise take seconds of
// one core per case.
void fill_buffer(uint8_t* body, int64_t elements, DType dt, const Fill& f, uint32_t seed) {
  constexpr int64_t kChunk = int64_t{1} << 22;
  const int64_t chunks = (elements + kChunk - 1) / kChunk;
  auto chunk = [&](int64_t i) {
    fill_range(body, i * kChunk, std::min(elements, (i + 1) * kChunk), dt, f,
               i == 0 ? seed : seed ^ static_cast<uint32_t>(i * 0x9E3779B9u), i > 0);
  };
  if (chunks <= 1) {
    if (chunks == 1) chunk(0);
    return;
  }
  const int64_t threads = std::min<int64_t>(chunks, std::max(1u, std::thread::hardware_concurrency()));
  std::atomic<int64_t> next{0};
  std::vector<std::thread> pool;
  for (int64_t t = 0; t < threads; ++t)
    pool.emplace_back([&] {
      for (int64_t i = next++; i < chunks; i = next++) chunk(i);
    });
  for (auto& th : pool) th.join();
}

// ---------------------------------------------------------------- a prepared case

struct Buffer {
  int owner;  // the tensor whose fill it takes
  size_t body = 0;  // bytes between the guards
  std::vector<uint8_t> initial;  // guards included
  bool pure_output = false;      // only written tensors view it: its prior contents are a sentinel
};

struct Prepared {
  const OpDescription* op;
  std::vector<TensorCase> tensors;  // the case's, outputs completed, strides explicit
  std::vector<int> buffer_of;       // per tensor
  std::vector<Buffer> buffers;
  std::vector<OptionValue> options;
  std::vector<bool> written;        // per tensor

  const TensorSlot& slot(size_t t) const { return op->tensors[op->tensor_index(tensors[t].name)]; }
};

DType dtype_for_output(const OpDescription& op, const TensorSlot& slot, const std::vector<TensorCase>& given) {
  auto dtype_of = [&](const std::string& name) -> std::optional<DType> {
    for (const auto& t : given)
      if (t.name == name) return t.dtype;
    return std::nullopt;
  };
  DType dt;
  if (!slot.alloc_dtype.empty() && parse_dtype(slot.alloc_dtype, &dt)) return dt;
  for (const char* prefix : {"like:", "strided:"})
    if (slot.alloc.rfind(prefix, 0) == 0)
      if (auto d = dtype_of(slot.alloc.substr(std::strlen(prefix)))) return *d;
  const std::string first = slot.dtypes.substr(0, slot.dtypes.find('|'));
  if (first.rfind('=', 0) == 0)
    if (auto d = dtype_of(first.substr(1))) return *d;
  if (parse_dtype(first, &dt)) return dt;
  throw Error(op.name + ": the driver cannot tell " + slot.name + "'s dtype");
}

// A generic call over `data` pointers (one per tensor; the op table only reads shapes here).
GenericCall make_call(const Prepared& p, const std::vector<void*>& data, Device device) {
  GenericCall call = generic_call(*p.op);
  for (size_t t = 0; t < p.tensors.size(); ++t) {
    const TensorCase& tc = p.tensors[t];
    const int slot = p.op->tensor_index(tc.name);
    TensorView v = TensorView::contiguous(data[t], tc.dtype, device, tc.shape);
    for (size_t d = 0; d < tc.strides.size(); ++d) v.strides[d] = tc.strides[d];
    call.tensors[slot] = v;
    call.given[slot] = true;
  }
  if (!p.options.empty()) call.options = p.options;
  call.dispatch.quality = Quality::high;  // close implementations too; the case states bounds
  return call;
}

// fill = false: the layout only (no contents), for the JSON table.
Prepared prepare(const OpCase& c, bool fill = true) {
  Prepared p;
  p.op = &op(c.op);
  p.tensors = c.tensors;
  for (const auto& t : p.tensors)
    if (p.op->tensor_index(t.name) < 0) throw Error(c.op + "/" + c.name + ": the op has no tensor '" + t.name + "'");
  p.options.resize(p.op->options.size());
  for (const auto& [name, text] : c.options) {
    const int i = p.op->option_index(name);
    if (i < 0) throw Error(c.op + "/" + c.name + ": the op has no option '" + name + "'");
    p.options[i] = parse_option(*p.op, p.op->options[i], text);
  }
  // Outputs a binding would produce and the case leaves out, as a binding allocates them.
  {
    Prepared shapes = p;
    std::vector<void*> dummy(p.tensors.size(), reinterpret_cast<void*>(uintptr_t{4096}));
    const GenericCall call = make_call(shapes, dummy, {});
    for (const TensorSlot& slot : p.op->tensors) {
      if (!slot.written() || call.given[p.op->tensor_index(slot.name)]) continue;
      if (!output_present(*p.op, slot, call)) continue;
      TensorCase out;
      out.name = slot.name;
      out.dtype = dtype_for_output(*p.op, slot, p.tensors);
      out.shape = alloc_shape(*p.op, slot, call);
      if (slot.alloc.rfind("strided:", 0) == 0)
        for (const auto& t : p.tensors)
          if (t.name == slot.alloc.substr(8)) out.strides = t.strides;
      p.tensors.push_back(out);
    }
  }
  for (auto& t : p.tensors)
    if (t.strides.empty()) t.strides = contiguous_strides(t.shape);
  // Buffers: one per tensor that owns its storage; views join their owner's.
  p.buffer_of.assign(p.tensors.size(), -1);
  p.written.assign(p.tensors.size(), false);
  for (size_t t = 0; t < p.tensors.size(); ++t) {
    p.written[t] = p.slot(t).written();
    if (p.tensors[t].storage.empty()) {
      p.buffer_of[t] = static_cast<int>(p.buffers.size());
      p.buffers.push_back({static_cast<int>(t)});
    }
  }
  for (size_t t = 0; t < p.tensors.size(); ++t) {
    if (p.buffer_of[t] >= 0) continue;
    for (size_t o = 0; o < p.tensors.size(); ++o)
      if (p.tensors[o].name == p.tensors[t].storage) p.buffer_of[t] = p.buffer_of[o];
    if (p.buffer_of[t] < 0)
      throw Error(c.op + "/" + c.name + ": " + p.tensors[t].name + " views '" + p.tensors[t].storage +
                  "', which is not a tensor of the case with a buffer of its own");
  }
  for (size_t b = 0; b < p.buffers.size(); ++b) {
    Buffer& buf = p.buffers[b];
    buf.pure_output = true;
    for (size_t t = 0; t < p.tensors.size(); ++t) {
      if (p.buffer_of[t] != static_cast<int>(b)) continue;
      const TensorCase& tc = p.tensors[t];
      int64_t last = -1;
      if (numel(tc.shape) > 0) {
        last = tc.offset;
        for (size_t d = 0; d < tc.shape.size(); ++d) last += (tc.shape[d] - 1) * tc.strides[d];
      }
      buf.body = std::max(buf.body, static_cast<size_t>(last + 1) * dtype_size(tc.dtype));
      if (p.slot(t).role != TensorRole::out) buf.pure_output = false;
    }
    const TensorCase& owner = p.tensors[buf.owner];
    if (!fill) continue;
    buf.initial.assign(kGuard + buf.body + kGuard, kSentinel);
    const Fill f = owner.fill.value_or(buf.pure_output ? Fill::sentinel() : Fill::normal());
    fill_buffer(buf.initial.data() + kGuard, static_cast<int64_t>(buf.body / dtype_size(owner.dtype)), owner.dtype,
                f, c.seed * 7919u + name_hash(owner.name));
  }
  return p;
}

// ---------------------------------------------------------------- one run

struct Outcome {
  std::string error;  // "" when it ran
  std::string impl;   // what ran
  std::optional<CandidateReport> candidate;  // explain's verdict on the implementation asked for
  std::string chosen;                        // explain's choice
  std::vector<std::vector<uint8_t>> buffers;  // after the run (guards included)
};

// Uploads `contents` into fresh buffers of `memory`, optionally asks explain about `impl` and
// stops there when it is not the one chosen, runs with `backend` forced and downloads.
Outcome execute(const Prepared& p, Memory& memory, std::optional<Provenance> backend, const std::string& impl,
                const std::vector<std::vector<uint8_t>>& contents) {
  Outcome out;
  std::vector<void*> bases;
  struct Release {
    Memory& m;
    std::vector<void*>& v;
    ~Release() {
      for (void* b : v) m.release(b);
    }
  } release{memory, bases};
  for (const auto& bytes : contents) {
    bases.push_back(memory.allocate(bytes.size()));
    memory.upload(bases.back(), bytes);
  }
  std::vector<void*> data;
  for (size_t t = 0; t < p.tensors.size(); ++t)
    data.push_back(static_cast<uint8_t*>(bases[p.buffer_of[t]]) + kGuard +
                   p.tensors[t].offset * dtype_size(p.tensors[t].dtype));
  GenericCall call = make_call(p, data, memory.device());
  call.dispatch.backend = backend;
  try {
    if (!impl.empty()) {
      const DispatchReport report = explain(p.op->name, call);
      for (const auto& cand : report.candidates)
        if (cand.name == impl) out.candidate = cand;
      out.chosen = report.chosen ? report.chosen->name : "";
      if (!out.candidate || !out.candidate->eligible || out.chosen != impl) return out;
    }
    out.impl = ditops::call(p.op->name, call, nullptr);
    memory.synchronize();
  } catch (const std::exception& e) {
    out.error = e.what();
    if (out.error.empty()) out.error = "(an exception without a message)";
  }
  for (size_t b = 0; b < contents.size(); ++b) out.buffers.push_back(memory.download(bases[b], contents[b].size()));
  return out;
}

// ---------------------------------------------------------------- comparisons

// Byte ranges of the written tensors, per buffer: the mask of what a run may change.
std::vector<std::vector<bool>> written_mask(const Prepared& p) {
  std::vector<std::vector<bool>> mask;
  for (const auto& b : p.buffers) mask.emplace_back(b.initial.size(), false);
  for (size_t t = 0; t < p.tensors.size(); ++t) {
    if (!p.written[t]) continue;
    const TensorCase& tc = p.tensors[t];
    const size_t es = dtype_size(tc.dtype);
    auto& m = mask[p.buffer_of[t]];
    for_each_element(tc.shape, tc.strides, [&](int64_t at) {
      const size_t byte = kGuard + static_cast<size_t>(tc.offset + at) * es;
      std::fill(m.begin() + byte, m.begin() + byte + es, true);
    });
  }
  return mask;
}

std::string where_in(const Prepared& p, size_t b, size_t byte) {
  const std::string owner = p.tensors[p.buffers[b].owner].name;
  if (byte < kGuard) return "the guard before " + owner + "'s buffer (byte " + std::to_string(kGuard - byte) + " before)";
  if (byte >= kGuard + p.buffers[b].body)
    return "the guard after " + owner + "'s buffer (byte " + std::to_string(byte - kGuard - p.buffers[b].body) + " after)";
  return owner + "'s buffer at byte " + std::to_string(byte - kGuard) + " (an input, padding or unwritten gap)";
}

// "" when every byte outside the written tensors equals `before`'s.
// (mask nullptr: every byte).
std::string unwritten_unchanged(const Prepared& p, const std::vector<std::vector<bool>>* mask,
                                const std::vector<std::vector<uint8_t>>& before,
                                const std::vector<std::vector<uint8_t>>& after) {
  for (size_t b = 0; b < before.size(); ++b)
    for (size_t i = 0; i < before[b].size(); ++i)
      if (!(mask && (*mask)[b][i]) && before[b][i] != after[b][i]) return "wrote " + where_in(p, b, i);
  return "";
}

// "" when the written tensors of `got` (by implementation `impl`) are within the case's tolerance
// of `want`.
std::string written_within(const OpCase& c, const Prepared& p, const std::vector<std::vector<uint8_t>>& want,
                           const std::vector<std::vector<uint8_t>>& got, bool exact, const std::string& impl = "") {
  std::string problems;
  for (size_t t = 0; t < p.tensors.size(); ++t) {
    if (!p.written[t]) continue;
    const TensorCase& tc = p.tensors[t];
    const Tolerance tol = exact ? Tolerance{} : c.tolerance_of(tc.name, impl);
    const size_t es = dtype_size(tc.dtype);
    const uint8_t* w = want[p.buffer_of[t]].data() + kGuard + tc.offset * es;
    const uint8_t* g = got[p.buffer_of[t]].data() + kGuard + tc.offset * es;
    int64_t count = 0, differ = 0, first = -1;
    double worst = 0;
    for_each_element(tc.shape, tc.strides, [&](int64_t at) {
      ++count;
      if (std::memcmp(w + at * es, g + at * es, es) == 0) return;
      double distance = 0;
      if (is_float(tc.dtype)) {
        const double a = load(w, at, tc.dtype), b = load(g, at, tc.dtype);
        if (std::isnan(a) && std::isnan(b)) return;
        const double scale = std::max({std::fabs(a), std::fabs(b), tol.floor, 1e-30});
        const double ulp = std::exp2(std::floor(std::log2(scale))) * unit_ulp(tc.dtype);
        distance = std::isfinite(a - b) ? std::fabs(a - b) / ulp : INFINITY;
      } else if (tol.max_ulp > 0) {
        distance = 0;  // bytes (indices, packed codes): only how many differ is bounded
      } else {
        distance = INFINITY;
      }
      if (first < 0) first = count - 1;
      ++differ;
      worst = std::max(worst, distance);
    });
    if (differ == 0) continue;
    const bool too_far = tol.max_ulp == 0 || worst > tol.max_ulp;
    const bool too_many = static_cast<double>(differ) > tol.max_fraction * static_cast<double>(count) + tol.slack;
    if (too_far || too_many) {
      std::ostringstream s;
      s << tc.name << ": " << differ << " of " << count << " elements differ (first at index " << first
        << ", worst " << worst << " ulp; allowed " << tol.max_ulp << " ulp on " << tol.max_fraction << " + "
        << tol.slack << ")";
      problems += (problems.empty() ? "" : "; ") + s.str();
    }
  }
  return problems;
}

// The written tensors' bytes in index order (to compare runs with different layouts).
std::vector<uint8_t> gather_written(const Prepared& p, const std::vector<std::vector<uint8_t>>& buffers) {
  std::vector<uint8_t> out;
  for (size_t t = 0; t < p.tensors.size(); ++t) {
    if (!p.written[t]) continue;
    const TensorCase& tc = p.tensors[t];
    const size_t es = dtype_size(tc.dtype);
    const uint8_t* base = buffers[p.buffer_of[t]].data() + kGuard + tc.offset * es;
    for_each_element(tc.shape, tc.strides, [&](int64_t at) { out.insert(out.end(), base + at * es, base + at * es + es); });
  }
  return out;
}

std::vector<std::vector<uint8_t>> initial_contents(const Prepared& p) {
  std::vector<std::vector<uint8_t>> out;
  for (const auto& b : p.buffers) out.push_back(b.initial);
  return out;
}

std::string missing_fragments(const std::string& message, const std::vector<std::string>& fragments) {
  std::string missing;
  for (const auto& f : fragments)
    if (message.find(f) == std::string::npos) missing += (missing.empty() ? "'" : ", '") + f + "'";
  return missing;
}

// The case with every view of a shared buffer given a copy of it of its own: the result of an
// aliased call must equal this one's.
Prepared prepare_unaliased(const OpCase& c, const Prepared& p) {
  OpCase twin = c;
  twin.tensors = p.tensors;
  for (auto& t : twin.tensors) t.storage.clear();
  Prepared tp = prepare(twin);
  for (size_t t = 0; t < p.tensors.size(); ++t) {
    if (p.tensors[t].storage.empty()) continue;  // an owner: same name, same seed, same values
    const auto& shared = p.buffers[p.buffer_of[t]].initial;
    auto& own = tp.buffers[tp.buffer_of[t]].initial;
    std::copy_n(shared.begin(), std::min(shared.size(), own.size()) - kGuard, own.begin());
    tp.buffers[tp.buffer_of[t]].pure_output = false;
  }
  return tp;
}

std::string short_reason(const std::string& reason) {
  // Keys and device names make every reason unique; count by the words before them.
  std::string r = reason.substr(0, reason.find(" for key"));
  r = r.substr(0, r.find(" key "));
  return r.size() > 90 ? r.substr(0, 90) + "..." : r;
}

bool default_covers(const KernelSpec& spec, Device device) {
  if (spec.provenance == Provenance::reference) return device.kind == DeviceKind::cpu;
  if (spec.capabilities.empty()) return true;
  for (const auto& cap : spec.capabilities)
    if (cap.kind == device.kind) return true;
  return false;
}

}  // namespace

// ---------------------------------------------------------------- public

const char* case_kind_name(CaseKind kind) {
  switch (kind) {
    case CaseKind::model: return "model";
    case CaseKind::odd: return "odd";
    case CaseKind::strided: return "strided";
    case CaseKind::view: return "view";
    case CaseKind::misaligned: return "misaligned";
    case CaseKind::empty: return "empty";
    case CaseKind::aliased: return "aliased";
    case CaseKind::invalid: return "invalid";
  }
  return "?";
}

const Tolerance& OpCase::tolerance_of(const std::string& tensor, const std::string& impl) const {
  for (const auto& [name, t] : tolerance_for_impl)
    if (name == impl) return t;
  for (const auto& [name, t] : tolerance_for)
    if (name == tensor) return t;
  return tolerance;
}

std::unique_ptr<Memory> host_memory() { return std::make_unique<HostMemory>(); }

std::unique_ptr<Memory> cuda_memory() {
  const jit::CudaDriver* d = jit::cuda_driver();
  if (!d || d->device_count == 0) return nullptr;
  return std::make_unique<CudaMemory>();
}

std::string Summary::format(const std::string& op) const {
  std::ostringstream s;
  s << op << ": cases";
  for (const auto& [kind, n] : cases_by_kind) s << " " << kind << "=" << n;
  s << "\n";
  for (const auto& [impl, t] : impls) {
    int ineligible = 0;
    for (const auto& [why, n] : t.ineligible) ineligible += n;
    s << "  " << impl << ": ran " << t.ran << ", refused invalid " << t.refused_invalid << ", ineligible " << ineligible
      << "\n";
    for (const auto& [why, n] : t.ineligible) s << "    " << n << " x " << why << "\n";
  }
  return s.str();
}

std::vector<std::string> run_case(const OpCase& c, const DriverOptions& options, Summary* summary) {
  std::vector<std::string> failures;
  auto fail = [&](const std::string& what) { failures.push_back(c.op + "/" + c.name + ": " + what); };
  summary->cases_by_kind[case_kind_name(c.kind)]++;
  Prepared p;
  try {
    p = prepare(c);
  } catch (const std::exception& e) {
    fail(std::string("the case does not prepare: ") + e.what());
    return failures;
  }
  const auto mask = written_mask(p);
  const auto before = initial_contents(p);
  auto host = host_memory();
  const std::string ref_name = c.op + ".reference";

  // The reference and its invariants.
  const Outcome ref = execute(p, *host, Provenance::reference, "", before);
  if (!c.invalid.empty()) {
    if (ref.error.empty()) fail("the reference accepted an invalid input (expected an error with '" + c.invalid[0] + "')");
    else if (auto m = missing_fragments(ref.error, c.invalid); !m.empty())
      fail("the reference's error lacks " + m + ": " + ref.error);
    else summary->impls[ref_name].refused_invalid++;
    if (auto w = unwritten_unchanged(p, nullptr, before, ref.buffers); !w.empty()) fail("the reference refused but " + w);
  } else if (!ref.error.empty()) {
    fail("the reference failed: " + ref.error);
    return failures;
  } else {
    summary->impls[ref_name].ran++;
    if (auto w = unwritten_unchanged(p, &mask, before, ref.buffers); !w.empty()) fail("the reference " + w);
    // Everything written: the result may not depend on the outputs' prior contents.
    auto other = before;
    bool any_pure = false;
    for (size_t b = 0; b < p.buffers.size(); ++b)
      if (p.buffers[b].pure_output) {
        any_pure = true;
        for (size_t i = kGuard; i < kGuard + p.buffers[b].body; ++i) other[b][i] = kOtherSentinel;
      }
    if (any_pure && !c.large) {  // a large case's second reference run teaches nothing a small one does not
      const Outcome again = execute(p, *host, Provenance::reference, "", other);
      if (!again.error.empty()) fail("the reference failed on other output contents: " + again.error);
      else if (auto d = written_within(c, p, ref.buffers, again.buffers, true); !d.empty())
        fail("outputs depend on their prior contents (not everything written?): " + d);
    }
    // Aliased: equal to the same call on separate buffers.
    bool shares = false;
    for (const auto& t : p.tensors) shares = shares || !t.storage.empty();
    if (shares) {
      const Prepared tp = prepare_unaliased(c, p);
      const Outcome separate = execute(tp, *host, Provenance::reference, "", initial_contents(tp));
      if (!separate.error.empty()) fail("the unaliased twin failed: " + separate.error);
      else if (gather_written(tp, separate.buffers) != gather_written(p, ref.buffers))
        fail("the aliased result differs from the same call on separate buffers");
    }
  }

  // Every other implementation against the reference, on the device.
  if (!options.device) return failures;
  const Device device = options.device->device();
  for (const KernelSpec* spec : Registry::global().list(c.op)) {
    const bool covered = options.covers ? options.covers(*spec) : default_covers(*spec, device);
    if (!covered) continue;
    ImplTally& tally = summary->impls[spec->name];
    Outcome run = execute(p, *options.device, spec->provenance, c.invalid.empty() ? spec->name : "", before);
    if (options.tamper && !run.impl.empty()) options.tamper(spec->name, run.buffers);
    const std::string who = spec->name + " on " + device_name(device);
    if (!c.invalid.empty()) {
      if (run.error.empty()) fail(who + " accepted an invalid input");
      else if (auto m = missing_fragments(run.error, c.invalid); !m.empty()) fail(who + ": the error lacks " + m + ": " + run.error);
      else tally.refused_invalid++;
      if (auto w = unwritten_unchanged(p, nullptr, before, run.buffers); !w.empty()) fail(who + " refused but " + w);
      continue;
    }
    std::string expected_refusal;
    for (const auto& [impl, why] : c.unsupported)
      if (impl == spec->name) expected_refusal = why;
    if (!run.error.empty()) {
      fail(who + (run.candidate ? " failed: " : " could not be asked (explain failed): ") + run.error);
      continue;
    }
    if (!run.candidate) {
      fail(who + ": explain does not list it");
      continue;
    }
    if (!run.candidate->eligible) {
      tally.ineligible[short_reason(run.candidate->reason)]++;
      if (!expected_refusal.empty() && run.candidate->reason.find(expected_refusal) == std::string::npos)
        fail(who + " is refused for '" + run.candidate->reason + "', not for '" + expected_refusal + "'");
      continue;
    }
    if (!expected_refusal.empty()) {
      fail(who + " is eligible, but the case says it is unsupported ('" + expected_refusal + "')");
      continue;
    }
    if (run.chosen != spec->name) {
      fail(who + " is eligible but backend=" + provenance_name(spec->provenance) + " chooses " + run.chosen +
           ": it cannot be tested alone");
      continue;
    }
    if (run.impl != spec->name) {
      fail(who + ": backend=" + provenance_name(spec->provenance) + " ran " + run.impl);
      continue;
    }
    tally.ran++;
    if (auto w = unwritten_unchanged(p, &mask, before, run.buffers); !w.empty()) fail(who + " " + w);
    if (auto d = written_within(c, p, ref.buffers, run.buffers, false, spec->name); !d.empty())
      fail(who + " against the reference: " + d);
  }
  return failures;
}

std::vector<CheckedProperty> checked_properties(const OpCase& c) {
  std::vector<CheckedProperty> out;
  if (!c.invalid.empty()) return {{"refused, nothing written", true}, {"refused on a device", false}};
  const Prepared p = prepare(c, false);
  bool pure = false, shares = false;
  for (const Buffer& b : p.buffers) pure = pure || b.pure_output;
  for (const TensorCase& t : p.tensors) shares = shares || !t.storage.empty();
  out.push_back({"runs, writes only its outputs", !c.large});
  if (pure && !c.large) out.push_back({"everything written", true});
  if (shares) out.push_back({"aliased equals separate buffers", !c.large});
  out.push_back({"each implementation eligible or refused by explain", false});
  out.push_back({"each implementation against the reference", false});
  return out;
}

// ---------------------------------------------------------------- case registry

namespace {
std::vector<std::pair<std::string, std::function<std::vector<OpCase>()>>>& case_sets() {
  static std::vector<std::pair<std::string, std::function<std::vector<OpCase>()>>> sets;
  return sets;
}
}  // namespace

CaseSet::CaseSet(std::string op, std::function<std::vector<OpCase>()> make) {
  case_sets().emplace_back(std::move(op), std::move(make));
}

std::vector<OpCase> cases(const std::string& op) {
  std::vector<OpCase> out;
  for (const auto& [file_op, make] : case_sets()) {
    for (OpCase& c : make())
      if (op.empty() || c.op == op) out.push_back(std::move(c));
  }
  return out;
}

std::vector<std::string> ops_with_cases() {
  std::vector<std::string> out;
  for (const OpCase& c : cases())
    if (std::find(out.begin(), out.end(), c.op) == out.end()) out.push_back(c.op);
  return out;
}

std::string cases_json() {
  auto q = [](const std::string& s) {
    std::string out = "\"";
    for (char ch : s) out += (ch == '"' || ch == '\\') ? std::string("\\") + ch : std::string(1, ch);
    return out + "\"";
  };
  const char* fill_names[] = {"normal", "positive", "index", "wave", "constant", "sentinel"};
  std::string out = "[";
  bool first = true;
  for (const OpCase& c : cases()) {
    Prepared p;
    try {
      p = prepare(c, false);
    } catch (const std::exception&) {
      continue;  // the C++ test reports it
    }
    out += first ? "\n" : ",\n";
    first = false;
    out += "{\"op\": " + q(c.op) + ", \"name\": " + q(c.name) + ", \"kind\": " + q(case_kind_name(c.kind)) +
           ", \"seed\": " + std::to_string(c.seed) + ", \"large\": " + (c.large ? "true" : "false") +
           ", \"invalid\": [";
    for (size_t i = 0; i < c.invalid.size(); ++i) out += (i ? ", " : "") + q(c.invalid[i]);
    out += "], \"options\": {";
    for (size_t i = 0; i < c.options.size(); ++i) out += (i ? ", " : "") + q(c.options[i].first) + ": " + q(c.options[i].second);
    out += "}, \"tensors\": [";
    for (size_t t = 0; t < p.tensors.size(); ++t) {
      const TensorCase& tc = p.tensors[t];
      const Fill f = tc.fill.value_or(p.slot(t).role == TensorRole::out ? Fill::sentinel() : Fill::normal());
      out += std::string(t ? ",\n  " : "\n  ") + "{\"name\": " + q(tc.name) + ", \"dtype\": " + q(dtype_name(tc.dtype)) +
             ", \"shape\": [" + join(tc.shape) + "], \"strides\": [" + join(tc.strides) + "], \"storage\": " +
             q(tc.storage) + ", \"offset\": " + std::to_string(tc.offset) + ", \"written\": " +
             (p.written[t] ? "true" : "false") + ", \"fill\": {\"kind\": " + q(fill_names[static_cast<int>(f.kind)]) +
             ", \"scale\": " + std::to_string(f.scale) + ", \"offset\": " + std::to_string(f.offset) +
             ", \"modulo\": " + std::to_string(f.modulo) + "}}";
    }
    out += "]}";
  }
  return out + "\n]\n";
}

}  // namespace ditops::optest
