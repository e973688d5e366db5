// Tests of argument matching: every ditops::Matcher rule and its message on fake views (nothing is
// dereferenced), then the qknorm_rope facade's validation (match_qknorm_rope) on small CPU
// buffers, and that a call failing validation writes nothing.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/matcher.h"
#include "ditops/qknorm_rope.h"
#include "ditops/tensor.h"

namespace {

using ditops::Device;
using ditops::DeviceKind;
using ditops::Dim;
using ditops::DType;
using ditops::Matcher;
using ditops::QkNormRopeOptions;
using ditops::TensorView;

constexpr Device kCpu{DeviceKind::cpu, 0};
constexpr Device kCuda0{DeviceKind::cuda, 0};

void* fake_address(uintptr_t a) { return reinterpret_cast<void*>(a); }

TensorView view(DType dtype, std::initializer_list<int64_t> shape, std::initializer_list<int64_t> strides,
                Device device = kCpu, uintptr_t address = 0x10000) {
  TensorView v;
  v.data = fake_address(address);
  v.dtype = dtype;
  v.device = device;
  v.rank = static_cast<int>(shape.size());
  int i = 0;
  for (int64_t s : shape) v.shape[i++] = s;
  i = 0;
  for (int64_t s : strides) v.strides[i++] = s;
  return v;
}

// Runs `f`, expects ditops::Error, returns its message.
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const ditops::Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("unexpected exception type: ") + e.what();
  }
  return "<no error>";
}

// ------------------------------------------------------------------ Matcher rules

TEST(Matcher, RankMessage) {
  Matcher m("op");
  const TensorView t = view(DType::f32, {4, 8}, {8, 1});
  EXPECT_EQ(error_of([&] { m.tensor("t", t).rank(3); }),
            "op: t must have rank 3 but has rank 2 (f32[4, 8] strides (8, 1) on cpu)");
  EXPECT_NO_THROW(m.tensor("t", t).rank(2));
  // shape() checks the rank too.
  EXPECT_EQ(error_of([&] { m.tensor("t", t).shape({4, 8, 1}); }).find("op: t must have rank 3"), 0u);
}

TEST(Matcher, LiteralDims) {
  Matcher m("op");
  const TensorView t = view(DType::f32, {4, 8}, {8, 1});
  EXPECT_NO_THROW(m.tensor("t", t).shape({4, 8}));
  EXPECT_EQ(error_of([&] { m.tensor("t", t).shape({4, 16}); }), "op: t.shape[1] must be 16 but is 8");
  EXPECT_EQ(error_of([&] { m.tensor("t", t).shape({int64_t{5}, Dim::anything()}); }),
            "op: t.shape[0] must be 5 but is 4");
  EXPECT_NO_THROW(m.tensor("t", t).shape({Dim::anything(), Dim::anything()}));
}

TEST(Matcher, SymbolBindThenMismatch) {
  Matcher m("op");
  const TensorView q = view(DType::bf16, {4, 24, 128}, {3072, 128, 1});
  const TensorView k = view(DType::bf16, {4, 24, 96}, {2304, 96, 1});
  EXPECT_FALSE(m.value("D").has_value());
  m.tensor("q", q).shape({"T", "H", "D"});
  EXPECT_EQ(m.value("T"), 4);
  EXPECT_EQ(m.value("H"), 24);
  EXPECT_EQ(m.value("D"), 128);
  EXPECT_EQ(error_of([&] { m.tensor("k", k).shape({"T", "H", "D"}); }),
            "op: k.shape[2] must equal D=128 (bound by q.shape[2]) but is 96");
  // A mismatch does not rebind.
  EXPECT_EQ(m.value("D"), 128);
  // The same symbol twice in one tensor.
  Matcher sq("op");
  const TensorView rect = view(DType::f32, {3, 5}, {5, 1});
  EXPECT_EQ(error_of([&] { sq.tensor("m", rect).shape({"N", "N"}); }),
            "op: m.shape[1] must equal N=3 (bound by m.shape[0]) but is 5");
}

