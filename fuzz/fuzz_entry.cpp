// Hostile inputs from fuzz bytes (issue 22). The first byte picks the target:
//   0      DLPack import: a DLTensor with hostile ndim, shape, strides, byte_offset, dtype, device,
//          data (and a DLManagedTensorVersioned with hostile version / flags);
//   1..6   one op's C++ facade on CPU tensors: a nominal valid call decoded from the bytes, then
//          hostile mutations per tensor (extents, strides, dtype, rank, data pointer, aliasing)
//          and hostile options and positions.
// The tensors live in one arena with PROT_NONE guard pages on both sides, so a read or write
// past it crashes even without a sanitizer. A call is made only when every tensor the caller
// presents as valid lies inside the arena (otherwise the caller lies about its memory, which no
// library can detect), or when some tensor is one every op must refuse (negative extent, rank
// outside [0, 8], NULL data with elements, a span overflowing int64, an unknown dtype): then
// the call must throw ditops::Error before touching memory. A zero byte means "no mutation",
// so short inputs decode to valid calls.
#include "fuzz/fuzz_entry.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <limits>
#include <string>

#include "ditops/dlpack.h"
#include "ditops/layernorm_modulate.h"
#include "ditops/norm_scale_shift.h"
#include "ditops/qknorm_rope.h"
#include "ditops/residual_gate_add.h"
#include "src/core/matcher.h"  // kMaxViewElements, kMaxViewBytes: the contract modelled here

namespace ditops_fuzz {

namespace {

using namespace ditops;

Counts g_counts[kTargets];
int g_target = 0;

[[noreturn]] void finding(const std::string& what) { report_finding("", what); }


constexpr int64_t kHostile[] = {0,
                                1,
                                -1,
                                2,
                                -2,
                                3,
                                7,
                                64,
                                255,
                                100000000,
                                -100000000,
                                int64_t{1} << 31,
                                -(int64_t{1} << 31),
                                int64_t{1} << 32,
                                int64_t{1} << 40,
                                int64_t{1} << 62,
                                std::numeric_limits<int64_t>::max(),
                                std::numeric_limits<int64_t>::min()};
int64_t hostile(Reader& r) {
  const uint8_t b = r.u8();
  if (b < 2 * std::size(kHostile)) return kHostile[b % std::size(kHostile)];
  return static_cast<int64_t>(r.u64());
}

float hostile_eps(Reader& r) {
  switch (r.u8() % 8) {
    case 1: return 0.0f;
    case 2: return -1.0f;
    case 3: return std::numeric_limits<float>::quiet_NaN();
    case 4: return std::numeric_limits<float>::infinity();
    case 5: return 1e30f;
    default: return 1e-6f;
  }
}

// ------------------------------------------------------------------ the guarded arena

constexpr size_t kArenaBytes = size_t{1} << 18;

struct Arena {
  uint8_t* base = nullptr;
  Arena() {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    const size_t total = kArenaBytes + 2 * page;
    void* p = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) finding("mmap of the arena failed");
    auto* bytes = static_cast<uint8_t*>(p);
    mprotect(bytes, page, PROT_NONE);
    mprotect(bytes + page + kArenaBytes, page, PROT_NONE);
    base = bytes + page;
  }
  bool contains(uintptr_t lo, uintptr_t hi) const {
    const auto b = reinterpret_cast<uintptr_t>(base);
    return lo >= b && hi <= b + kArenaBytes && lo <= hi;
  }
};

Arena& arena() {
  static Arena a;
  return a;
}

// Whether every op must refuse `v` (Matcher::tensor's contract), whatever else the call holds:
// rank, dtype, negative extents, then the view bounds (kMaxViewElements, kMaxViewBytes; zero
// extents counted as 1, so they hold for empty views too), then NULL or misaligned data.
bool must_refuse(const TensorView& v) {
  if (v.rank < 0 || v.rank > kMaxRank) return true;
  const __int128 size = dtype_size(v.dtype);
  if (size == 0) return true;
  bool empty = false;
  for (int i = 0; i < v.rank; ++i) {
    if (v.shape[i] < 0) return true;
    empty = empty || v.shape[i] == 0;
  }
  __int128 numel = 1, span = 1;
  for (int i = 0; i < v.rank; ++i) {
    const __int128 stride = v.strides[i] < 0 ? -static_cast<__int128>(v.strides[i]) : v.strides[i];
    if (stride * size > kMaxViewBytes) return true;
  }
  for (int i = 0; i < v.rank; ++i) {
    const __int128 extent = v.shape[i] == 0 ? 1 : v.shape[i];
    const __int128 stride = v.strides[i] < 0 ? -static_cast<__int128>(v.strides[i]) : v.strides[i];
    numel *= extent;  // <= 2^48 * 2^63 before the test: fits
    if (numel > kMaxViewElements) return true;
    span += (extent - 1) * stride;  // <= 2^56 + 2^63 * 2^56: fits
    if (span > kMaxViewBytes / size) return true;
  }
  if (empty) return false;
  return v.data == nullptr || reinterpret_cast<uintptr_t>(v.data) % dtype_size(v.dtype) != 0;
}

// A tensor not refused by must_refuse: whether its bytes are in the arena (and it is small
// enough to run quickly).
bool inside_arena(const TensorView& v) {
  for (int i = 0; i < v.rank; ++i)
    if (v.shape[i] == 0) return true;
  __int128 lo = 0, hi = 0, numel = 1;
  for (int i = 0; i < v.rank; ++i) {
    numel *= v.shape[i];  // bounded by must_refuse (kMaxViewElements) before this is asked
    if (numel > (int64_t{1} << 20)) return false;
    const __int128 reach = static_cast<__int128>(v.shape[i] - 1) * v.strides[i];
    (reach < 0 ? lo : hi) += reach;
  }
  if (numel > (int64_t{1} << 20)) return false;
  const __int128 size = dtype_size(v.dtype);
  const __int128 base = reinterpret_cast<uintptr_t>(v.data);
  const __int128 first = base + lo * size, end = base + (hi + 1) * size;
  if (first < 0 || end > std::numeric_limits<uintptr_t>::max()) return false;
  return arena().contains(static_cast<uintptr_t>(first), static_cast<uintptr_t>(end));
}

// ------------------------------------------------------------------ building one call

struct Slot {
  const char* name;
  TensorView* view;
  bool optional;  // absent when data == nullptr (or, for `absent_rank0`, rank == 0)
  bool absent_rank0 = false;
};

class Builder {
 public:
  explicit Builder(Reader& r) : r_(r) {}

