// The op test driver (op_test_driver.h): buffers with guards, the reference run and its
// invariants, every other implementation against it.
#include "op_test_driver.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <list>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "jit/cuda_driver.h"
#include "reference/fp8_fp4.h"
#include "reference/half.h"

namespace ditops::optest {

struct OracleIo::Slot {
  const TensorCase* tensor;
  int index;  // in the prepared case's tensors
  bool written;
  const uint8_t* before;  // the tensor's first element before the call
  const uint8_t* after;   // and as the reference left it
  bool dense;  // contiguous: an element's offset is its index
  std::vector<double> want, bound;  // bound kBits: want holds raw bits
  std::vector<uint8_t> given;

  int64_t offset(int64_t index) const;
};

namespace {

constexpr size_t kGuard = 256;  // sentinel bytes before and after every buffer
constexpr uint8_t kSentinel = 0xA5, kOtherSentinel = 0x5A;
constexpr double kBits = -2;  // an oracle bound: compare raw bits

std::string join(const std::vector<int64_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s;
}

std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (int d = static_cast<int>(shape.size()) - 2; d >= 0; --d) s[d] = s[d + 1] * std::max<int64_t>(shape[d + 1], 1);
  return s;
}

// Calls fn(element offset, count) for the runs of a strided view in index order: `count` elements
// that follow each other in memory from that offset (a dense tensor is one run, a padded one a run
// per row), so that comparisons and copies go a run at a time.
void for_each_run(const std::vector<int64_t>& shape, const std::vector<int64_t>& strides,
                  const std::function<void(int64_t, int64_t)>& fn) {
  if (numel(shape) == 0) return;
  int inner = static_cast<int>(shape.size());  // the trailing dims [inner, rank) make one run
  int64_t run = 1;
  while (inner > 0 && (shape[inner - 1] == 1 || strides[inner - 1] == run)) run *= shape[--inner];
  std::vector<int64_t> index(inner, 0);
  for (;;) {
    int64_t at = 0;
    for (int d = 0; d < inner; ++d) at += index[d] * strides[d];
    fn(at, run);
    int d = inner - 1;
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
  void download(const void* src, uint8_t* dst, size_t bytes) override { std::memcpy(dst, src, bytes); }
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
  void download(const void* src, uint8_t* dst, size_t bytes) override {
    jit::check_cu(driver_.cuMemcpyDtoH(dst, reinterpret_cast<CUdeviceptr>(src), bytes), "d2h");
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

void store_bits(uint8_t* base, int64_t i, DType dt, uint64_t bits) {
  const size_t es = dtype_size(dt);
  std::memcpy(base + i * es, &bits, es);  // little-endian: the low bytes
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
      case Fill::Kind::bits:
        if (f.patterns.empty()) return;
        store_bits(body, i, dt, f.patterns[static_cast<size_t>(i) % f.patterns.size()]);
        continue;
      case Fill::Kind::special:
        // The specials land on other elements in each tensor (the seed offsets them), so that
        // an elementwise op meets them beside finite operands as well as beside each other.
        if (i % std::max<int64_t>(f.modulo, 1) == 0) {
          const std::vector<uint64_t> specials = special_patterns(dt);
          store_bits(body, i, dt, specials[(static_cast<size_t>(i / std::max<int64_t>(f.modulo, 1)) + seed) % specials.size()]);
          continue;
        }
        v = f.scale * normal(rng);
        break;
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

// A prepared case's buffers (guards included) on one memory, allocated once for every run of the
// case: each run uploads its contents again.
class Staging {
 public:
  Staging(Memory& memory, const Prepared& p) : memory_(memory) {
    try {
      for (const Buffer& b : p.buffers) bases_.push_back(memory.allocate(kGuard + b.body + kGuard));
    } catch (...) {
      release();
      throw;
    }
  }
  ~Staging() { release(); }
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;
  Memory& memory() const { return memory_; }
  void* base(size_t b) const { return bases_[b]; }

 private:
  void release() {
    for (void* b : bases_) memory_.release(b);
    bases_.clear();
  }
  Memory& memory_;
  std::vector<void*> bases_;
};

// Optionally asks explain about `impl` and stops there (nothing uploaded) when it is not the one
// chosen; else uploads `contents` into `at`'s buffers, runs with `backend` forced and downloads,
// into the host buffers of `reuse` where given (a previous run's, taken from it).
Outcome execute(const Prepared& p, Staging& at, std::optional<Provenance> backend, const std::string& impl,
                const std::vector<std::vector<uint8_t>>& contents,
                std::vector<std::vector<uint8_t>>* reuse = nullptr) {
  Outcome out;
  Memory& memory = at.memory();
  std::vector<void*> data;
  for (size_t t = 0; t < p.tensors.size(); ++t)
    data.push_back(static_cast<uint8_t*>(at.base(p.buffer_of[t])) + kGuard +
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
    for (size_t b = 0; b < contents.size(); ++b) memory.upload(at.base(b), contents[b]);
    out.impl = ditops::call(p.op->name, call, nullptr);
    memory.synchronize();
  } catch (const std::exception& e) {
    out.error = e.what();
    if (out.error.empty()) out.error = "(an exception without a message)";
  }
  if (reuse) out.buffers = std::move(*reuse);
  out.buffers.resize(contents.size());
  for (size_t b = 0; b < contents.size(); ++b) {
    out.buffers[b].resize(contents[b].size());
    memory.download(at.base(b), out.buffers[b].data(), contents[b].size());
  }
  return out;
}

// The same on buffers of its own (a related or unaliased case's run).
Outcome execute(const Prepared& p, Memory& memory, std::optional<Provenance> backend, const std::string& impl,
                const std::vector<std::vector<uint8_t>>& contents) {
  Staging at(memory, p);
  return execute(p, at, backend, impl, contents);
}

// ---------------------------------------------------------------- comparisons

// The byte ranges [first, last) of each buffer (guards included) that the written tensors cover,
// sorted and merged: what a run may change.
using Ranges = std::vector<std::vector<std::pair<size_t, size_t>>>;
Ranges written_ranges(const Prepared& p) {
  Ranges out(p.buffers.size());
  for (size_t t = 0; t < p.tensors.size(); ++t) {
    if (!p.written[t]) continue;
    const TensorCase& tc = p.tensors[t];
    const size_t es = dtype_size(tc.dtype);
    auto& r = out[p.buffer_of[t]];
    for_each_run(tc.shape, tc.strides, [&](int64_t at, int64_t n) {
      const size_t first = kGuard + static_cast<size_t>(tc.offset + at) * es;
      r.emplace_back(first, first + static_cast<size_t>(n) * es);
    });
  }
  for (auto& r : out) {
    std::sort(r.begin(), r.end());
    std::vector<std::pair<size_t, size_t>> merged;
    for (const auto& [first, last] : r)
      if (!merged.empty() && first <= merged.back().second) merged.back().second = std::max(merged.back().second, last);
      else merged.emplace_back(first, last);
    r = std::move(merged);
  }
  return out;
}

std::string where_in(const Prepared& p, size_t b, size_t byte) {
  const std::string owner = p.tensors[p.buffers[b].owner].name;
  if (byte < kGuard) return "the guard before " + owner + "'s buffer (byte " + std::to_string(kGuard - byte) + " before)";
  if (byte >= kGuard + p.buffers[b].body)
    return "the guard after " + owner + "'s buffer (byte " + std::to_string(byte - kGuard - p.buffers[b].body) + " after)";
  return owner + "'s buffer at byte " + std::to_string(byte - kGuard) + " (an input, padding or unwritten gap)";
}

// "" when every byte outside the written tensors (`written`; nullptr: none) equals `before`'s; else
// where the first other byte is.
std::string unwritten_unchanged(const Prepared& p, const Ranges* written, const std::vector<std::vector<uint8_t>>& before,
                                const std::vector<std::vector<uint8_t>>& after) {
  for (size_t b = 0; b < before.size(); ++b) {
    const uint8_t *x = before[b].data(), *y = after[b].data();
    auto first_other = [&](size_t first, size_t last) -> std::string {
      if (first >= last || std::memcmp(x + first, y + first, last - first) == 0) return "";
      while (x[first] == y[first]) ++first;
      return "wrote " + where_in(p, b, first);
    };
    size_t from = 0;
    if (written)
      for (const auto& [first, last] : (*written)[b]) {
        if (auto w = first_other(from, first); !w.empty()) return w;
        from = last;
      }
    if (auto w = first_other(from, before[b].size()); !w.empty()) return w;
  }
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
    int64_t count = 0, differ = 0, first = -1, worst_at = -1;
    double worst = 0, worst_want = 0, worst_got = 0;
    auto compare = [&](int64_t at) {
      ++count;
      if (std::memcmp(w + at * es, g + at * es, es) == 0) return;
      double distance = 0, a = 0, b = 0;
      if (is_float(tc.dtype)) {
        a = load(w, at, tc.dtype);
        b = load(g, at, tc.dtype);
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
      if (worst_at < 0 || distance > worst) {
        worst = distance;
        worst_at = count - 1;
        worst_want = a;
        worst_got = b;
      }
    };
    for_each_run(tc.shape, tc.strides, [&](int64_t at, int64_t n) {
      if (std::memcmp(w + at * es, g + at * es, static_cast<size_t>(n) * es) == 0) count += n;  // equal bytes
      else
        for (int64_t i = at; i < at + n; ++i) compare(i);
    });
    if (differ == 0) continue;
    const bool too_far = tol.max_ulp == 0 || worst > tol.max_ulp;
    const bool too_many = static_cast<double>(differ) > tol.max_fraction * static_cast<double>(count) + tol.slack;
    if (too_far || too_many) {
      std::ostringstream s;
      s << tc.name << ": " << differ << " of " << count << " elements differ (first at index " << first
        << ", worst " << worst << " ulp";
      if (is_float(tc.dtype)) s << " at index " << worst_at << ": " << worst_got << " for " << worst_want;
      s << "; allowed " << tol.max_ulp << " ulp on " << tol.max_fraction << " + " << tol.slack << ")";
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
    for_each_run(tc.shape, tc.strides, [&](int64_t at, int64_t n) { out.insert(out.end(), base + at * es, base + (at + n) * es); });
  }
  return out;
}

// The buffers' contents before the call, moved out of `p` (no copy of a model-sized case).
std::vector<std::vector<uint8_t>> take_initial(Prepared& p) {
  std::vector<std::vector<uint8_t>> out;
  for (Buffer& b : p.buffers) out.push_back(std::move(b.initial));
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
Prepared prepare_unaliased(const OpCase& c, const Prepared& p, const std::vector<std::vector<uint8_t>>& before) {
  OpCase twin = c;
  twin.tensors = p.tensors;
  for (auto& t : twin.tensors) t.storage.clear();
  Prepared tp = prepare(twin);
  for (size_t t = 0; t < p.tensors.size(); ++t) {
    if (p.tensors[t].storage.empty()) continue;  // an owner: same name, same seed, same values
    const auto& shared = before[p.buffer_of[t]];
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

// ---------------------------------------------------------------- oracles, relations

// Element `index` (row-major over the shape) of a tensor: its offset in elements from the first.
int64_t element_offset(const TensorCase& t, int64_t index) {
  int64_t at = 0;
  for (int d = static_cast<int>(t.shape.size()) - 1; d >= 0; --d) {
    const int64_t extent = std::max<int64_t>(t.shape[d], 1);
    at += (index % extent) * t.strides[d];
    index /= extent;
  }
  return at;
}

// Any dtype's element as a double: floats decoded, integers as they are, packed bytes as bytes.
double element_value(const uint8_t* base, int64_t i, DType dt) {
  switch (dt) {
    case DType::i32: return reinterpret_cast<const int32_t*>(base)[i];
    case DType::i64: return static_cast<double>(reinterpret_cast<const int64_t*>(base)[i]);
    default: return is_float(dt) ? load(base, i, dt) : static_cast<double>(base[i]);
  }
}

const uint8_t* tensor_start(const Prepared& p, size_t t, const std::vector<std::vector<uint8_t>>& buffers) {
  return buffers[p.buffer_of[t]].data() + kGuard + p.tensors[t].offset * dtype_size(p.tensors[t].dtype);
}

std::list<std::pair<std::string, Oracle>>& oracle_sets() {
  static std::list<std::pair<std::string, Oracle>> sets;  // a list: the pointers oracles() hands out stay valid
  return sets;
}

bool oracle_applies(const Oracle& o, const OpCase& c) {
  if (o.applies) return o.applies(c);
  return c.invalid.empty() && !c.large;
}

// The oracle's expectations for a case, from the inputs (`before`) and the reference's outputs.
std::vector<OracleIo::Slot> oracle_expectations(const Oracle& o, const OpCase& c, const Prepared& p,
                                               const std::vector<std::vector<uint8_t>>& before,
                                               const std::vector<std::vector<uint8_t>>& after) {
  std::vector<OracleIo::Slot> slots;
  for (size_t t = 0; t < p.tensors.size(); ++t)
    slots.push_back({&p.tensors[t], static_cast<int>(t), p.written[t], tensor_start(p, t, before),
                     tensor_start(p, t, after), p.tensors[t].strides == contiguous_strides(p.tensors[t].shape), {}, {}, {}});
  OracleIo io(&slots, &c.options, p.op);
  o.expect(io);
  return slots;
}

// "" when the written tensors in `buffers` hold the oracle's values within its bounds.
std::string oracle_mismatches(const Oracle& o, const Prepared& p, const std::vector<OracleIo::Slot>& slots,
                              const std::vector<std::vector<uint8_t>>& buffers) {
  std::string problems;
  for (const OracleIo::Slot& s : slots) {
    if (s.given.empty()) continue;
    const TensorCase& tc = *s.tensor;
    const uint8_t* base = tensor_start(p, s.index, buffers);
    int64_t checked = 0, beyond = 0, first = -1;
    double first_got = 0, first_want = 0, first_bound = 0;
    for (int64_t i = 0; i < static_cast<int64_t>(s.given.size()); ++i) {
      if (!s.given[i]) continue;
      ++checked;
      if (s.bound[i] == kBits) {
        uint64_t got = 0, want = 0;
        std::memcpy(&got, base + s.offset(i) * dtype_size(tc.dtype), dtype_size(tc.dtype));
        std::memcpy(&want, &s.want[i], sizeof want);
        if (got != want && beyond++ == 0) {
          first = i;
          first_got = static_cast<double>(got);
          first_want = static_cast<double>(want);
        }
        continue;
      }
      const double got = element_value(base, s.offset(i), tc.dtype), want = s.want[i];
      double bound = s.bound[i];
      if (bound < 0) {
        const double scale = std::max(std::fabs(want), 1e-30);
        bound = o.ulps > 0 && is_float(tc.dtype) && std::isfinite(want)
                    ? o.ulps * std::exp2(std::floor(std::log2(scale))) * unit_ulp(tc.dtype)
                    : 0;
      }
      const bool ok = std::isnan(want) ? std::isnan(got)
                      : bound == 0     ? got == want && std::signbit(got) == std::signbit(want)
                                       : got == want || std::fabs(got - want) <= bound;
      if (ok) continue;
      if (beyond++ == 0) {
        first = i;
        first_got = got;
        first_want = want;
        first_bound = bound;
      }
    }
    if (beyond == 0) continue;
    std::ostringstream m;
    m << tc.name << ": " << beyond << " of " << checked << " elements beyond the oracle (first at index " << first
      << ": " << first_got << ", the oracle's " << first_want << " +- " << first_bound << ")";
    problems += (problems.empty() ? "" : "; ") + m.str();
  }
  return problems;
}

// Case `twin` of the op run on `memory` (the backend and implementation as in execute) with the
// input values of `p`'s tensors copied in where a twin tensor has the same name, shape and dtype.
struct TwinRun {
  Prepared p;
  Outcome run;
};
std::optional<TwinRun> run_twin(const OpCase& c, const Prepared& p, const std::vector<std::vector<uint8_t>>& before,
                                const std::string& twin, Memory& memory, std::optional<Provenance> backend,
                                const std::string& impl, std::string* error) {
  const OpCase* other = find_case(c.op, twin);
  if (!other) {
    *error = "names a related case '" + twin + "' the op does not declare";
    return std::nullopt;
  }
  TwinRun r;
  r.p = prepare(*other);
  for (size_t t = 0; t < r.p.tensors.size(); ++t) {
    const TensorCase& to = r.p.tensors[t];
    if (r.p.slot(t).role == TensorRole::out) continue;
    for (size_t s = 0; s < p.tensors.size(); ++s) {
      const TensorCase& from = p.tensors[s];
      if (from.name != to.name || from.shape != to.shape || from.dtype != to.dtype) continue;
      const size_t es = dtype_size(to.dtype);
      const uint8_t* src = tensor_start(p, s, before);
      uint8_t* dst = r.p.buffers[r.p.buffer_of[t]].initial.data() + kGuard + to.offset * es;
      for (int64_t i = 0; i < numel(to.shape); ++i)
        std::memcpy(dst + element_offset(to, i) * es, src + element_offset(from, i) * es, es);
    }
  }
  r.run = execute(r.p, memory, backend, impl, take_initial(r.p));
  return r;
}

// The elements of the written tensors two runs share by name, shape and dtype: (compared, differing).
std::pair<int64_t, int64_t> written_difference(const Prepared& a, const std::vector<std::vector<uint8_t>>& abuf,
                                              const Prepared& b, const std::vector<std::vector<uint8_t>>& bbuf) {
  int64_t compared = 0, differ = 0;
  for (size_t t = 0; t < a.tensors.size(); ++t) {
    if (!a.written[t]) continue;
    for (size_t u = 0; u < b.tensors.size(); ++u) {
      const TensorCase &x = a.tensors[t], &y = b.tensors[u];
      if (!b.written[u] || x.name != y.name || x.shape != y.shape || x.dtype != y.dtype) continue;
      const size_t es = dtype_size(x.dtype);
      const uint8_t *pa = tensor_start(a, t, abuf), *pb = tensor_start(b, u, bbuf);
      for (int64_t i = 0; i < numel(x.shape); ++i, ++compared)
        differ += std::memcmp(pa + element_offset(x, i) * es, pb + element_offset(y, i) * es, es) != 0;
    }
  }
  return {compared, differ};
}

}  // namespace

// ---------------------------------------------------------------- public

int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t e : shape) n *= e;
  return n;
}

std::vector<int64_t> row_strides(const std::vector<int64_t>& lead, int64_t row) {
  std::vector<int64_t> s(lead.size() + 1);
  s.back() = 1;
  int64_t stride = row;
  for (int d = static_cast<int>(lead.size()) - 1; d >= 0; --d) {
    s[d] = stride;
    stride *= lead[d];
  }
  return s;
}

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

TensorCase& OpCase::tensor(const std::string& name) {
  for (TensorCase& t : tensors)
    if (t.name == name) return t;
  throw Error(op + "/" + this->name + ": no tensor " + name);
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
  const Ranges written = written_ranges(p);
  const auto before = take_initial(p);
  auto host = host_memory();
  const std::string ref_name = c.op + ".reference";
  // The contents a second run starts from: pure outputs pre-filled differently. A large case runs
  // once (below), so it makes no copy of its buffers for a second run.
  bool any_pure = false;
  for (const auto& buffer : p.buffers) any_pure = any_pure || buffer.pure_output;
  std::vector<std::vector<uint8_t>> other;
  if (!c.large) {
    other = before;
    for (size_t b = 0; b < p.buffers.size(); ++b)
      if (p.buffers[b].pure_output)
        for (size_t i = kGuard; i < kGuard + p.buffers[b].body; ++i) other[b][i] = kOtherSentinel;
  }
  // (oracle, its expectations) of the oracles that also bound the implementations.
  std::vector<std::pair<const Oracle*, std::vector<OracleIo::Slot>>> contract_bounds;

  // The reference and its invariants.
  std::optional<Staging> host_at;  // released before the device runs (a Wan-sized case's gigabytes)
  host_at.emplace(*host, p);
  const Outcome ref = execute(p, *host_at, Provenance::reference, "", before);
  const bool check = options.check_reference;
  if (!c.invalid.empty()) {
    if (check) {
      if (ref.error.empty()) fail("the reference accepted an invalid input (expected an error with '" + c.invalid[0] + "')");
      else if (auto m = missing_fragments(ref.error, c.invalid); !m.empty())
        fail("the reference's error lacks " + m + ": " + ref.error);
      else summary->impls[ref_name].refused_invalid++;
      if (auto w = unwritten_unchanged(p, nullptr, before, ref.buffers); !w.empty()) fail("the reference refused but " + w);
    }
  } else if (!ref.error.empty()) {
    fail("the reference failed: " + ref.error);
    return failures;
  } else if (!check) {
    // Only what the implementations are held to: the bounding oracles' expectations.
    for (const Oracle* o : oracles(c.op)) {
      if (!o->bounds_implementations || !oracle_applies(*o, c)) continue;
      try {
        contract_bounds.emplace_back(o, oracle_expectations(*o, c, p, before, ref.buffers));
      } catch (const std::exception& e) {
        fail("the oracle (" + o->name + ") failed: " + e.what());
      }
    }
  } else {
    summary->impls[ref_name].ran++;
    if (auto w = unwritten_unchanged(p, &written, before, ref.buffers); !w.empty()) fail("the reference " + w);
    // Everything written: the result may not depend on the outputs' prior contents.
    if (any_pure && !c.large) {  // a large case's second reference run teaches nothing a small one does not
      const Outcome again = execute(p, *host_at, Provenance::reference, "", other);
      if (!again.error.empty()) fail("the reference failed on other output contents: " + again.error);
      else if (auto d = written_within(c, p, ref.buffers, again.buffers, true); !d.empty())
        fail("outputs depend on their prior contents (not everything written?): " + d);
    }
    // Aliased: equal to the same call on separate buffers.
    bool shares = false;
    for (const auto& t : p.tensors) shares = shares || !t.storage.empty();
    if (shares) {
      Prepared tp = prepare_unaliased(c, p, before);
      const Outcome separate = execute(tp, *host, Provenance::reference, "", take_initial(tp));
      if (!separate.error.empty()) fail("the unaliased twin failed: " + separate.error);
      else if (gather_written(tp, separate.buffers) != gather_written(p, ref.buffers))
        fail("the aliased result differs from the same call on separate buffers");
    }
    // The oracles: independent computations the reference must agree with.
    // What the oracles see: the reference's buffers, or a tampered copy (the driver's self-test).
    std::vector<std::vector<uint8_t>> tampered;
    if (options.tamper_reference) {
      tampered = ref.buffers;
      options.tamper_reference(tampered);
    }
    const auto& seen = options.tamper_reference ? tampered : ref.buffers;
    for (const Oracle* o : oracles(c.op)) {
      if (!oracle_applies(*o, c)) continue;
      try {
        auto slots = oracle_expectations(*o, c, p, before, seen);
        if (auto m = oracle_mismatches(*o, p, slots, seen); !m.empty())
          fail("the reference against the oracle (" + o->name + "): " + m);
        if (o->bounds_implementations) contract_bounds.emplace_back(o, std::move(slots));
      } catch (const std::exception& e) {
        fail("the oracle (" + o->name + ") failed: " + e.what());
      }
    }
    // Related cases on the same input values.
    for (const auto& [names, same] : {std::pair{&c.same_as, true}, std::pair{&c.differs_from, false}})
      for (const std::string& twin : *names) {
        std::string error;
        const auto r = run_twin(c, p, before, twin, *host, Provenance::reference, "", &error);
        if (!r || !r->run.error.empty()) {
          fail("the related case " + twin + (r ? " failed: " + r->run.error : ": " + error));
          continue;
        }
        const auto [compared, differ] = written_difference(p, ref.buffers, r->p, r->run.buffers);
        if (compared == 0) fail("shares no written tensor with the related case " + twin);
        else if (same && differ) fail(std::to_string(differ) + " of " + std::to_string(compared) + " written elements differ from " + twin + "'s");
        else if (!same && !differ) fail("writes what " + twin + " writes: the two are not told apart on these inputs");
      }
  }

  // Every other implementation against the reference, on the device: the case's buffers there and
  // the host buffers they come back into are the same for every implementation.
  if (!options.device) return failures;
  host_at.reset();
  const Device device = options.device->device();
  Staging device_at(*options.device, p);
  std::vector<std::vector<uint8_t>> spare;  // the last run's host buffers
  // The oracles are functions of the inputs and the written bytes: an implementation that wrote
  // every byte the reference wrote gets each oracle's verdict on the reference's buffers, computed
  // once per case; (oracle, on its own outputs) -> (mismatches, the oracle's error).
  std::map<std::pair<const Oracle*, bool>, std::pair<std::string, std::string>> on_reference;
  for (const KernelSpec* spec : Registry::global().list(c.op)) {
    const bool covered = options.covers ? options.covers(*spec) : default_covers(*spec, device);
    if (!covered) continue;
    ImplTally& tally = summary->impls[spec->name];
    Outcome run = execute(p, device_at, spec->provenance, c.invalid.empty() ? spec->name : "", before, &spare);
    struct Recycle {  // the buffers go back to `spare` however this implementation's checks end
      std::vector<std::vector<uint8_t>>& to;
      Outcome& from;
      ~Recycle() {
        if (!from.buffers.empty()) to = std::move(from.buffers);
      }
    } recycle{spare, run};
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
    if (auto w = unwritten_unchanged(p, &written, before, run.buffers); !w.empty()) fail(who + " " + w);
    if (auto d = written_within(c, p, ref.buffers, run.buffers, false, spec->name); !d.empty())
      fail(who + " against the reference: " + d);
    std::optional<bool> as_reference;  // every byte the reference's (asked only where an oracle checks)
    // (mismatches, error) of oracle `o` on this run's buffers: with `slots` its expectations from
    // the reference's outputs, else from this run's own.
    auto verdict = [&](const Oracle& o, const std::vector<OracleIo::Slot>* slots) {
      if (!as_reference) as_reference = run.buffers == ref.buffers;
      const std::pair key{&o, slots == nullptr};
      if (*as_reference)
        if (auto it = on_reference.find(key); it != on_reference.end()) return it->second;
      std::pair<std::string, std::string> v;
      try {
        v.first = slots ? oracle_mismatches(o, p, *slots, run.buffers)
                        : oracle_mismatches(o, p, oracle_expectations(o, c, p, before, run.buffers), run.buffers);
      } catch (const std::exception& e) {
        v.second = e.what();
      }
      if (*as_reference) on_reference[key] = v;
      return v;
    };
    // A tolerance widens the comparison with the reference only: every implementation is held to
    // the bounding oracles (the contract's bound), an implementation with a tolerance_for_impl too.
    for (const auto& [o, slots] : contract_bounds) {
      if (o->bounds_implementation && !o->bounds_implementation(spec->name)) continue;  // another bounds it
      const auto [m, error] = verdict(*o, &slots);
      if (!m.empty()) fail(who + " against the oracle (" + o->name + "): " + m);
      if (!error.empty()) fail("the oracle (" + o->name + ") failed on " + who + ": " + error);
    }
    for (const Oracle* o : oracles(c.op)) {
      if (!o->on_own_outputs || !oracle_applies(*o, c)) continue;
      const auto [m, error] = verdict(*o, nullptr);
      if (!m.empty()) fail(who + " against the oracle on its own outputs (" + o->name + "): " + m);
      if (!error.empty()) fail("the oracle (" + o->name + ") failed on " + who + ": " + error);
    }
    // Run to run: again on outputs pre-filled differently, the same bytes.
    if (c.run_twice && !c.large) {
      Outcome again = execute(p, device_at, spec->provenance, spec->name, other);
      if (options.tamper && !again.impl.empty()) options.tamper(spec->name + "#2", again.buffers);
      if (!again.error.empty()) fail(who + " failed on its second run: " + again.error);
      else if (auto d = written_within(c, p, run.buffers, again.buffers, true); !d.empty())
        fail(who + " run again on other output contents: " + d);
    }
    for (const std::string& twin : c.same_as) {
      std::string error;
      const auto r = run_twin(c, p, before, twin, *options.device, spec->provenance, spec->name, &error);
      if (!r || !r->run.candidate || !r->run.candidate->eligible || r->run.impl != spec->name) continue;  // ineligible there
      if (!r->run.error.empty()) {
        fail(who + " on the related case " + twin + " failed: " + r->run.error);
        continue;
      }
      const auto [compared, differ] = written_difference(p, run.buffers, r->p, r->run.buffers);
      if (differ) fail(who + ": " + std::to_string(differ) + " of " + std::to_string(compared) + " written elements differ from its run of " + twin);
    }
  }
  return failures;
}

// ---------------------------------------------------------------- fills, oracles, variants

std::vector<uint64_t> special_patterns(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return {0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x00000001, 0x807FFFFF,
              0x00800000, 0x7F7FFFFF, 0xFF7FFFFF, 0x3F800000, 0x3F800001, 0xBF800000};
    case DType::f16:
      return {0x0000, 0x8000, 0x7C00, 0xFC00, 0x7E00, 0xFE00, 0x0001, 0x83FF, 0x0400, 0x7BFF, 0xFBFF, 0x3C00, 0x3C01, 0xBC00};
    case DType::bf16:
      return {0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC0, 0xFFC0, 0x0001, 0x807F, 0x0080, 0x7F7F, 0xFF7F, 0x3F80, 0x3F81, 0xBF80};
    case DType::f8e4m3fn: return {0x00, 0x80, 0x7F, 0xFF, 0x01, 0x87, 0x08, 0x7E, 0xFE, 0x38, 0x39, 0xB8};
    case DType::i32: return {0, 1, 0xFFFFFFFF, 0x7FFFFFFF, 0x80000000};
    case DType::i64: return {0, 1, ~uint64_t{0}, 0x7FFFFFFFFFFFFFFF, 0x8000000000000000};
    default: return {0x00, 0x01, 0x7F, 0x80, 0xFF};
  }
}

int OracleIo::id(const std::string& tensor) const {
  for (size_t t = 0; t < slots_->size(); ++t)
    if ((*slots_)[t].tensor->name == tensor) return static_cast<int>(t);
  return -1;
}
DType OracleIo::dtype(int t) const { return (*slots_)[t].tensor->dtype; }
const std::vector<int64_t>& OracleIo::shape(int t) const { return (*slots_)[t].tensor->shape; }
int64_t OracleIo::numel(int t) const { return optest::numel(shape(t)); }
int64_t OracleIo::Slot::offset(int64_t index) const { return dense ? index : element_offset(*tensor, index); }
double OracleIo::in(int t, int64_t index) const {
  const Slot& s = (*slots_)[t];
  return element_value(s.before, s.offset(index), s.tensor->dtype);
}
uint64_t OracleIo::bits(int t, int64_t index) const {
  const Slot& s = (*slots_)[t];
  uint64_t b = 0;
  std::memcpy(&b, s.before + s.offset(index) * dtype_size(s.tensor->dtype), dtype_size(s.tensor->dtype));
  return b;
}
double OracleIo::out(int t, int64_t index) const {
  const Slot& s = (*slots_)[t];
  return element_value(s.after, s.offset(index), s.tensor->dtype);
}
std::string OracleIo::option(const std::string& name) const {
  for (const auto& [n, text] : *options_)
    if (n == name) return text;
  const int i = op_->option_index(name);
  if (i < 0) throw Error("the oracle asks for option '" + name + "', which " + op_->name + " does not have");
  return op_->options[i].default_text;
}
double OracleIo::number(const std::string& name) const { return std::stod(option(name)); }
void OracleIo::expect_bits(int t, int64_t index, uint64_t bits) {
  double as_double;
  std::memcpy(&as_double, &bits, sizeof bits);
  expect(t, index, as_double, kBits);
}

void OracleIo::expect(int t, int64_t index, double value, double bound) {
  Slot& s = (*slots_)[t];
  if (!s.written) throw Error("the oracle expects values of " + s.tensor->name + ", which the op does not write");
  if (s.given.empty()) {
    const int64_t n = optest::numel(s.tensor->shape);
    s.want.assign(n, 0.0);
    s.bound.assign(n, -1.0);
    s.given.assign(n, 0);
  }
  s.want[index] = value;
  s.bound[index] = bound;
  s.given[index] = 1;
}

OracleSet::OracleSet(std::string op, Oracle oracle) { oracle_sets().emplace_back(std::move(op), std::move(oracle)); }

std::vector<const Oracle*> oracles(const std::string& op) {
  std::vector<const Oracle*> out;
  for (const auto& [name, o] : oracle_sets())
    if (name == op) out.push_back(&o);
  return out;
}

OpCase misaligned_variant(const OpCase& c, const std::vector<std::string>& tensors, int64_t by) {
  OpCase v = c;
  v.name += by == 1 ? "_misaligned" : "_misaligned" + std::to_string(by);
  v.kind = CaseKind::misaligned;
  std::set<std::string> owners;  // the buffers that move, with every view of them
  for (const TensorCase& t : v.tensors)
    if (std::find(tensors.begin(), tensors.end(), t.name) != tensors.end())
      owners.insert(t.storage.empty() ? t.name : t.storage);
  for (TensorCase& t : v.tensors)
    if (owners.count(t.storage.empty() ? t.name : t.storage)) t.offset += by;
  return v;
}

OpCase padded_variant(const OpCase& c, const std::vector<std::string>& tensors, int64_t pad) {
  OpCase v = c;
  v.name += "_padded";
  v.kind = CaseKind::strided;
  for (TensorCase& t : v.tensors) {
    if (std::find(tensors.begin(), tensors.end(), t.name) == tensors.end() || !t.strides.empty() ||
        !t.storage.empty() || t.shape.size() < 2)
      continue;
    bool viewed = false;
    for (const TensorCase& u : v.tensors) viewed = viewed || u.storage == t.name;
    if (viewed) continue;
    const size_t r = t.shape.size();
    t.strides.assign(r, 1);
    t.strides[r - 2] = t.shape[r - 1] + pad;
    for (int d = static_cast<int>(r) - 3; d >= 0; --d) t.strides[d] = t.strides[d + 1] * std::max<int64_t>(t.shape[d + 1], 1);
  }
  return v;
}

OpCase option_variant(const OpCase& c, const std::vector<std::pair<std::string, std::string>>& options,
                      const std::string& suffix) {
  OpCase v = c;
  v.name += "_" + suffix;
  for (const auto& [name, text] : options) {
    bool set = false;
    for (auto& [n, t] : v.options)
      if (n == name) t = text, set = true;
    if (!set) v.options.emplace_back(name, text);
  }
  return v;
}

std::string call_key(const OpCase& c) {
  std::ostringstream k;
  k.precision(17);
  auto list = [&](const std::vector<int64_t>& v) {
    for (int64_t e : v) k << e << ',';
    k << ';';
  };
  auto options = c.options;
  std::sort(options.begin(), options.end());
  k << c.op << '|';
  for (const auto& [name, text] : options) k << name << '=' << text << ';';
  k << '|';
  for (const std::string& f : c.invalid) k << f << ';';
  for (const TensorCase& t : c.tensors) {
    k << '|' << t.name << ':' << dtype_name(t.dtype) << ':';
    list(t.shape);
    list(t.strides.empty() ? contiguous_strides(t.shape) : t.strides);
    k << t.storage << '+' << t.offset << ':';
    if (t.fill) {
      const Fill& f = *t.fill;
      k << static_cast<int>(f.kind) << ',' << f.scale << ',' << f.offset << ',' << f.modulo << ',';
      for (uint64_t b : f.patterns) k << b << ',';
    }
  }
  return k.str();
}

void add_variants(std::vector<OpCase>& cases, const Variants& v) {
  const size_t n = cases.size();
  std::set<std::string> calls;
  for (const OpCase& c : cases) calls.insert(call_key(c));
  auto add = [&](OpCase variant) {
    if (!calls.insert(call_key(variant)).second) return;  // declared already
    for (const TensorCase& t : variant.tensors) variant.large = variant.large || numel(t.shape) > v.device_only_above;
    cases.push_back(std::move(variant));
  };
  for (size_t i = 0; i < n; ++i) {
    const OpCase c = cases[i];
    const bool selected = v.of ? v.of(c) : c.kind == CaseKind::model && c.invalid.empty() && !c.large;
    if (!selected) continue;
    if (!v.misalign.empty()) add(misaligned_variant(c, v.misalign, v.misalign_by));
    if (!v.pad_rows.empty()) add(padded_variant(c, v.pad_rows, v.pad));
    for (const auto& [options, suffix] : v.options) add(option_variant(c, options, suffix));
  }
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
  for (const Oracle* o : oracles(c.op)) {
    if (!oracle_applies(*o, c)) continue;
    out.push_back({"the reference against the oracle (" + o->name + ")", true});
    if (o->bounds_implementations) out.push_back({"each implementation within the oracle's bound (" + o->name + ")", false});
    if (o->on_own_outputs) out.push_back({"each implementation against the oracle on its own outputs (" + o->name + ")", false});
  }
  for (size_t i = 0; i < c.same_as.size(); ++i) {
    out.push_back({"the same bytes as a related case", !c.large});
    out.push_back({"each implementation the same bytes as on a related case", false});
  }
  for (size_t i = 0; i < c.differs_from.size(); ++i) out.push_back({"other bytes than a related case", !c.large});
  out.push_back({"each implementation eligible or refused by explain", false});
  out.push_back({"each implementation against the reference", false});
  if (c.run_twice && !c.large) out.push_back({"each implementation run to run identical", false});
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

const OpCase* find_case(const std::string& op, const std::string& name) {
  static std::map<std::string, std::vector<OpCase>> made;
  auto it = made.find(op);
  if (it == made.end()) it = made.emplace(op, cases(op)).first;
  for (const OpCase& c : it->second)
    if (c.name == name) return &c;
  return nullptr;
}

std::vector<std::string> ops_with_cases() {
  std::vector<std::string> out;
  for (const OpCase& c : cases())
    if (std::find(out.begin(), out.end(), c.op) == out.end()) out.push_back(c.op);
  return out;
}

namespace {
// A fill's raw patterns for the JSON table (special: the dtype's, in the order the driver cycles).
std::string patterns_json(const Fill& f, DType dtype) {
  const std::vector<uint64_t> v = f.kind == Fill::Kind::special ? special_patterns(dtype) : f.patterns;
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
  return out;
}
}  // namespace

std::string cases_json() {
  auto q = [](const std::string& s) {
    std::string out = "\"";
    for (char ch : s) out += (ch == '"' || ch == '\\') ? std::string("\\") + ch : std::string(1, ch);
    return out + "\"";
  };
  const char* fill_names[] = {"normal", "positive", "index", "wave", "constant", "sentinel", "special", "bits"};
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
             ", \"modulo\": " + std::to_string(f.modulo) + ", \"patterns\": [" + patterns_json(f, tc.dtype) + "]}}";
    }
    out += "]}";
  }
  return out + "\n]\n";
}

}  // namespace ditops::optest
