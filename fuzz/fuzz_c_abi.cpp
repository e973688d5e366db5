// Hostile calls through the C ABI (ditops_call / ditops_explain, include/ditops/c_api.h), for
// every op of the table, CPU tensors only. The bytes decode, in order:
//   the op (an index into the table; rarely an unknown name or NULL), the entry (call or
//   explain), the dims (byte 0: the op's example size, small), then per tensor slot its
//   presence, dtype, placement (fresh in the arena, aliasing an earlier tensor, NULL data, a
//   pointer outside the arena) and up to three DLTensor mutations (ndim, an extent, strides,
//   dtype code/bits/lanes, device, byte_offset, NULL shape), then the options (absent, a valid
//   value, or hostile text; unknown names, NULL name or value, backend and quality), then the
//   C-side framing (tensor count, NULL arrays, error buffer size).
// A zero byte means "as the op describes it", so short inputs decode to valid calls.
//
// Checked on every call: no crash (guard pages around the arena and the error buffer); the
// return is 0 or 1; a failure leaves a NUL-terminated, non-empty message within error_size and
// no byte written past it; a success ran the reference (the tensors are on the CPU); a call with
// a tensor that every op must refuse (the DLPack rules of docs/hostile_input.md) fails; and a
// failed call wrote nothing to any tensor (validation precedes every write).
#include <sys/mman.h>
#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "ditops/c_api.h"
#include "ditops/dlpack.h"
#include "ditops/op.h"
#include "fuzz/fuzz_entry.h"