TEST(Matcher, Bind) {
  Matcher m("op");
  m.bind("D", 128, "options.head_dim");
  EXPECT_EQ(m.value("D"), 128);
  EXPECT_EQ(m.op(), "op");
  const TensorView w = view(DType::bf16, {96}, {1});
  EXPECT_EQ(error_of([&] { m.tensor("w", w).shape({"D"}); }),
            "op: w.shape[0] must equal D=128 (bound by options.head_dim) but is 96");
  const TensorView ok = view(DType::bf16, {128}, {1});
  EXPECT_NO_THROW(m.tensor("w", ok).shape({"D"}));
  EXPECT_EQ(error_of([&] { m.fail("custom"); }), "op: custom");
}

TEST(Matcher, Strides) {
  Matcher m("op");
  const TensorView t = view(DType::f32, {4, 2, 8}, {32, 8, 1});
  EXPECT_NO_THROW(m.tensor("t", t).strides({Dim::anything(), 8, 1}));
  EXPECT_EQ(error_of([&] { m.tensor("t", t).strides({Dim::anything(), 16, 1}); }),
            "op: t.stride(1) must be 16 but is 8");
  const TensorView not_unit = view(DType::f32, {4, 2, 8}, {32, 16, 2});
  EXPECT_EQ(error_of([&] { m.tensor("u", not_unit).strides({Dim::anything(), Dim::anything(), 1}); }),
            "op: u.stride(2) must be 1 but is 2");
  // Symbolic strides bind and are checked across tensors.
  m.tensor("t", t).strides({"ts", "hs", 1});
  EXPECT_EQ(m.value("hs"), 8);
  const TensorView other = view(DType::f32, {4, 2, 8}, {64, 16, 1});
  EXPECT_EQ(error_of([&] { m.tensor("o", other).strides({Dim::anything(), "hs", 1}); }),
            "op: o.stride(1) must equal hs=8 (bound by t.stride(1)) but is 16");
  // Rank is checked by strides() too.
  EXPECT_NE(error_of([&] { m.tensor("t", t).strides({1}); }).find("t must have rank 1 but has rank 3"),
            std::string::npos);
}

TEST(Matcher, StridesOfExtentOneDimsIgnored) {
  Matcher m("op");
  const TensorView t = view(DType::f32, {4, 1, 8}, {8, 999, 1});
  EXPECT_NO_THROW(m.tensor("t", t).strides({8, 8, 1}));
  // ... and do not bind a symbol.
  m.tensor("t", t).strides({"ts", "hs", 1});
  EXPECT_FALSE(m.value("hs").has_value());
  EXPECT_EQ(m.value("ts"), 8);
  // The same stride on a dim of extent 2 is checked.
  const TensorView t2 = view(DType::f32, {4, 2, 8}, {16, 999, 1});
  EXPECT_EQ(error_of([&] { m.tensor("t2", t2).strides({16, 8, 1}); }),
            "op: t2.stride(1) must be 8 but is 999");
}

TEST(Matcher, DTypeSets) {
  Matcher m("op");
  const TensorView f32 = view(DType::f32, {4}, {1});
  EXPECT_EQ(error_of([&] { m.tensor("x", f32).dtype({DType::bf16, DType::f16}); }),
            "op: x.dtype must be bf16 or f16 but is f32");
  EXPECT_EQ(error_of([&] { m.tensor("x", f32).dtype({DType::bf16}); }),
            "op: x.dtype must be bf16 but is f32");
  const TensorView i32 = view(DType::i32, {4}, {1});
  EXPECT_EQ(error_of([&] { m.tensor("p", i32).dtype({DType::f32, DType::f16, DType::bf16}); }),
            "op: p.dtype must be f32, f16 or bf16 but is i32");
  EXPECT_NO_THROW(m.tensor("x", f32).dtype({DType::bf16, DType::f32}));
}

TEST(Matcher, DTypeAs) {
  Matcher m("op");
  const TensorView q = view(DType::bf16, {4}, {1});
  const TensorView k = view(DType::f16, {4}, {1});
  const TensorView f32 = view(DType::f32, {4}, {1});
  // First use restricted to the allowed set.
  EXPECT_EQ(error_of([&] { m.tensor("q", f32).dtype_as("act", {DType::bf16, DType::f16}); }),
            "op: q.dtype must be bf16 or f16 but is f32");
  m.tensor("q", q).dtype_as("act", {DType::bf16, DType::f16});
  EXPECT_NO_THROW(m.tensor("w", q).dtype_as("act"));
  EXPECT_EQ(error_of([&] { m.tensor("k", k).dtype_as("act"); }),
            "op: k.dtype must be bf16 (as q) but is f16");
  // Without an allowed set, the first use binds anything.
  Matcher any("op");
  EXPECT_NO_THROW(any.tensor("a", f32).dtype_as("t"));
  EXPECT_EQ(error_of([&] { any.tensor("b", q).dtype_as("t"); }), "op: b.dtype must be f32 (as a) but is bf16");
}