  // A contiguous view of `shape` placed in the arena (fresh or aliasing an earlier tensor),
  // then mutated.
  TensorView make(DType dtype, std::initializer_list<int64_t> shape) {
    TensorView v = TensorView::contiguous(nullptr, dtype, Device{}, shape.begin(), static_cast<int>(shape.size()));
    const uint8_t how = r_.u8();
    if (how < 224 || placed_.empty()) {
      int64_t bytes = static_cast<int64_t>(dtype_size(dtype));
      for (int64_t s : shape) bytes *= s > 0 ? s : 1;
      next_ = (next_ + 15) / 16 * 16;
      v.data = arena().base + std::min<size_t>(next_, kArenaBytes);
      next_ += static_cast<size_t>(std::min<int64_t>(bytes, kArenaBytes));
    } else {
      const TensorView& other = placed_[static_cast<size_t>(r_.pick(static_cast<int64_t>(placed_.size())))];
      const int64_t delta = (how & 3) == 0 ? 0 : static_cast<int64_t>(r_.u8() % 64) - 16;
      v.data = reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(other.data) + delta);
    }
    placed_.push_back(v);
    mutate(v);
    return v;
  }

  void mutate(TensorView& v) {
    for (int round = 0; round < 3; ++round) {
      const uint8_t m = r_.u8();
      if (m < 200) return;
      const int rank_ok = v.rank >= 1 && v.rank <= kMaxRank ? v.rank : 0;
      const int d = rank_ok ? static_cast<int>(r_.pick(rank_ok)) : 0;
      switch (m % 8) {
        case 0:
          if (rank_ok) v.shape[d] = r_.flag() ? hostile(r_) : static_cast<int64_t>(r_.u8() % 6) - 1;
          break;
        case 1:
          if (rank_ok) v.strides[d] = hostile(r_);
          break;
        case 2:
          v.dtype = static_cast<DType>(r_.u8() % 10);  // 9 is no ditops dtype
          break;
        case 3: {
          const int choice = static_cast<int>(r_.u8() % 5);
          if (choice == 0 && v.rank >= 0 && v.rank < kMaxRank) {
            v.shape[v.rank] = 1;
            v.strides[v.rank] = 1;
            ++v.rank;
          } else if (choice == 1 && v.rank > 0) {
            --v.rank;
          } else {
            v.rank = choice == 2 ? 9 : choice == 3 ? -1 : 1 << 20;
          }
          break;
        }
        case 4: {
          const int choice = static_cast<int>(r_.u8() % 4);
          if (choice == 0) v.data = nullptr;
          else if (choice == 3) v.data = reinterpret_cast<void*>(static_cast<uintptr_t>(r_.u64()));
          else v.data = reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(v.data) + choice);  // misaligned
          break;
        }
        case 5:
          if (rank_ok >= 2) std::swap(v.strides[d], v.strides[(d + 1) % rank_ok]);
          break;
        case 6:
          if (rank_ok) v.strides[d] = 0;
          break;
        case 7:
          if (rank_ok && v.shape[d] > 0 && v.strides[d] > 0 && v.strides[d] < (1 << 20) && v.shape[d] < (1 << 20)) {
            // Walk the dim backwards from its last element: the same bytes.
            v.data = reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(v.data) +
                                             (v.shape[d] - 1) * v.strides[d] * dtype_size(v.dtype));
            v.strides[d] = -v.strides[d];
          }
          break;
      }
    }
  }

  Reader& r() { return r_; }

 private:
  Reader& r_;
  size_t next_ = 0;
  std::vector<TensorView> placed_;
};