namespace ditops_fuzz {

namespace {

using namespace ditops;

CAbiCounts g_counts;

[[noreturn]] void finding(const std::string& what) { report_finding(" (c_abi)", what); }


constexpr int64_t kHostile[] = {-1, -2, 0, 1, 3, 7, 255, 100000000, int64_t{1} << 31, int64_t{1} << 32,
                                int64_t{1} << 40, int64_t{1} << 48, int64_t{1} << 62,
                                std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::min()};
int64_t hostile(Reader& r) {
  const uint8_t b = r.u8();
  if (b < 2 * std::size(kHostile)) return kHostile[b % std::size(kHostile)];
  return static_cast<int64_t>(r.u64());
}

// ------------------------------------------------------------------ guarded memory

// `bytes` of read-write memory between two PROT_NONE pages.
uint8_t* guarded(size_t bytes) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t inner = (bytes + page - 1) / page * page;
  void* p = mmap(nullptr, inner + 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) finding("mmap failed");
  auto* b = static_cast<uint8_t*>(p);
  mprotect(b, page, PROT_NONE);
  mprotect(b + page + inner, page, PROT_NONE);
  return b + page;
}

constexpr size_t kArenaBytes = size_t{1} << 19;
uint8_t* arena() {
  static uint8_t* a = guarded(kArenaBytes);
  return a;
}

// The error buffer ends at a guard page: the message may take error_size bytes, not one more.
constexpr size_t kErrorBytes = 4096;
uint8_t* error_page() {
  static uint8_t* e = guarded(kErrorBytes);
  return e;
}

// ------------------------------------------------------------------ DLTensor rules

// Bytes per element of a DLPack dtype ditops could accept, 0 when ditops has no such dtype.
size_t element_bytes(const DLDataType& t) {
  if (t.lanes == 2 && t.code == kDLFloat4_e2m1fn && t.bits == 4) return 1;
  if (t.lanes != 1) return 0;
  switch (t.code) {
    case kDLFloat: return t.bits == 32 ? 4 : t.bits == 16 ? 2 : 0;
    case kDLBfloat: return t.bits == 16 ? 2 : 0;
    case kDLInt: return t.bits == 32 ? 4 : t.bits == 64 ? 8 : 0;
    case kDLUInt: return t.bits == 8 ? 1 : 0;
    case kDLFloat8_e4m3fn:
    case kDLFloat8_e5m2: return t.bits == 8 ? 1 : 0;
    case kDLFloat4_e2m1fn: return t.bits == 4 && t.lanes == 1 ? 1 : 0;
    default: return 0;
  }
}

struct Extent {
  bool must_refuse = false;  // a tensor every op refuses (the DLPack import rules)
  bool inside = false;       // its bytes lie in the arena (meaningful when !must_refuse)
  size_t end = 0;            // when inside: the arena offset one past its last byte
};

// Whether every op must refuse `t` (the import rules of docs/hostile_input.md, checked without
// ditops), and otherwise whether its bytes lie in the arena.
Extent extent_of(const DLTensor& t) {
  Extent e;
  if (t.ndim < 0 || t.ndim > kMaxRank || (t.ndim > 0 && !t.shape)) return {true, false};
  if (t.device.device_type != kDLCPU && t.device.device_type != kDLCUDAHost && t.device.device_type != kDLCUDA &&
      t.device.device_type != kDLCUDAManaged)
    return {true, false};
  const size_t size = element_bytes(t.dtype);
  if (size == 0 && (t.dtype.bits == 0 || t.dtype.lanes == 0 || t.dtype.code == 200)) return {true, false};
  if (t.byte_offset > (uint64_t{1} << 48)) return {true, false};
  __int128 numel = 1, lo = 0, hi = 0;
  bool empty = false;
  for (int i = 0; i < t.ndim; ++i) {
    if (t.shape[i] < 0) return {true, false};
    empty = empty || t.shape[i] == 0;
  }
  if (size == 0) return {false, false};  // a dtype this oracle does not judge: only "no crash"
  if (empty) return {false, true};
  __int128 stride = 1;
  for (int i = t.ndim - 1; i >= 0; --i) {
    const __int128 s = t.strides ? t.strides[i] : stride;
    numel *= t.shape[i];
    if (numel > std::numeric_limits<int64_t>::max()) return {true, false};
    const __int128 reach = (t.shape[i] - 1) * s;
    (reach < 0 ? lo : hi) += reach;
    if (hi - lo > std::numeric_limits<int64_t>::max() / 16) return {true, false};
    stride *= t.shape[i];
  }
  if (!t.data) return {true, false};
  const __int128 base = static_cast<__int128>(reinterpret_cast<uintptr_t>(t.data)) + t.byte_offset;
  if (base % static_cast<__int128>(size) != 0) return {true, false};  // misaligned elements
  const __int128 first = base + lo * size, end = base + (hi + 1) * size;
  const auto a = static_cast<__int128>(reinterpret_cast<uintptr_t>(arena()));
  e.inside = numel <= (int64_t{1} << 18) && first >= a && end <= a + static_cast<__int128>(kArenaBytes) && first <= end;
  if (e.inside) e.end = static_cast<size_t>(end - a);
  return e;
}

// ------------------------------------------------------------------ one call

struct Placed {
  DLTensor t{};
  int64_t shape[kMaxRank + 2] = {};  // + 2: ndim mutations may read one past kMaxRank
  int64_t strides[kMaxRank + 2] = {};
};

const std::vector<const OpDescription*>& table() {
  static const std::vector<const OpDescription*> ops = op_descriptions();
  return ops;
}

DLDataType dl_dtype(const std::string& name) {
  DType d;
  if (!parse_dtype(name, &d)) finding("the op table names an unknown dtype " + name);
  return to_dlpack_dtype(d);
}

// One dim value: byte 0 follows the op's example (a head dim of 64, 128 or 256 as it is, others
// at most 4: small calls run fast), others small sizes.
int64_t dim_value(Reader& r, int64_t example) {
  static const int64_t kSizes[] = {1, 2, 3, 4, 5, 8, 16, 32, 64, 96, 128, 256, 0, 7, 6};
  const uint8_t b = r.u8();
  if (b == 0) return example == 64 || example == 128 || example == 256 ? example : std::min<int64_t>(example, 4);
  if (b < 250) return kSizes[b % std::size(kSizes)];
  return b == 250 ? -1 : b == 251 ? -3 : 1 << 20;
}

void mutate(Reader& r, Placed& p) {
  DLTensor& t = p.t;
  for (int round = 0; round < 3; ++round) {
    const uint8_t m = r.u8();
    if (m < 192) return;
    const int d = t.ndim > 0 && t.ndim <= kMaxRank ? static_cast<int>(r.pick(t.ndim)) : 0;
    switch (m % 10) {
      case 0: t.ndim = static_cast<int32_t>(r.u8() % 3 == 0 ? hostile(r) : static_cast<int64_t>(r.u8() % 11) - 1); break;
      case 1: if (t.ndim > 0 && t.ndim <= kMaxRank) p.shape[d] = hostile(r); break;
      case 2:  // explicit strides: compact first, then one hostile
        if (!t.strides) {
          int64_t s = 1;
          if (t.ndim > 0 && t.ndim <= kMaxRank)  // a hostile ndim (INT_MIN) must not reach ndim - 1
            for (int i = t.ndim - 1; i >= 0; --i) {
              p.strides[i] = s;
              s = static_cast<int64_t>(static_cast<uint64_t>(s) * static_cast<uint64_t>(p.shape[i] > 0 ? p.shape[i] : 1));
            }
          t.strides = p.strides;
        }
        if (t.ndim > 0 && t.ndim <= kMaxRank && r.u8() % 2) p.strides[d] = hostile(r);
        break;
      case 3: t.dtype = {r.u8(), r.u8(), static_cast<uint16_t>(r.u8() % 4)}; break;
      case 4: {
        static const int32_t kDevices[] = {kDLCPU, kDLCPU, 0, 7, -1, kDLCUDAHost};
        t.device = {kDevices[r.pick(std::size(kDevices))], static_cast<int32_t>(r.u8() % 4 == 0 ? hostile(r) : 0)};
        break;
      }
      case 5: t.byte_offset = r.u8() % 2 ? r.u8() % 16 : static_cast<uint64_t>(hostile(r)); break;
      case 6: t.shape = nullptr; break;
      case 7: t.data = nullptr; break;
      case 8: t.data = reinterpret_cast<void*>(static_cast<uintptr_t>(hostile(r))); break;
      default:  // the last extent grown by one: the view reaches the next tensor (or the guard page)
        if (t.ndim > 0 && t.ndim <= kMaxRank && p.shape[t.ndim - 1] < std::numeric_limits<int64_t>::max())
          ++p.shape[t.ndim - 1];
        break;
    }
  }
}

// Option text: the default, a choice, or hostile.
std::string option_text(Reader& r, const OptionSlot& o) {
  static const char* const kHostileText[] = {"",     "nan",  "inf", "-1",   "1e400", "99999999999999999999",
                                             "true", "0x10", "1 ",  "none", "maybe", "-9223372036854775808"};
  const uint8_t b = r.u8();
  if (b < 128) return o.default_text;
  if (b < 192 && !o.choices.empty()) return o.choices[b % o.choices.size()];
  if (b < 200) return std::string(static_cast<size_t>(r.u8()) * 16, '7');
  return kHostileText[b % std::size(kHostileText)];
}

}  // namespace