TEST(Matcher, DeviceKind) {
  Matcher m("op");
  const TensorView on_cpu = view(DType::f32, {4}, {1}, kCpu);
  const TensorView on_cuda1 = view(DType::f32, {4}, {1}, {DeviceKind::cuda, 1});
  EXPECT_NO_THROW(m.tensor("x", on_cpu).device_kind(DeviceKind::cpu));
  EXPECT_EQ(error_of([&] { m.tensor("x", on_cpu).device_kind(DeviceKind::cuda); }),
            "op: x must be on a cuda device but is on cpu");
  EXPECT_EQ(error_of([&] { m.tensor("y", on_cuda1).device_kind(DeviceKind::cpu); }),
            "op: y must be on the cpu but is on cuda:1");
}

TEST(Matcher, SameDevice) {
  Matcher m("op");
  const TensorView a = view(DType::f32, {4}, {1}, kCuda0);
  const TensorView b = view(DType::f32, {4}, {1}, {DeviceKind::cuda, 1});
  const TensorView c = view(DType::f32, {4}, {1}, kCpu);
  m.tensor("a", a).same_device("dev");
  EXPECT_NO_THROW(m.tensor("a2", a).same_device("dev"));
  EXPECT_EQ(error_of([&] { m.tensor("b", b).same_device("dev"); }),
            "op: b.device must be cuda:0 (as a) but is cuda:1");
  EXPECT_EQ(error_of([&] { m.tensor("c", c).same_device("dev"); }),
            "op: c.device must be cuda:0 (as a) but is cpu");
  // Another symbol is independent.
  EXPECT_NO_THROW(m.tensor("c", c).same_device("other"));
}

TEST(Matcher, Aligned) {
  Matcher m("op");
  EXPECT_NO_THROW(m.tensor("x", view(DType::f32, {4}, {1}, kCpu, 0x1000)).aligned(16));
  EXPECT_NO_THROW(m.tensor("x", view(DType::f32, {4}, {1}, kCpu, 0x1010)).aligned(16));
  EXPECT_EQ(error_of([&] { m.tensor("x", view(DType::f32, {4}, {1}, kCpu, 0x1008)).aligned(16); }),
            "op: x.data must be 16-byte aligned but is at 0x1008");
  EXPECT_NO_THROW(m.tensor("x", view(DType::f32, {4}, {1}, kCpu, 0x1008)).aligned(8));
}

TEST(Matcher, Contiguous) {
  Matcher m("op");
  EXPECT_NO_THROW(m.tensor("x", view(DType::f32, {4, 8}, {8, 1})).contiguous());
  EXPECT_NO_THROW(m.tensor("x", view(DType::f32, {4, 1, 8}, {8, 77, 1})).contiguous());
  EXPECT_EQ(error_of([&] { m.tensor("x", view(DType::f32, {4, 8}, {16, 1})).contiguous(); }),
            "op: x must be contiguous but is f32[4, 8] strides (16, 1) on cpu");
  EXPECT_NE(error_of([&] { m.tensor("x", view(DType::f32, {8, 4}, {1, 8})).contiguous(); }),
            "<no error>");
}

// The layout helpers the ops share (core/matcher.h).
TEST(Matcher, NonnegativeStrides) {
  const Matcher m("op");
  EXPECT_NO_THROW(m.require_nonnegative_strides(view(DType::f32, {4, 8}, {0, 1}), "x"));
  EXPECT_EQ(error_of([&] { m.require_nonnegative_strides(view(DType::f32, {4, 8}, {-8, 1}), "x"); }),
            "op: x.stride(0) must be >= 0 but is -8");
}