// Fills the arena, decides whether the call is meaningful, runs it and checks the outcome.
template <typename Call>
void run_call(const char* op, std::initializer_list<Slot> slots, Call&& call) {
  bool refuse = false, inside = true;
  std::string why;
  for (const Slot& s : slots) {
    const TensorView& v = *s.view;
    if (s.optional && (s.absent_rank0 ? v.rank == 0 : v.data == nullptr)) continue;
    if (must_refuse(v)) {
      refuse = true;
      why = s.name;
    } else if (!inside_arena(v)) {
      inside = false;
    }
  }
  if (!refuse && !inside) {  // the caller would lie about its memory
    ++g_counts[g_target].skipped;
    return;
  }
  try {
    const std::string ran = call();
    ++g_counts[g_target].ran;
    if (refuse) finding(std::string(op) + " accepted " + why + ", which every op must refuse (ran " + ran + ")");
    if (ran.find(".reference") == std::string::npos)
      finding(std::string(op) + " ran " + ran + " on the cpu");
  } catch (const Error&) {
    ++g_counts[g_target].refused;
  } catch (const std::exception& e) {
    finding(std::string(op) + " threw a non-ditops exception: " + e.what());
  }
}

DType act_dtype(Reader& r, std::initializer_list<DType> choices) { return choices.begin()[r.pick(choices.size())]; }

// ------------------------------------------------------------------ targets