const CAbiCounts& c_abi_counts() { return g_counts; }

void run_c_abi(const uint8_t* data, size_t size) {
  Reader r(data, size);
  const auto& ops = table();
  const uint8_t op_byte = r.u8();
  const OpDescription& d = *ops[op_byte % ops.size()];
  const char* op_name = d.name.c_str();
  if (op_byte >= 250) op_name = op_byte == 250 ? nullptr : op_byte == 251 ? "" : "no_such_op";
  const bool explain = r.u8() % 8 == 1;

  // Dims: the example relations ("P=T") hold unless a byte overrides them.
  std::vector<std::pair<std::string, int64_t>> dims;
  std::string dims_text = d.dims;
  for (size_t start = 0; start < dims_text.size();) {
    const size_t comma = std::min(dims_text.find(',', start), dims_text.size());
    const std::string item = dims_text.substr(start, comma - start);
    const size_t eq = item.find('=');
    const std::string name = item.substr(0, eq);
    int64_t example = 4;
    try {
      example = symbolic_shape(item.substr(eq + 1), dims).at(0);
    } catch (const Error&) {
    }
    const bool relation = !item.substr(eq + 1).empty() && !std::isdigit(static_cast<unsigned char>(item[eq + 1]));
    const uint8_t b = relation ? r.u8() : 1;
    dims.emplace_back(name, relation && b % 4 != 3 ? example : dim_value(r, example));
    start = comma + 1;
  }

  // Tensors: inputs first (an output's presence depends on them).
  GenericCall presence = generic_call(d);
  std::vector<Placed> placed(d.tensors.size());
  std::vector<bool> present(d.tensors.size(), false);
  size_t next = 0;
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t i = 0; i < d.tensors.size(); ++i) {
      const TensorSlot& slot = d.tensors[i];
      if ((slot.role == TensorRole::out) != (pass == 1)) continue;
      const uint8_t presence_byte = r.u8();
      bool here = !slot.optional;
      if (pass == 1) {
        try {
          here = output_present(d, slot, presence);
        } catch (const Error&) {
        }
      }
      if (presence_byte % 4 == 1) here = !here;
      if (!here) continue;
      Placed& p = placed[i];
      // dtype: one of the alternatives; "=x" follows x (or f32 when x is absent).
      std::vector<std::string> alternatives;
      for (size_t s = 0; s <= slot.dtypes.size();) {
        const size_t bar = std::min(slot.dtypes.find('|', s), slot.dtypes.size());
        alternatives.push_back(slot.dtypes.substr(s, bar - s));
        s = bar + 1;
      }
      std::string dt = alternatives[r.pick(static_cast<int64_t>(alternatives.size()))];
      if (dt.rfind('=', 0) == 0) {
        const int other = d.tensor_index(dt.substr(1));
        dt = other >= 0 && present[other] && element_bytes(placed[other].t.dtype) ? "" : "f32";
        if (dt.empty()) p.t.dtype = placed[other].t.dtype;
      }
      if (!dt.empty()) p.t.dtype = dl_dtype(dt);
      // shape: the slot's symbolic one, or [dims...] for a slot whose rule is in the doc
      std::vector<int64_t> shape;
      try {
        shape = slot.shape.empty() ? std::vector<int64_t>{dims.back().second} : symbolic_shape(slot.shape, dims);
      } catch (const Error&) {
        shape = {1};
      }
      if (shape.size() > static_cast<size_t>(kMaxRank)) shape.resize(kMaxRank);
      p.t.ndim = static_cast<int32_t>(shape.size());
      for (size_t k = 0; k < shape.size(); ++k) p.shape[k] = shape[k];
      p.t.shape = p.shape;
      p.t.strides = nullptr;
      p.t.device = {kDLCPU, 0};
      // placement
      const uint8_t where = r.u8();
      __int128 bytes = static_cast<__int128>(element_bytes(p.t.dtype) ? element_bytes(p.t.dtype) : 1);
      for (int64_t s : shape) bytes = s > 0 && bytes < (__int128{1} << 40) ? bytes * s : bytes;
      std::vector<size_t> earlier;
      for (size_t k = 0; k < i; ++k)
        if (present[k]) earlier.push_back(k);
      if (where < 224 || earlier.empty()) {
        next = (next + 63) / 64 * 64;
        p.t.data = arena() + std::min(next, kArenaBytes);
        next += static_cast<size_t>(std::min<__int128>(bytes, kArenaBytes));
      } else {
        const Placed& other = placed[earlier[static_cast<size_t>(r.pick(static_cast<int64_t>(earlier.size())))]];
        // Address arithmetic on integers: the other tensor's data may be NULL or arbitrary.
        p.t.data = reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(other.t.data) + (where % 2 ? 0 : r.u8() % 48));
      }
      mutate(r, p);
      present[i] = true;
      presence.given[i] = true;
      presence.tensors[i] = TensorView::contiguous(nullptr, DType::f32, Device{}, shape);
    }
  }

  // Options, then backend / quality / unknown names.
  std::vector<std::string> names, values;
  std::vector<ditops_option> options;
  for (const OptionSlot& o : d.options) {
    const uint8_t b = r.u8();
    if (b % 3 != 1) continue;
    names.push_back(o.name);
    values.push_back(option_text(r, o));
  }
  const uint8_t extra = r.u8();
  if (extra % 8 == 1) names.push_back("backend"), values.push_back(extra & 0x10 ? "reference" : "jit");
  if (extra % 8 == 2) names.push_back("quality"), values.push_back(extra & 0x10 ? "high" : "ultra");
  if (extra % 8 == 3) names.push_back("no_such_option"), values.push_back("1");
  for (size_t i = 0; i < names.size(); ++i) options.push_back({names[i].c_str(), values[i].c_str()});
  if (extra % 8 == 4 && !options.empty()) options.back().value = nullptr;
  if (extra % 8 == 5 && !options.empty()) options.back().name = nullptr;

  // The C-side framing.
  std::vector<const DLTensor*> tensors(d.tensors.size(), nullptr);
  for (size_t i = 0; i < d.tensors.size(); ++i)
    if (present[i]) tensors[i] = &placed[i].t;
  const uint8_t framing = r.u8();
  size_t num_tensors = tensors.size();
  if (framing % 16 == 1) num_tensors += 1;
  if (framing % 16 == 2 && num_tensors > 0) num_tensors -= 1;
  std::vector<const DLTensor*> padded = tensors;
  padded.push_back(nullptr);  // num_tensors + 1 stays inside the array
  const DLTensor* const* tensor_array = framing % 16 == 3 ? nullptr : padded.data();
  const ditops_option* option_array = framing % 16 == 4 && !options.empty() ? nullptr : options.data();
  static const size_t kErrorSizes[] = {kErrorBytes, kErrorBytes, 0, 1, 2, 17, 200};
  const size_t error_size = kErrorSizes[(framing / 16) % std::size(kErrorSizes)];
  char* error = reinterpret_cast<char*>(error_page() + kErrorBytes - error_size);
  if (error_size) std::memset(error, 'x', error_size);
  char impl[64];
  std::memset(impl, 'x', sizeof impl);

  // What the call must do: fail when a tensor breaks an import rule; otherwise run only when
  // every present tensor lies in the arena.
  bool refuse = false, inside = true;
  size_t used = std::min(next + 64, kArenaBytes);
  for (size_t i = 0; i < d.tensors.size(); ++i) {
    if (!present[i]) continue;
    const Extent e = extent_of(placed[i].t);
    refuse = refuse || e.must_refuse;
    inside = inside && e.inside;
    used = std::max(used, e.end);
  }
  if (!refuse && !inside) {
    ++g_counts.skipped;
    return;
  }
  // Fill the arena with small finite values (each byte < 0x40), and keep a copy of what the
  // tensors hold.
  const uint8_t fill = r.u8() & 0x3f;
  std::memset(arena(), fill, used);
  const std::vector<uint8_t> before(arena(), arena() + used);

  int rc;
  char report[256];
  if (explain)
    rc = ditops_explain(op_name, tensor_array, num_tensors, option_array, options.size(), report, sizeof report,
                        error_size ? error : nullptr, error_size);
  else
    rc = ditops_call(op_name, tensor_array, num_tensors, option_array, options.size(), nullptr, impl, sizeof impl,
                     error_size ? error : nullptr, error_size);

  const std::string what = std::string(op_name ? op_name : "(NULL)") + (explain ? " explain" : " call");
  if (rc != 0 && rc != 1) finding(what + " returned " + std::to_string(rc));
  if (rc == 0) {
    ++g_counts.ran;
    if (refuse) finding(what + " accepted a tensor every op must refuse");
    if (!explain && std::strstr(impl, ".reference") == nullptr)
      finding(what + " ran " + std::string(impl, strnlen(impl, sizeof impl)) + " on CPU tensors");
    if (error_size && error[0] != '\0') finding(what + " succeeded but left an error message");
    return;
  }
  ++g_counts.refused;
  if (error_size) {
    if (!std::memchr(error, '\0', error_size)) finding(what + ": the error message is not NUL-terminated");
    if (error_size > 1 && error[0] == '\0') finding(what + ": failed with an empty message");
  }
  if (std::memcmp(before.data(), arena(), used) != 0) {
    size_t at = 0;
    while (before[at] == arena()[at]) ++at;
    finding(what + " failed (" + std::string(error_size ? error : "") + ") but wrote to the tensors (arena byte " +
            std::to_string(at) + ")");
  }
}