TEST(Matcher, DisjointRows) {
  const Matcher m("op");
  EXPECT_NO_THROW(m.require_disjoint_rows(view(DType::bf16, {2, 3, 64}, {192, 64, 1}), "out", 64, "D"));
  EXPECT_NO_THROW(m.require_disjoint_rows(view(DType::bf16, {1, 1, 64}, {7, 7, 1}), "out", 64, "D"));
  EXPECT_NO_THROW(m.require_disjoint_rows(view(DType::bf16, {2, 0, 64}, {0, 0, 1}), "out", 64, "D"));
  EXPECT_EQ(error_of([&] { m.require_disjoint_rows(view(DType::bf16, {2, 3, 64}, {192, 32, 1}), "out", 64, "D"); }),
            "op: out.stride(1) must be >= D=64 (rows may not overlap) but is 32");
  EXPECT_EQ(error_of([&] { m.require_disjoint_rows(view(DType::bf16, {2, 3, 64}, {100, 64, 1}), "q", 64); }),
            "op: q.stride(0) must be >= 192 (batches may not overlap) but is 100");
}

TEST(Matcher, SameView) {
  const TensorView a = view(DType::bf16, {2, 1, 64}, {64, 64, 1});
  TensorView b = a;
  b.strides[1] = 5;  // an extent-1 dim addresses nothing
  EXPECT_TRUE(ditops::same_view(a, b));
  b.strides[0] = 128;
  EXPECT_FALSE(ditops::same_view(a, b));
  EXPECT_FALSE(ditops::same_view(a, view(DType::f16, {2, 1, 64}, {64, 64, 1})));
}

// ------------------------------------------------------------------ qknorm_rope validation

// Small real CPU buffers for one qknorm_rope call: q [T, Hq, D], k [T, Hk, D] bf16 (contiguous,
// separate), weights [D], cache f32 [P, rope_dim], positions i32 [T].
struct QkBuffers {
  static constexpr int64_t T = 4, Hq = 2, Hk = 1, D = 128, R = 64, P = 16;
  std::vector<uint16_t> q = std::vector<uint16_t>(T * Hq * D, 0x3f80);
  std::vector<uint16_t> k = std::vector<uint16_t>(T * Hk * D, 0x4000);
  std::vector<uint16_t> qw = std::vector<uint16_t>(D, 0x3f80);
  std::vector<uint16_t> kw = std::vector<uint16_t>(D, 0x3f80);
  std::vector<float> cache = std::vector<float>(P * 2 * R, 0.5f);  // room for a full-width cache
  std::vector<int32_t> pos = {0, 1, 2, 3};
  std::vector<float> pos_f32 = {0, 1, 2, 3};

  TensorView qv() { return TensorView::contiguous(q.data(), DType::bf16, kCpu, {T, Hq, D}); }
  TensorView kv() { return TensorView::contiguous(k.data(), DType::bf16, kCpu, {T, Hk, D}); }
  TensorView qwv() { return TensorView::contiguous(qw.data(), DType::bf16, kCpu, {D}); }
  TensorView kwv() { return TensorView::contiguous(kw.data(), DType::bf16, kCpu, {D}); }
  TensorView cv(int64_t width = R, DType dtype = DType::f32) {
    return TensorView::contiguous(cache.data(), dtype, kCpu, {P, width});
  }
  TensorView pv() { return TensorView::contiguous(pos.data(), DType::i32, kCpu, {T}); }
};

struct Args {
  TensorView q, k, qw, kw, cache, pos;
  QkNormRopeOptions options;
};

