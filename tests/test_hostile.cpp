// Hostile input through the C++ facades (issue 22): every case must throw ditops::Error with a
// message naming the tensor and the values, before anything is written. docs/hostile_input.md
// lists the classes; tests/fuzz_replay covers random ones.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/matcher.h"
#include "ditops/layernorm_modulate.h"
#include "ditops/norm_scale_shift.h"
#include "ditops/qknorm_rope.h"
#include "ditops/residual_gate_add.h"

namespace {

using namespace ditops;

const Device kCpu{DeviceKind::cpu, 0};

// Host memory (16-byte aligned) with a contiguous view over it.
struct Buf {
  std::vector<uint64_t> words;
  TensorView view;
  Buf(DType dtype, std::vector<int64_t> shape) {
    int64_t n = 1;
    for (int64_t s : shape) n *= s > 0 ? s : 1;
    words.assign(static_cast<size_t>((n * static_cast<int64_t>(dtype_size(dtype)) + 15) / 16 * 2 + 2), 0);
    view = TensorView::contiguous(words.data(), dtype, kCpu, shape);
  }
  template <typename T>
  T* as() { return reinterpret_cast<T*>(words.data()); }
};

// Runs `f`, which must throw ditops::Error whose message contains every one of `parts`.
void expect_error(const std::function<void()>& f, std::initializer_list<const char*> parts) {
  try {
    f();
  } catch (const Error& e) {
    const std::string what = e.what();
    for (const char* part : parts) EXPECT_NE(what.find(part), std::string::npos) << "'" << part << "' not in: " << what;
    return;
  }
  ADD_FAILURE() << "no ditops::Error thrown (expected one containing '" << *parts.begin() << "')";
}

// The issue's repro: q ones [1,1,64] f16, cache [4,64] f32, one position.
struct QkProblem {
  int64_t T, P;
  Buf q, k, qw, kw, cache, pos;
  QkProblem(int64_t tokens, int64_t cache_rows, DType pos_dtype = DType::i64)
      : T(tokens), P(cache_rows), q(DType::f16, {tokens, 1, 64}), k(DType::f16, {tokens, 1, 64}),
        qw(DType::f16, {64}), kw(DType::f16, {64}), cache(DType::f32, {cache_rows, 64}), pos(pos_dtype, {tokens}) {
    for (int64_t i = 0; i < tokens * 64; ++i) q.as<uint16_t>()[i] = k.as<uint16_t>()[i] = 0x3C00;  // 1.0
    for (int i = 0; i < 64; ++i) qw.as<uint16_t>()[i] = kw.as<uint16_t>()[i] = 0x3C00;
  }
  void set_position(int64_t t, int64_t v) {
    if (pos.view.dtype == DType::i64) pos.as<int64_t>()[t] = v;
    else pos.as<int32_t>()[t] = static_cast<int32_t>(v);
  }
  std::string run() { return qknorm_rope(q.view, k.view, qw.view, kw.view, cache.view, pos.view); }
};

TEST(HostileQkNormRope, PositionsOutsideTheCacheAreRefusedBeforeAnyWrite) {
  for (int64_t bad : {int64_t{100000000}, int64_t{-100000000}, int64_t{1} << 40, int64_t{4}, int64_t{1000},
                      int64_t{-1}}) {
    QkProblem p(3, 4);
    p.set_position(0, 1);
    p.set_position(1, 3);
    p.set_position(2, bad);
    const std::vector<uint64_t> q0 = p.q.words, k0 = p.k.words;
    const std::string value = std::to_string(bad);
    expect_error([&] { p.run(); }, {"qknorm_rope", "positions[2]", ("= " + value).c_str(), "[0, 4)"});
    EXPECT_EQ(p.q.words, q0) << "q was written before the bad position was found";
    EXPECT_EQ(p.k.words, k0);
  }
}

TEST(HostileQkNormRope, BadPositionsDoNotMarkTheReferenceFailed) {
  // An argument error is the caller's: it reaches the caller as InvalidArgument, and the next
  // call with the same key still runs the reference.
  QkProblem p(1, 4);
  p.set_position(0, 9);
  EXPECT_THROW(p.run(), InvalidArgument);
  EXPECT_THROW(p.run(), InvalidArgument);
  p.set_position(0, 2);
  EXPECT_EQ(p.run(), "qknorm_rope.reference");
}

TEST(HostileQkNormRope, IssueReproThrowsInsteadOfCrashing) {
  QkProblem p(1, 4);
  p.set_position(0, 100000000);
  expect_error([&] { p.run(); }, {"positions[0] = 100000000 is outside the cos_sin_cache rows [0, 4)"});
}

TEST(HostileQkNormRope, Int32PositionsAreCheckedToo) {
  QkProblem p(2, 4, DType::i32);
  p.set_position(0, 2);
  p.set_position(1, -7);
  expect_error([&] { p.run(); }, {"positions[1] = -7", "[0, 4)"});
  p.set_position(1, 3);
  EXPECT_EQ(p.run(), "qknorm_rope.reference");
}

TEST(HostileQkNormRope, StridedPositionsAreCheckedAtTheirStride) {
  QkProblem p(2, 4);
  Buf wide(DType::i64, {4});
  wide.as<int64_t>()[0] = 1;
  wide.as<int64_t>()[1] = 999;  // skipped by the stride
  wide.as<int64_t>()[2] = 5;
  p.pos.view = wide.view;
  p.pos.view.shape[0] = 2;
  p.pos.view.strides[0] = 2;
  expect_error([&] { p.run(); }, {"positions[1] = 5", "[0, 4)"});
  wide.as<int64_t>()[2] = 3;
  EXPECT_EQ(p.run(), "qknorm_rope.reference");
}

TEST(HostileQkNormRope, EmptyCacheIsRefusedWhenThereAreTokens) {
  QkProblem p(1, 0);
  expect_error([&] { p.run(); }, {"cos_sin_cache.shape[0] must be >= 1", "is 0", "T=1"});
  QkProblem empty(0, 0);  // no tokens: nothing is read, a no-op
  EXPECT_EQ(empty.run(), "qknorm_rope.reference");
}

TEST(HostileQkNormRope, ReadInputsOverlappingQOrKAreRefused) {
  {
    // positions a view of q's memory: q is written, then positions were read (the SIGSEGV).
    QkProblem p(2, 4);
    TensorView pos = TensorView::contiguous(p.q.words.data(), DType::i64, kCpu, {2});
    expect_error([&] { qknorm_rope(p.q.view, p.k.view, p.qw.view, p.kw.view, p.cache.view, pos); },
                 {"positions overlaps q in memory", "q is written while positions is read"});
  }
  {
    QkProblem p(2, 4);
    TensorView w = TensorView::contiguous(static_cast<char*>(p.k.view.data) + 128, DType::f16, kCpu, {64});
    expect_error([&] { qknorm_rope(p.q.view, p.k.view, w, p.kw.view, p.cache.view, p.pos.view); },
                 {"q_weight overlaps k"});
    expect_error([&] { qknorm_rope(p.q.view, p.k.view, p.qw.view, w, p.cache.view,
                                   p.pos.view); },
                 {"k_weight overlaps k"});
  }
  {
    QkProblem p(1, 4);
    Buf big(DType::f32, {4, 64});
    TensorView q = TensorView::contiguous(big.words.data(), DType::f16, kCpu, {1, 1, 64});
    expect_error([&] { qknorm_rope(q, p.k.view, p.qw.view, p.kw.view, big.view, p.pos.view); },
                 {"cos_sin_cache overlaps q"});
  }
}

// ---- negative extents through every op's facade ----

TEST(HostileShapes, NegativeExtentIsRefusedByEveryFacade) {
  {
    QkProblem p(1, 4);
    TensorView q = p.q.view;
    q.shape[0] = -1;
    expect_error([&] { qknorm_rope(q, p.k.view, p.qw.view, p.kw.view, p.cache.view, p.pos.view); },
                 {"qknorm_rope: q.shape[0] must be >= 0 but is -1"});
    TensorView pos = p.pos.view;
    pos.shape[0] = -5;
    expect_error([&] { qknorm_rope(p.q.view, p.k.view, p.qw.view, p.kw.view, p.cache.view, pos); },
                 {"positions.shape[0] must be >= 0 but is -5"});
    TensorView cache = p.cache.view;
    cache.shape[0] = -4;
    expect_error([&] { qknorm_rope(p.q.view, p.k.view, p.qw.view, p.kw.view, cache, p.pos.view); },
                 {"cos_sin_cache.shape[0] must be >= 0 but is -4"});
  }
  {
    Buf r(DType::bf16, {2, 8}), u(DType::bf16, {2, 8}), g(DType::bf16, {2, 8}), o(DType::bf16, {2, 8});
    TensorView rv = r.view, uv = u.view, ov = o.view;
    rv.shape[0] = uv.shape[0] = ov.shape[0] = -2;
    expect_error([&] { residual_gate_add(rv, uv, g.view, ov); },
                 {"residual_gate_add: residual.shape[0] must be >= 0 but is -2"});
    TensorView gv = g.view;
    gv.shape[1] = -8;
    expect_error([&] { residual_gate_add(r.view, u.view, gv, o.view); }, {"gate.shape[1] must be >= 0 but is -8"});
  }
  {
    Buf x(DType::bf16, {1, 2, 8}), s(DType::bf16, {1, 8}), sh(DType::bf16, {1, 8}), o(DType::bf16, {1, 2, 8});
    TensorView xv = x.view;
    xv.shape[1] = -2;
    expect_error([&] { layernorm_modulate(xv, s.view, sh.view, o.view); },
                 {"layernorm_modulate: x.shape[1] must be >= 0 but is -2"});
    TensorView sv = s.view;
    sv.shape[1] = -8;
    Buf isc(DType::f32, {1}), o8(DType::f8e4m3fn, {1, 2, 8});
    expect_error([&] { layernorm_modulate_fp8(x.view, sv, sh.view, isc.view, o8.view); },
                 {"layernorm_modulate_fp8: scale.shape[1] must be >= 0 but is -8"});
    TensorView iv = isc.view;
    iv.shape[0] = -1;
    expect_error([&] { layernorm_modulate_fp8(x.view, s.view, sh.view, iv, o8.view); },
                 {"input_scale.shape[0] must be >= 0 but is -1"});
  }
  {
    Buf q(DType::bf16, {1, 2, 2, 8}), k(DType::bf16, {1, 2, 1, 8}), qo(DType::bf16, {1, 2, 2, 8}),
        ko(DType::bf16, {1, 2, 1, 8});
    TensorView kv = k.view;
    kv.shape[2] = -1;
    expect_error([&] { qk_head_layernorm(q.view, kv, qo.view, ko.view); },
                 {"qk_head_layernorm: k.shape[2] must be >= 0 but is -1"});
  }
  {
    Buf x(DType::bf16, {1, 2, 16}), s(DType::bf16, {16}), y(DType::bf16, {1, 2, 16});
    NormScaleShiftInputs in;
    in.x = x.view;
    in.scale = s.view;
    NormScaleShiftOutputs out;
    out.y = y.view;
    in.x.shape[0] = -1;
    expect_error([&] { norm_scale_shift(in, out); }, {"norm_scale_shift: x.shape[0] must be >= 0 but is -1"});
    in.x = x.view;
    in.scale.shape[0] = -16;
    expect_error([&] { norm_scale_shift(in, out); }, {"scale.shape[0] must be >= 0 but is -16"});
    in.scale = s.view;
    out.y.shape[2] = -16;
    expect_error([&] { norm_scale_shift(in, out); }, {"y.shape[2] must be >= 0 but is -16"});
  }
}

// ---- what Matcher::tensor checks for every view ----

TEST(HostileShapes, MatcherRefusesBadRankNullDataAndOverflowingSpans) {
  Buf b(DType::f32, {4});
  TensorView t = b.view;
  t.rank = 9;
  expect_error([&] { Matcher("op").tensor("x", t); }, {"op: x must have rank in [0, 8] but has rank 9"});
  t.rank = -1;
  expect_error([&] { Matcher("op").tensor("x", t); }, {"has rank -1"});

  t = b.view;
  t.data = nullptr;
  expect_error([&] { Matcher("op").tensor("x", t); }, {"x.data is NULL but x has 4 elements"});
  t.shape[0] = 0;
  EXPECT_NO_THROW(Matcher("op").tensor("x", t));  // an empty view may have no memory

  t = TensorView::contiguous(b.words.data(), DType::f32, kCpu, {3, 2});
  t.strides[0] = (int64_t{1} << 61) - 1;  // about 2^62 elements of 4 bytes
  expect_error([&] { Matcher("op").tensor("x", t); }, {"x spans more than 2^63 bytes"});
  t.shape[0] = 6;
  expect_error([&] { Matcher("op").tensor("x", t); }, {"x spans more than 2^63 elements"});
  t.strides[0] = INT64_MIN;
  expect_error([&] { Matcher("op").tensor("x", t); }, {"x.stride(0) = -9223372036854775808 overflows int64 in bytes"});
  t = TensorView::contiguous(b.words.data(), DType::f32, kCpu, {int64_t{1} << 32, int64_t{1} << 32});
  t.strides[0] = t.strides[1] = 0;  // a broadcast: the span is one element, the count is 2^64
  expect_error([&] { Matcher("op").tensor("x", t); }, {"x has more than 2^63 elements"});

  t = b.view;
  t.data = b.as<uint8_t>() + 2;  // not on a 4-byte boundary
  expect_error([&] { Matcher("op").tensor("x", t); }, {"x.data must be aligned to its element size (4 bytes for f32)"});
  {
    // Found by the fuzzer: the CPU reference read bf16 at an odd address.
    Buf x(DType::bf16, {1, 2, 8}), s(DType::bf16, {1, 8}), o(DType::bf16, {1, 2, 8});
    TensorView xv = x.view;
    xv.data = x.as<uint8_t>() + 1;
    expect_error([&] { layernorm_modulate(xv, s.view, TensorView{}, o.view); },
                 {"layernorm_modulate: x.data must be aligned to its element size (2 bytes for bf16)"});
  }

  t = TensorView::contiguous(b.words.data(), DType::bf16, kCpu, {1, 4});
  t.strides[0] = int64_t{6357378495248596991};  // extent 1: addresses nothing, but * 2 bytes overflows
  expect_error([&] { Matcher("op").tensor("x", t); }, {"x.stride(0) = 6357378495248596991 overflows int64 in bytes"});

  t = b.view;
  t.dtype = static_cast<DType>(200);
  expect_error([&] { Matcher("op").tensor("x", t); }, {"x.dtype is not a ditops dtype (code 200)"});
}

TEST(HostileShapes, ByteRangeCountsNegativeStrides) {
  Buf b(DType::f32, {8});
  TensorView t = TensorView::contiguous(b.as<float>() + 7, DType::f32, kCpu, {4});
  t.strides[0] = -2;  // elements 7, 5, 3, 1
  const ByteRange r = byte_range(t);
  EXPECT_EQ(r.lo, reinterpret_cast<uintptr_t>(b.as<float>() + 1));
  EXPECT_EQ(r.hi, reinterpret_cast<uintptr_t>(b.as<float>() + 8));
  const TensorView first = TensorView::contiguous(b.as<float>(), DType::f32, kCpu, {1});
  const TensorView second = TensorView::contiguous(b.as<float>() + 1, DType::f32, kCpu, {1});
  EXPECT_FALSE(memory_overlaps(t, first));
  EXPECT_TRUE(memory_overlaps(t, second));
  t.shape[0] = 0;
  EXPECT_FALSE(memory_overlaps(t, second));
}

}  // namespace