void fuzz_dlpack(Reader& r) {
  int64_t shape[kMaxRank], strides[kMaxRank];
  for (int i = 0; i < kMaxRank; ++i) {
    shape[i] = r.flag() ? hostile(r) : r.u8() % 5;
    strides[i] = r.flag() ? hostile(r) : r.u8() % 17;
  }
  DLTensor t{};
  const uint8_t ndim = r.u8();
  t.ndim = ndim < 200 ? ndim % 10 : static_cast<int32_t>(hostile(r));
  t.shape = r.u8() < 250 ? shape : nullptr;
  t.strides = r.flag() ? strides : nullptr;
  static const DLDataType kTypes[] = {{kDLFloat, 32, 1}, {kDLFloat, 16, 1}, {kDLBfloat, 16, 1}, {kDLInt, 64, 1},
                                      {kDLInt, 32, 1},   {kDLUInt, 8, 1},   {kDLFloat4_e2m1fn, 4, 2}};
  const uint8_t dt = r.u8();
  t.dtype = dt < 200 ? kTypes[dt % std::size(kTypes)]
                     : DLDataType{r.u8(), r.u8(), static_cast<uint16_t>(r.u8() | (r.u8() << 8))};
  static const int32_t kDevices[] = {kDLCPU, kDLCUDA, kDLCUDAHost, kDLCUDAManaged, 0, 7, -1};
  t.device = {kDevices[r.pick(std::size(kDevices))], static_cast<int32_t>(r.flag() ? hostile(r) : r.u8() % 3)};
  switch (r.u8() % 4) {
    case 0: t.data = arena().base; break;
    case 1: t.data = nullptr; break;
    case 2: t.data = reinterpret_cast<void*>(static_cast<uintptr_t>(hostile(r))); break;
    default: t.data = arena().base + r.u8() * 64; break;
  }
  const uint8_t off = r.u8();
  t.byte_offset = off < 128 ? off : static_cast<uint64_t>(hostile(r));

  auto check_view = [&](const TensorView& v) {
    // An accepted view: rank as given, extents as given, and an address range that does not wrap.
    if (v.rank != t.ndim) finding("from_dlpack: rank changed");
    for (int i = 0; i < v.rank; ++i)
      if (v.shape[i] < 0) finding("from_dlpack accepted a negative extent");
    if (v.numel() > 0 && !v.data) finding("from_dlpack accepted NULL data with elements");
    if (v.numel() > 0) {
      __int128 lo = 0, hi = 0;
      for (int i = 0; i < v.rank; ++i) {
        const __int128 reach = static_cast<__int128>(v.shape[i] - 1) * v.strides[i];
        (reach < 0 ? lo : hi) += reach;
      }
      const __int128 size = dtype_size(v.dtype), base = reinterpret_cast<uintptr_t>(v.data);
      if (base + lo * size < 0 || base + (hi + 1) * size > std::numeric_limits<uintptr_t>::max())
        finding("from_dlpack accepted a tensor whose addresses wrap");
    }
    // What every op does first with a view: it must not crash either.
    try {
      DLManagedTensorVersioned* m = to_dlpack_versioned(v);
      const TensorView back = from_dlpack(*m, true);
      m->deleter(m);
      if (back.data != v.data || back.rank != v.rank) finding("DLPack round trip changed the view");
    } catch (const Error&) {
    }
  };
  try {
    check_view(from_dlpack(t));
    ++g_counts[0].ran;
  } catch (const Error&) {
    ++g_counts[0].refused;
  } catch (const std::exception& e) {
    finding(std::string("from_dlpack threw a non-ditops exception: ") + e.what());
  }
  DLManagedTensorVersioned managed{};
  managed.version = {static_cast<uint32_t>(r.u8() < 240 ? 1 : r.u8()), r.u8()};
  managed.flags = r.u8();
  managed.dl_tensor = t;
  try {
    check_view(from_dlpack(managed, r.flag()));
  } catch (const Error&) {
  } catch (const std::exception& e) {
    finding(std::string("from_dlpack (managed) threw a non-ditops exception: ") + e.what());
  }
}

void fuzz_qknorm_rope(Builder& b) {
  Reader& r = b.r();
  const int64_t T = r.size_or_zero(5), Hq = r.size_or_zero(4), Hk = r.size_or_zero(4);
  static const int64_t kD[] = {64, 128, 256, 32, 96};
  const int64_t D = kD[r.pick(std::size(kD))];
  const int64_t P = r.size_or_zero(7);
  QkNormRopeOptions o;
  static const int kRope[] = {0, 0, 0, 32, 16, 8, 12, 300, -8};
  o.rope_dim = kRope[r.pick(std::size(kRope))];
  const uint8_t flags = r.u8();
  o.cache_full_width = flags & 1;
  o.is_neox = flags & 2;
  o.rounding = flags & 4 ? QkRounding::fp32 : QkRounding::rounded;
  o.norm_order = flags & 8 ? QkNormOrder::warp : flags & 16 ? QkNormOrder::aten_mean : QkNormOrder::aten;
  o.norm_weight_rounding = flags & 32 ? QkNormWeightRounding::twice : QkNormWeightRounding::once;
  o.eps = hostile_eps(r);
  const DType act = act_dtype(r, {DType::bf16, DType::f16});
  const DType cache_dtype = act_dtype(r, {DType::f32, act, DType::f32});
  const DType pos_dtype = act_dtype(r, {DType::i64, DType::i32});
  const int64_t R = o.rope_dim > 0 ? o.rope_dim : D;
  const int64_t width = o.cache_full_width ? 2 * R : R;

  TensorView q, k;
  if (r.u8() % 3 == 1) {  // q and k: head slices of one packed [T, Hq + Hk + Hk, D] projection
    const TensorView qkv = b.make(act, {T, Hq + 2 * Hk, D});
    q = k = qkv;
    q.shape[1] = Hq;
    k.shape[1] = Hk;
    k.data = reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(qkv.data) + Hq * D * dtype_size(act));
    b.mutate(q);
    b.mutate(k);
  } else {
    q = b.make(act, {T, Hq, D});
    k = b.make(act, {T, Hk, D});
  }
  TensorView qw = b.make(act, {D}), kw = b.make(act, {D});
  TensorView cache = b.make(cache_dtype, {P, width});
  TensorView pos = b.make(pos_dtype, {T});
  std::memset(arena().base, r.u8() & 0x3f, kArenaBytes);  // small finite values for f16/bf16/f32
  // The positions, mostly valid: written where positions really is (it may alias q or k).
  if (!must_refuse(pos) && inside_arena(pos) && (pos.dtype == DType::i64 || pos.dtype == DType::i32) &&
      pos.rank == 1) {
    for (int64_t t = 0; t < pos.shape[0]; ++t) {
      const uint8_t v = r.u8();
      const int64_t value = v < 200 ? (P > 0 ? v % P : 0) : hostile(r);
      uint8_t* at = static_cast<uint8_t*>(pos.data) + t * pos.strides[0] * static_cast<int64_t>(dtype_size(pos.dtype));
      if (pos.dtype == DType::i64) std::memcpy(at, &value, 8);
      else {
        const auto v32 = static_cast<int32_t>(value);
        std::memcpy(at, &v32, 4);
      }
    }
  }
  run_call("qknorm_rope",
           {{"q", &q, false}, {"k", &k, false}, {"q_weight", &qw, false}, {"k_weight", &kw, false},
            {"cos_sin_cache", &cache, false}, {"positions", &pos, false}},
           [&] { return qknorm_rope(q, k, qw, kw, cache, pos, o); });
}