class QkNormRopeMatch : public ::testing::Test {
 protected:
  Args args() { return {b_.qv(), b_.kv(), b_.qwv(), b_.kwv(), b_.cv(), b_.pv(), {}}; }
  static std::string match_error(const Args& a) {
    return error_of([&] {
      ditops::match_qknorm_rope(a.q, a.k, a.qw, a.kw, a.cache, a.pos, a.options);
    });
  }
  // The message must start with the op, name the tensor and carry both values.
  static void expect_error(const Args& a, std::initializer_list<const char*> parts) {
    const std::string msg = match_error(a);
    EXPECT_EQ(msg.rfind("qknorm_rope: ", 0), 0u) << msg;
    for (const char* p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "missing '" << p << "' in: " << msg;
  }
  QkBuffers b_;
};

TEST_F(QkNormRopeMatch, ValidBaseline) {
  const Args a = args();
  EXPECT_EQ(match_error(a), "<no error>");
  const auto call = ditops::match_qknorm_rope(a.q, a.k, a.qw, a.kw, a.cache, a.pos, a.options);
  EXPECT_EQ(call.num_tokens, 4);
  EXPECT_EQ(call.num_q_heads, 2);
  EXPECT_EQ(call.num_k_heads, 1);
  EXPECT_EQ(call.head_dim, 128);
  EXPECT_EQ(call.rope_dim, 64);
  EXPECT_EQ(call.options.rope_dim, 64);
}

TEST_F(QkNormRopeMatch, KDtypeDiffers) {
  Args a = args();
  a.k.dtype = DType::f16;
  EXPECT_EQ(match_error(a), "qknorm_rope: k.dtype must be bf16 (as q) but is f16");
}

TEST_F(QkNormRopeMatch, F32Activations) {
  Args a = args();
  a.q.dtype = DType::f32;
  a.k.dtype = DType::f32;
  EXPECT_EQ(match_error(a), "qknorm_rope: q.dtype must be bf16 or f16 but is f32");
}

TEST_F(QkNormRopeMatch, WrongRank) {
  Args a = args();
  a.q = TensorView::contiguous(b_.q.data(), DType::bf16, kCpu, {4, 256});
  expect_error(a, {"q must have rank 3", "has rank 2"});
  Args b = args();
  b.k = TensorView::contiguous(b_.k.data(), DType::bf16, kCpu, {1, 4, 1, 128});
  expect_error(b, {"k must have rank 3", "has rank 4"});
}

TEST_F(QkNormRopeMatch, KHeadDimDiffers) {
  Args a = args();
  a.k = TensorView::contiguous(b_.k.data(), DType::bf16, kCpu, {4, 1, 96});
  EXPECT_EQ(match_error(a), "qknorm_rope: k.shape[2] must equal D=128 (bound by q.shape[2]) but is 96");
}

TEST_F(QkNormRopeMatch, UnsupportedHeadDim) {
  Args a = args();
  a.q = TensorView::contiguous(b_.q.data(), DType::bf16, kCpu, {4, 2, 96});
  a.k = TensorView::contiguous(b_.k.data(), DType::bf16, kCpu, {4, 1, 96});
  expect_error(a, {"q.shape[2] (head_dim)", "64, 128 or 256", "but is 96"});
}

TEST_F(QkNormRopeMatch, RopeDimAboveHeadDim) {
  Args a = args();
  a.options.rope_dim = 256;
  a.cache = b_.cv(256);
  expect_error(a, {"rope_dim", "head_dim=128", "but is 256"});
}

TEST_F(QkNormRopeMatch, RopeDimNotMultipleOf8) {
  Args a = args();
  a.options.rope_dim = 20;
  a.cache = b_.cv(20);
  expect_error(a, {"rope_dim", "multiple of 8", "but is 20"});
}

TEST_F(QkNormRopeMatch, NeoxRopeDimNotMultipleOf16) {
  Args a = args();
  a.options.is_neox = true;
  a.cache = b_.cv(24);  // rope_dim from the cache width
  expect_error(a, {"NeoX", "rope_dim % 16 == 0", "24"});
  a.options.is_neox = false;
  EXPECT_EQ(match_error(a), "<no error>");  // 24 is fine for GPT-J style
}

TEST_F(QkNormRopeMatch, CacheNarrowerThanRopeDim) {
  Args a = args();
  a.options.rope_dim = 64;
  a.cache = b_.cv(32);
  expect_error(a, {"cos_sin_cache.shape[1] must be 64", "rope_dim=64", "but is 32"});
  // Full width needs 2 * rope_dim.
  Args f = args();
  f.options.rope_dim = 64;
  f.options.cache_full_width = true;
  f.cache = b_.cv(64);
  expect_error(f, {"cos_sin_cache.shape[1] must be 128", "full width", "but is 64"});
  f.cache = b_.cv(128);
  EXPECT_EQ(match_error(f), "<no error>");
}

TEST_F(QkNormRopeMatch, CacheDtypeNotActivation) {
  Args a = args();
  a.cache = b_.cv(64, DType::f16);
  expect_error(a, {"cos_sin_cache.dtype", "f32 or bf16", "but is f16"});
  a.cache = b_.cv(64, DType::bf16);
  EXPECT_EQ(match_error(a), "<no error>");
}

TEST_F(QkNormRopeMatch, PositionsDtype) {
  Args a = args();
  a.pos = TensorView::contiguous(b_.pos_f32.data(), DType::f32, kCpu, {4});
  EXPECT_EQ(match_error(a), "qknorm_rope: positions.dtype must be i32 or i64 but is f32");
}

TEST_F(QkNormRopeMatch, PositionsLength) {
  Args a = args();
  a.pos = TensorView::contiguous(b_.pos.data(), DType::i32, kCpu, {3});
  EXPECT_EQ(match_error(a), "qknorm_rope: positions.shape[0] must equal T=4 (bound by q.shape[0]) but is 3");
}

TEST_F(QkNormRopeMatch, WeightLength) {
  Args a = args();
  a.kw = TensorView::contiguous(b_.kw.data(), DType::bf16, kCpu, {64});
  EXPECT_EQ(match_error(a), "qknorm_rope: k_weight.shape[0] must equal D=128 (bound by q.shape[2]) but is 64");
  Args b = args();
  b.qw.dtype = DType::f16;
  expect_error(b, {"q_weight.dtype", "bf16", "f16"});
}

TEST_F(QkNormRopeMatch, HeadStridesDiffer) {
  // k with 2 heads at head stride 256 (every other 128-slot) vs q's 128.
  std::vector<uint16_t> kbuf(4 * 512, 0);
  Args a = args();
  a.k = TensorView::contiguous(kbuf.data(), DType::bf16, kCpu, {4, 2, 128});
  a.k.strides[0] = 512;
  a.k.strides[1] = 256;
  EXPECT_EQ(match_error(a),
            "qknorm_rope: k.stride(1) must equal head_stride=128 (bound by q.stride(1)) but is 256");
}

TEST_F(QkNormRopeMatch, LastStrideNotOne) {
  Args a = args();
  a.q.strides[2] = 2;
  EXPECT_EQ(match_error(a), "qknorm_rope: q.stride(2) must be 1 but is 2");
}

TEST_F(QkNormRopeMatch, OverlappingHeads) {
  Args a = args();
  a.q.strides[1] = 64;   // heads overlap by half
  a.k.strides[1] = 64;   // k has one head: its stride is ignored, still consistent
  expect_error(a, {"q.stride(1)", "head_dim=128", "but is 64"});
}

TEST_F(QkNormRopeMatch, OverlappingTokens) {
  Args a = args();
  a.q.strides[0] = 128;  // token t+1 starts at head 1 of token t
  expect_error(a, {"q.stride(0) must be >= 256", "tokens may not overlap", "but is 128"});
}

TEST_F(QkNormRopeMatch, DevicesDiffer) {
  Args a = args();
  a.k.device = kCuda0;  // a CUDA view over a host pointer: must fail before any CUDA call
  EXPECT_EQ(match_error(a), "qknorm_rope: k.device must be cpu (as q) but is cuda:0");
  Args b = args();
  b.pos.device = kCuda0;
  expect_error(b, {"positions.device", "cpu", "cuda:0"});
}

TEST_F(QkNormRopeMatch, QAndKAlias) {
  Args a = args();
  a.k = TensorView::contiguous(b_.q.data(), DType::bf16, kCpu, {4, 1, 128});
  a.k.strides[0] = 256;
  expect_error(a, {"q and k must not alias"});
}

// Views into one packed buffer [T, 5 heads, D]: disjoint head ranges interleave in memory
// (accepted); any shared element is refused.
TEST_F(QkNormRopeMatch, PartialOverlapOfQAndKIsRefusedPackedViewsAreNot) {
  constexpr int64_t T = 4, D = 128, H = 5;
  std::vector<uint16_t> packed(T * H * D, 0x3f80);
  auto view_at = [&](int64_t head0, int64_t heads, int64_t element_shift = 0) {
    TensorView v = TensorView::contiguous(packed.data() + head0 * D + element_shift, DType::bf16, kCpu, {T, heads, D});
    v.strides[0] = H * D;
    return v;
  };
  Args a = args();
  a.q = view_at(0, 2);  // heads 0-1
  a.k = view_at(2, 1);  // head 2: the packed QKV case
  EXPECT_EQ(match_error(a), "<no error>");
  a.k = view_at(4, 1);  // head 4, the last of each token: still disjoint
  EXPECT_EQ(match_error(a), "<no error>");
  a.k = view_at(1, 1);  // head 1 is q's second head
  expect_error(a, {"q and k overlap in memory"});
  a.k = view_at(2, 1, -8);  // k starts 8 elements inside q's last head
  expect_error(a, {"q and k overlap in memory"});
  // k's rows one token later than q's (same stride): k head 0 of token t is q head 0 of t+1.
  Args b = args();
  b.q = view_at(0, 2);
  b.k = view_at(H, 1);
  b.q.shape[0] = b.k.shape[0] = b.pos.shape[0] = T - 1;
  expect_error(b, {"q and k overlap in memory"});
  // Different token strides whose byte ranges meet: refused (no exact test for such layouts).
  Args c = args();
  c.q = view_at(0, 2);
  c.k = view_at(2, 1);
  c.k.strides[0] = 3 * D;
  c.q.shape[0] = c.k.shape[0] = c.pos.shape[0] = 2;
  expect_error(c, {"q and k overlap in memory"});
  // Separate buffers: fine.
  EXPECT_EQ(match_error(args()), "<no error>");
}

// The dense-layout check the ops share: the first stride off its dense value, in any dim order;
// extent-1 dims and views without elements take any stride (PyTorch's empty [2, 0, 64] has
// strides (64, 64, 1)).
TEST(DenseLayout, FirstMismatchInAnyOrderAndEmptyViewsAreDense) {
  static float data[64];
  const Device cpu{DeviceKind::cpu, 0};
  TensorView t = TensorView::contiguous(data, DType::f32, cpu, {2, 3, 4});
  int64_t expected = 0;
  EXPECT_EQ(ditops::dense_layout_mismatch(t, nullptr, &expected), -1);
  t.strides[0] = 13;
  EXPECT_EQ(ditops::dense_layout_mismatch(t, nullptr, &expected), 0);
  EXPECT_EQ(expected, 12);
  const int channels_last[3] = {0, 2, 1};  // [2, 3, 4] stored as [2, 4, 3]
  TensorView cl = TensorView::contiguous(data, DType::f32, cpu, {2, 3, 4});
  cl.strides[0] = 12;
  cl.strides[1] = 1;
  cl.strides[2] = 3;
  EXPECT_EQ(ditops::dense_layout_mismatch(cl, channels_last, &expected), -1);
  EXPECT_EQ(ditops::dense_layout_mismatch(cl, nullptr, &expected), 2);
  EXPECT_EQ(expected, 1);
  TensorView empty = TensorView::contiguous(data, DType::f32, cpu, {2, 0, 64});
  empty.strides[0] = 64;
  empty.strides[1] = 64;
  EXPECT_EQ(ditops::dense_layout_mismatch(empty, nullptr, &expected), -1);
  EXPECT_TRUE(empty.is_contiguous());
  EXPECT_FALSE(t.is_contiguous());
}

TEST_F(QkNormRopeMatch, FailedInPlaceCallWritesNothing) {
  // First show that a valid facade call does write (so "unchanged" below means something).
  {
    QkBuffers good;
    const std::vector<uint16_t> q0 = good.q;
    ditops::qknorm_rope(good.qv(), good.kv(), good.qwv(), good.kwv(), good.cv(), good.pv());
    EXPECT_NE(good.q, q0);
  }
  // Fill with a pattern, then call with an invalid argument.
  for (size_t i = 0; i < b_.q.size(); ++i) b_.q[i] = static_cast<uint16_t>(0x3c00 + (i * 7) % 512);
  for (size_t i = 0; i < b_.k.size(); ++i) b_.k[i] = static_cast<uint16_t>(0x3e00 + (i * 13) % 512);
  const std::vector<uint16_t> q0 = b_.q, k0 = b_.k;
  const TensorView bad_pos = TensorView::contiguous(b_.pos_f32.data(), DType::f32, kCpu, {4});
  EXPECT_THROW(ditops::qknorm_rope(b_.qv(), b_.kv(), b_.qwv(), b_.kwv(), b_.cv(), bad_pos), ditops::Error);
  EXPECT_EQ(b_.q, q0);
  EXPECT_EQ(b_.k, k0);
  // A late check (the cache width) fails the same way.
  QkNormRopeOptions opts;
  opts.rope_dim = 64;
  EXPECT_THROW(ditops::qknorm_rope(b_.qv(), b_.kv(), b_.qwv(), b_.kwv(), b_.cv(32), b_.pv(), opts),
               ditops::Error);
  EXPECT_EQ(b_.q, q0);
  EXPECT_EQ(b_.k, k0);
}

struct AlignedBuffer {
  explicit AlignedBuffer(size_t bytes) : p(static_cast<char*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64))) {
    std::memset(p, 0, (bytes + 63) / 64 * 64);
  }
  ~AlignedBuffer() { std::free(p); }
  char* p;
};