std::vector<std::vector<uint8_t>> c_abi_seed_corpus() {
  std::vector<std::vector<uint8_t>> seeds;
  const auto& ops = table();
  // One valid call of every op (zero bytes decode as the op describes it), and its explain.
  for (size_t i = 0; i < ops.size(); ++i) {
    seeds.push_back({static_cast<uint8_t>(i)});
    seeds.push_back({static_cast<uint8_t>(i), 1});
  }
  // Unknown op, NULL op, empty name.
  seeds.push_back({252});
  seeds.push_back({250});
  seeds.push_back({251});
  // residual_gate_add: the gate's data NULL, byte_offset 2^62 on the residual, ndim 9 on update.
  const uint8_t rga = static_cast<uint8_t>(std::max(0, [&] {
    for (size_t i = 0; i < ops.size(); ++i)
      if (ops[i]->name == "residual_gate_add") return static_cast<int>(i);
    return 0;
  }()));
  // Bytes: op, entry, B, S, D, then (presence, dtype, placement, mutation) per tensor.
  seeds.push_back({rga, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 197});
  seeds.push_back({rga, 0, 0, 0, 0, 0, 0, 0, 195, 0, 12});
  seeds.push_back({rga, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 200, 1, 10});
  // out aliasing residual (placement 225: the first earlier tensor, offset 0): in place is refused
  // and nothing is written.
  seeds.push_back({rga, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 225, 0, 0});
  // libFuzzer (harness): aliasing a tensor whose data is NULL, then a view of it.
  seeds.push_back({0xcf, 0xcf, 0xcf, 0xcf, 0xcf, 0xcf, 0xcf, 0xcf, 0xcf, 0xcf, 0xcf, 0xcf, 0xcf,
                   0xcf, 0xcf, 0xcf, 0xcf, 0xcf, 0xcf, 0xcf, 0xcf, 0xcf, 0xcf, 0x21, 0x01, 0xfc,
                   0xb2, 0xe4, 0x0c, 0x0c, 0x0c, 0x0c, 0x10, 0x03, 0xe9, 0x00, 0x00, 0x40, 0xe9});
  // libFuzzer: an output shape of [2^60, 64] (dims from the bytes) overflowed
  // TensorView::contiguous's stride product (signed overflow; now wrapping, refused by the matcher).
  seeds.push_back({0x2e, 0x48, 0x71, 0xff, 0xff, 0xff, 0xff, 0xff, 0x72, 0x65, 0x66,
                   0x65, 0x72, 0x65, 0x6e, 0x63, 0x65, 0xff, 0xff, 0xff, 0xff, 0x24});
  // libFuzzer (CI's bounded run): causal_conv3d_cat_pad's reference looped over huge extents of
  // an output with a zero extent (a timeout; it now returns at once).
  seeds.push_back({0x00, 0xff, 0xff, 0xff, 0xff, 0x00, 0xcf, 0x65, 0x02, 0x9a, 0x00, 0x00, 0x02, 0x5e, 0x28});
  // libFuzzer (CI's bounded run, UBSan): causal_conv3d_cat_pad's row model multiplied the
  // extents of an empty output ([2^20, 2^20, 2^20, 4, 0]) into a signed overflow.
  seeds.push_back({0x00, 0x40, 0xff, 0xff, 0xff, 0xff, 0x48, 0x10, 0x6e, 0x07, 0x00, 0x40, 0x60, 0x00, 0x6b,
                   0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f,
                   0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f,
                   0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x01});
  // libFuzzer (a local run, UBSan): fp8_linear's reference offset the empty x buffer of a K = 0
  // call (a null pointer plus the token block's offset).
  seeds.push_back({0xd3, 0x8d, 0x65, 0x73, 0x1b, 0x03});
  // libFuzzer (CI's bounded run, UBSan): the harness itself computed ndim - 1 of a hostile ndim
  // (INT_MIN) before its range check, building compact strides.
  seeds.push_back({0x66, 0x38, 0xe2, 0x65, 0x01, 0x00, 0x00, 0x6f, 0xc8, 0x9a, 0xff, 0x08, 0xfc, 0x00, 0x00, 0x00,
                   0x00, 0x0d});
  return seeds;
}

}  // namespace ditops_fuzz