void fuzz_residual_gate_add(Builder& b) {
  Reader& r = b.r();
  const int R = 2 + static_cast<int>(r.pick(3));
  int64_t dims[4];
  for (int i = 0; i < R; ++i) dims[i] = 1 + r.pick(4);
  static const int64_t kD[] = {8, 16, 24, 6, 1, 64};
  dims[R - 1] = kD[r.pick(std::size(kD))];
  const DType dtype = act_dtype(r, {DType::bf16, DType::f16, DType::f32});
  auto make_like = [&](const int64_t* s) {
    switch (R) {
      case 2: return b.make(dtype, {s[0], s[1]});
      case 3: return b.make(dtype, {s[0], s[1], s[2]});
      default: return b.make(dtype, {s[0], s[1], s[2], s[3]});
    }
  };
  TensorView residual = make_like(dims);
  const bool transposed = R == 3 && r.u8() % 4 == 1;
  if (transposed) {  // the transposed [B, T, H] layout, strides (T*H, 1, T)
    residual.strides[0] = dims[1] * dims[2];
    residual.strides[1] = 1;
    residual.strides[2] = dims[1];
  }
  TensorView update = make_like(dims);
  int64_t gdims[4];
  const int mode = static_cast<int>(r.pick(4));  // full, row, per-token, batch
  for (int i = 0; i < R; ++i) {
    gdims[i] = mode == 0 ? dims[i] : mode == 1 ? (i == R - 1 ? dims[i] : 1)
             : mode == 2 ? (i == R - 1 ? 1 : dims[i]) : (i == 0 || i == R - 1 ? dims[i] : 1);
  }
  TensorView gate = make_like(gdims);
  TensorView out = r.u8() % 8 == 1 ? residual : make_like(dims);  // in place must be refused
  if (transposed)
    for (int i = 0; i < 3; ++i) out.strides[i] = residual.strides[i];
  std::memset(arena().base, r.u8() & 0x3f, kArenaBytes);
  run_call("residual_gate_add",
           {{"residual", &residual, false}, {"update", &update, false}, {"gate", &gate, false}, {"out", &out, false}},
           [&] { return residual_gate_add(residual, update, gate, out); });
}