TEST_F(QkNormRopeMatch, PackedQkvView) {
  constexpr int64_t T = 3, Hq = 4, Hk = 2, D = 128, R = 128;
  constexpr int64_t token_stride = (Hq + 2 * Hk) * D;
  AlignedBuffer qkv(T * token_stride * 2);
  AlignedBuffer qw(D * 2), kw(D * 2), cache(16 * R * 4), pos(T * 8);
  TensorView q = TensorView::contiguous(qkv.p, DType::bf16, kCpu, {T, Hq, D});
  q.strides[0] = token_stride;
  TensorView k = TensorView::contiguous(qkv.p + Hq * D * 2, DType::bf16, kCpu, {T, Hk, D});
  k.strides[0] = token_stride;
  const TensorView qwv = TensorView::contiguous(qw.p, DType::bf16, kCpu, {D});
  const TensorView kwv = TensorView::contiguous(kw.p, DType::bf16, kCpu, {D});
  const TensorView cv = TensorView::contiguous(cache.p, DType::f32, kCpu, {16, R});
  const TensorView pv = TensorView::contiguous(pos.p, DType::i64, kCpu, {T});
  QkNormRopeOptions opts;
  opts.is_neox = true;
  const auto call = ditops::match_qknorm_rope(q, k, qwv, kwv, cv, pv, opts);
  EXPECT_EQ(call.num_tokens, T);
  EXPECT_EQ(call.num_q_heads, Hq);
  EXPECT_EQ(call.num_k_heads, Hk);
  EXPECT_EQ(call.head_dim, D);
  EXPECT_EQ(call.rope_dim, R);
  EXPECT_TRUE(call.aligned16);
  EXPECT_EQ(call.q.strides[0], token_stride);
  EXPECT_EQ(call.k.data, static_cast<void*>(qkv.p + Hq * D * 2));

  // One element off: still valid, but not 16-byte aligned.
  TensorView q_off = q;
  q_off.data = qkv.p + 2;
  TensorView k_off = k;
  k_off.data = qkv.p + Hq * D * 2 + 2;
  const auto off = ditops::match_qknorm_rope(q_off, k_off, qwv, kwv, cv, pv, opts);
  EXPECT_FALSE(off.aligned16);
  // A token stride that is not a multiple of 8 elements also clears aligned16.
  AlignedBuffer wide(T * (token_stride + 4) * 2);
  TensorView q_odd = TensorView::contiguous(wide.p, DType::bf16, kCpu, {T, Hq, D});
  q_odd.strides[0] = token_stride + 4;
  TensorView k_odd = TensorView::contiguous(wide.p + Hq * D * 2, DType::bf16, kCpu, {T, Hk, D});
  k_odd.strides[0] = token_stride + 4;
  EXPECT_FALSE(ditops::match_qknorm_rope(q_odd, k_odd, qwv, kwv, cv, pv, opts).aligned16);
}

}  // namespace

namespace ditops {
namespace {
// With one q head, q.stride(1) is free: the shared head stride must come from k.
TEST(QkNormRopeMatchHeadStride, BoundByTheTensorWithSeveralHeads) {
  std::vector<uint16_t> q(4 * 256), k(4 * 512), w(128);
  std::vector<float> cache(8 * 128);
  std::vector<int64_t> pos(4, 0);
  const Device cpu{DeviceKind::cpu, 0};
  auto vq = TensorView::contiguous(q.data(), DType::bf16, cpu, {4, 1, 128});
  vq.strides[0] = 256;
  vq.strides[1] = 256;
  auto vk = TensorView::contiguous(k.data(), DType::bf16, cpu, {4, 2, 128});
  vk.strides[0] = 512;
  const auto vw = TensorView::contiguous(w.data(), DType::bf16, cpu, {128});
  const auto call = match_qknorm_rope(vq, vk, vw, vw, TensorView::contiguous(cache.data(), DType::f32, cpu, {8, 128}),
                                      TensorView::contiguous(pos.data(), DType::i64, cpu, {4}), {});
  EXPECT_EQ(call.head_stride, 128);
}
}  // namespace
}  // namespace ditops