void fuzz_layernorm_modulate(Builder& b, bool fp8) {
  Reader& r = b.r();
  const int64_t B = 1 + r.pick(3), S = 1 + r.pick(4);
  const uint8_t dsel = r.u8();
  const int64_t D = dsel < 200 ? 4 * (1 + dsel % 16) : dsel % 13;
  LayerNormModulateOptions o;
  o.eps = hostile_eps(r);
  o.mapping = static_cast<LnRowMapping>(r.pick(3));
  o.fp8_reciprocal = r.flag() ? Fp8Reciprocal::div_full : Fp8Reciprocal::ieee;
  TensorView x = b.make(DType::bf16, {B, S, D});
  TensorView scale = b.make(DType::bf16, {B, D});
  TensorView shift = r.u8() % 4 == 1 ? TensorView{} : b.make(DType::bf16, {B, D});
  TensorView input_scale = b.make(DType::f32, {1});
  TensorView out = !fp8 && r.u8() % 4 == 1 ? x : b.make(fp8 ? DType::f8e4m3fn : DType::bf16, {B, S, D});
  if (r.u8() % 4 == 1) o.stats_out = b.make(DType::f32, {B, S, 2});
  std::memset(arena().base, r.u8() & 0x3f, kArenaBytes);
  if (!must_refuse(input_scale) && inside_arena(input_scale) && input_scale.numel() > 0 &&
      input_scale.dtype == DType::f32) {
    const float value = r.flag() ? 0.0f : 0.5f;
    std::memcpy(input_scale.data, &value, 4);
  }
  if (fp8)
    run_call("layernorm_modulate_fp8",
             {{"x", &x, false}, {"scale", &scale, false}, {"shift", &shift, true, true},
              {"input_scale", &input_scale, false}, {"out", &out, false}, {"stats_out", &o.stats_out, true}},
             [&] { return layernorm_modulate_fp8(x, scale, shift, input_scale, out, o); });
  else
    run_call("layernorm_modulate",
             {{"x", &x, false}, {"scale", &scale, false}, {"shift", &shift, true, true}, {"out", &out, false},
              {"stats_out", &o.stats_out, true}},
             [&] { return layernorm_modulate(x, scale, shift, out, o); });
}

void fuzz_qk_head_layernorm(Builder& b) {
  Reader& r = b.r();
  const int64_t B = 1 + r.pick(2), S = 1 + r.pick(3), Hq = r.size_or_zero(4), Hk = r.size_or_zero(4);
  const uint8_t dsel = r.u8();
  const int64_t Dh = dsel < 200 ? 4 * (1 + dsel % 32) : dsel % 200;
  LayerNormModulateOptions o;
  o.eps = hostile_eps(r);
  TensorView q = b.make(DType::bf16, {B, S, Hq, Dh}), k = b.make(DType::bf16, {B, S, Hk, Dh});
  const bool in_place = r.u8() % 3 == 1;
  TensorView q_out = in_place ? q : b.make(DType::bf16, {B, S, Hq, Dh});
  TensorView k_out = in_place ? k : b.make(DType::bf16, {B, S, Hk, Dh});
  std::memset(arena().base, r.u8() & 0x3f, kArenaBytes);
  run_call("qk_head_layernorm", {{"q", &q, false}, {"k", &k, false}, {"q_out", &q_out, false}, {"k_out", &k_out, false}},
           [&] { return qk_head_layernorm(q, k, q_out, k_out, o); });
}

void fuzz_norm_scale_shift(Builder& b) {
  Reader& r = b.r();
  const int64_t B = 1 + r.pick(2), S = 1 + r.pick(4);
  const uint8_t dsel = r.u8();
  const int64_t D = dsel < 200 ? 64 * (1 + dsel % 3) : 4 * (dsel % 20);
  const DType act = act_dtype(r, {DType::bf16, DType::f16, DType::f32});
  NormScaleShiftOptions o;
  o.norm = r.flag() ? NormType::rms : NormType::layer;
  o.numerics = r.u8() % 4 == 1 ? NssNumerics::sglang : NssNumerics::eager;
  o.eps = hostile_eps(r);
  const uint8_t parts = r.u8();  // which optional tensors are present
  NormScaleShiftInputs in;
  NormScaleShiftOutputs out;
  in.x = b.make(act, {B, S, D});
  // scale: one of the broadcast classes
  switch (r.pick(6)) {
    case 0: in.scale = b.make(act, {D}); break;
    case 1: in.scale = b.make(act, {B, D}); break;
    case 2: in.scale = b.make(act, {B, S, D}); break;
    case 3: in.scale = b.make(act, {1}); break;
    case 4: in.scale = b.make(act, {B, S > 1 ? 2 : 1, 1, D}); break;
    default: in.scale = b.make(act, {1, 1, D}); break;
  }
  if (parts & 1) in.shift = b.make(act, {B, 1, D});
  if (parts & 2) {
    in.residual = b.make(act, {B, S, D});
    out.residual_out = (parts & 0x40) ? in.residual : b.make(act, {B, S, D});
    if (parts & 4) in.gate = b.make(act, {B, 1, D});
  }
  if (parts & 8) {
    in.weight = b.make(act, {D});
    if (parts & 0x10) in.bias = b.make(act, {D});
  }
  const uint8_t outs = r.u8();
  if (!(outs & 1)) out.y = (outs & 0x80) ? in.x : b.make(act, {B, S, D});
  if (outs & 2) {
    out.fp8 = b.make(DType::f8e4m3fn, {B, S, D});
    in.input_scale = b.make(DType::f32, {1});
  }
  if (outs & 4) {
    out.nvfp4_packed = b.make(DType::u8, {B * S, D / 2});
    out.nvfp4_scales = b.make(DType::u8, {(B * S + 127) / 128 * 128, D / 16});
    in.global_scale = b.make(DType::f32, {1});
  }
  std::memset(arena().base, r.u8() & 0x3f, kArenaBytes);
  run_call("norm_scale_shift",
           {{"x", &in.x, false}, {"residual", &in.residual, true}, {"gate", &in.gate, true},
            {"weight", &in.weight, true}, {"bias", &in.bias, true}, {"scale", &in.scale, true},
            {"shift", &in.shift, true}, {"input_scale", &in.input_scale, true},
            {"global_scale", &in.global_scale, true}, {"y", &out.y, true}, {"residual_out", &out.residual_out, true},
            {"fp8", &out.fp8, true}, {"nvfp4_packed", &out.nvfp4_packed, true},
            {"nvfp4_scales", &out.nvfp4_scales, true}},
           [&] { return norm_scale_shift(in, out, o); });
}

}  // namespace

const Counts* counts() { return g_counts; }

const char* target_name(int target) {
  static const char* const kNames[kTargets] = {"from_dlpack", "qknorm_rope", "residual_gate_add",
                                               "layernorm_modulate", "layernorm_modulate_fp8",
                                               "qk_head_layernorm", "norm_scale_shift"};
  return target >= 0 && target < kTargets ? kNames[target] : "?";
}

void run_one(const uint8_t* data, size_t size) {
  Reader r(data, size);
  const uint8_t target = r.u8() % kTargets;
  g_target = target;
  if (target == 0) return fuzz_dlpack(r);
  Builder b(r);
  switch (target) {
    case 1: return fuzz_qknorm_rope(b);
    case 2: return fuzz_residual_gate_add(b);
    case 3: return fuzz_layernorm_modulate(b, false);
    case 4: return fuzz_layernorm_modulate(b, true);
    case 5: return fuzz_qk_head_layernorm(b);
    default: return fuzz_norm_scale_shift(b);
  }
}

}  // namespace ditops_fuzz

namespace ditops_fuzz {

std::vector<std::vector<uint8_t>> seed_corpus() {
  using Bytes = std::vector<uint8_t>;
  // qknorm_rope, T = Hq = Hk = 1, D = 64, P = 4, f16 activations, f32 cache, i64 positions: the
  // prefix up to the tensors (target, T, Hq, Hk, D, P, rope_dim, flags, eps, act, cache, pos, layout).
  const Bytes qk = {1, 0, 0, 0, 0, 3, 0, 0, 0, 1, 0, 0, 0};
  auto cat = [](Bytes a, const Bytes& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  const Bytes plain = {0, 0};  // one tensor: fresh placement, no mutation
  Bytes qk_tensors;
  for (int i = 0; i < 6; ++i) qk_tensors = cat(qk_tensors, plain);
  Bytes dl;  // DLPack: a [2, 1]-strided f32 tensor in the arena (shape 2, stride 1 in every slot)
  for (int i = 0; i < kMaxRank; ++i) dl = cat(dl, {0, 2, 0, 1});
  const Bytes dl_head = cat({0}, dl);
  return {
      {0},
      {1},
      {2},
      {3},
      {4},
      {5},
      {6},
      // the repro: positions [100000000] with a 4-row cache
      cat(cat(qk, qk_tensors), {0, 200, 9}),
      // positions = 2^40
      cat(cat(qk, qk_tensors), {0, 200, 14}),
      // positions a view of q's memory (aliases the first tensor placed)
      cat(cat(cat(qk, Bytes(qk_tensors.begin(), qk_tensors.end() - 2)), {224, 0, 0}), {0, 1}),
      // an empty cache with one token
      {1, 0, 0, 0, 0, 6},
      // q.shape[0] = -1
      cat(qk, {0, 200, 0, 0, 0, 0}),
      // DLPack: rank 2 of the tensor above; NULL data; byte_offset 2^62; a hostile data pointer
      cat(dl_head, {2, 0, 1, 0, 0, 0, 0, 0, 0}),
      cat(dl_head, {2, 0, 1, 0, 0, 0, 0, 1, 0}),
      cat(dl_head, {2, 0, 1, 0, 0, 0, 0, 0, 200, 15}),
      cat(dl_head, {2, 0, 1, 0, 0, 0, 0, 2, 33, 0}),
      // DLPack: rank 9, rank -1
      cat(dl_head, {9}),
      cat(dl_head, {200, 2}),
      // libFuzzer: layernorm_modulate_fp8 with x at an odd address (the reference read misaligned bf16)
      {0xff, 0xff, 0xff, 0x26, 0xff, 0x00, 0x00, 0xff, 0x00, 0xff, 0xff, 0xff, 0x01, 0x00, 0x20, 0x02, 0x00, 0x00},
      // libFuzzer: an extent-1 dim with stride ~2^62 overflowed the alignment check's byte stride
      {0xff, 0xff, 0xff, 0xff, 0xe1, 0x27, 0xe1, 0xe1, 0xe1, 0xe1, 0xe1, 0xe1, 0xe1, 0xe1, 0xe1, 0xe1,
       0xe1, 0xe1, 0xe1, 0xe1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x0e, 0xf2, 0x39, 0x58, 0x03},
      // libFuzzer: qk_head_layernorm with B > 1 and an empty tensor of huge strides overflowed
      // S * stride(1) in the token-collapse check
      {0x28, 0x2f, 0x2f, 0x2f, 0x2f, 0x2f, 0x2f, 0x2f, 0x2f, 0x8d, 0x3f, 0x2f, 0x7a, 0x2f, 0x04, 0xc9,
       0xc9, 0xc9, 0xc9, 0xc9, 0x2f, 0xec, 0xec, 0xec, 0xec, 0x2f, 0x2f, 0x2f, 0x2f, 0xc9, 0xc9, 0xc9,
       0xc9, 0xc9, 0xc9, 0xc9, 0xc9, 0xc9, 0xc9, 0xc9, 0xc9, 0xc9, 0xc9, 0xc9, 0xc9, 0xc9, 0xc9, 0xc9,
       0xc9, 0xc9, 0xc9, 0xc9, 0xc9, 0xc9, 0xc9, 0xc9, 0xd9, 0xd9, 0xc9, 0xc9, 0xc9, 0xc9, 0xc9, 0xc9,
       0xc9, 0xc9, 0xc9, 0xc9},
      // CI's libFuzzer run: qknorm_rope with empty q and k of ~7e18 heads each overflowed Hq + Hk
      // (the matcher now bounds an empty view's other extents)
      {0x2b, 0x6d, 0x5f, 0x6b, 0x91, 0x72, 0x6f, 0x70, 0x65, 0x2e, 0x6a, 0x69, 0x74, 0x23, 0xc8, 0x01,
       0x71, 0x72, 0x6f, 0x72, 0x6f, 0x70, 0x65, 0x2e, 0x6a, 0x69, 0x74, 0x23, 0xc8, 0x01, 0x71, 0x72,
       0x6f, 0x72, 0x9d, 0x5a, 0xb6, 0x00, 0xb0, 0x60, 0x00, 0x00, 0x6f, 0x70, 0x01, 0x71, 0x65, 0x2e,
       0x6a, 0x69, 0x74, 0x03, 0xc8, 0x72, 0x6f, 0xff, 0x65, 0xff, 0x00, 0x2e, 0x5f, 0xff, 0x6a, 0x69,
       0x5f, 0x01, 0x74, 0x03, 0xc8, 0x5f, 0xdf, 0xff, 0x2a, 0x01, 0x00, 0x00},
      // libFuzzer (harness): an empty view's extents before its zero one overflowed inside_arena's
      // 128-bit element count
      {0x28, 0x2f, 0xc8, 0xc8, 0x2f, 0xc8, 0xa4, 0xc8, 0xc8, 0x6e, 0x6f, 0x72, 0x6d, 0x5f, 0x61, 0x6c,
       0x65, 0x5f, 0x73, 0x68, 0xc8, 0xc8, 0xc8, 0xc8, 0xc8, 0xc8, 0x67, 0x2b, 0xc8, 0x2f, 0xc8, 0xa4,
       0xc8, 0xc8, 0x6e, 0x6f, 0x72, 0x6d, 0x5f, 0x61, 0x6c, 0x65, 0x5f, 0x73, 0x68, 0x69, 0x66, 0x74,
       0x2e, 0x72, 0x65, 0x66, 0x65, 0x72, 0x65, 0x6e, 0x63, 0x65, 0xc8, 0xc8, 0xc8, 0xc8},
  };
}

}  // namespace ditops_fuzz
