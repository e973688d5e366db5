// Hostile input through the C++ facades and the C ABI (issue 22): every case must throw
// ditops::Error (or return 1 with the message) naming the tensor and the values, before anything
// is written. docs/hostile_input.md
// lists the classes; tests/fuzz_replay covers random ones.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "core/matcher.h"
#include "ditops/c_api.h"
#include "ditops/dlpack.h"
#include "ditops/layernorm_modulate.h"
#include "ditops/norm_scale_shift.h"
#include "ditops/op.h"
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
  for (int i = 0; i < 64; ++i) p.q.as<uint16_t>()[i] = 0x3C00;  // the valid call above wrote q
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
  t.strides[0] = int64_t{1} << 53;  // 2^55 bytes per step: two steps span 2^56 bytes and more
  expect_error([&] { Matcher("op").tensor("x", t); }, {"x spans more than 2^56 bytes"});
  t.strides[0] = (int64_t{1} << 54) + 1;  // one step is beyond 2^56 bytes
  expect_error([&] { Matcher("op").tensor("x", t); }, {"x.stride(0) = 18014398509481985 is beyond 2^56 bytes"});
  t.strides[0] = INT64_MIN;
  expect_error([&] { Matcher("op").tensor("x", t); }, {"x.stride(0) = -9223372036854775808 is beyond 2^56 bytes"});
  t = TensorView::contiguous(b.words.data(), DType::f32, kCpu, {int64_t{1} << 32, int64_t{1} << 32});
  t.strides[0] = t.strides[1] = 0;  // a broadcast: the span is one element, the count is 2^64
  expect_error([&] { Matcher("op").tensor("x", t); }, {"x has more than 2^48 elements"});
  t.shape[0] = int64_t{1} << 24, t.shape[1] = int64_t{1} << 24;  // 2^48 exactly: accepted
  EXPECT_NO_THROW(Matcher("op").tensor("x", t));

  // An empty view must still describe one that could exist, its zero extents counted as 1: the
  // op checks after matching add and multiply its other extents and strides (CI's libFuzzer run
  // found qknorm_rope adding two empty tensors' head counts of ~7e18).
  t = TensorView::contiguous(nullptr, DType::f32, kCpu, {int64_t{1} << 40, int64_t{1} << 40, 0});
  expect_error([&] { Matcher("op").tensor("x", t); }, {"x has more than 2^48 elements (counting zero extents as 1)"});
  t = TensorView::contiguous(nullptr, DType::f32, kCpu, {4, 0});
  t.strides[0] = int64_t{1} << 60;
  expect_error([&] { Matcher("op").tensor("x", t); }, {"x.stride(0) = 1152921504606846976 is beyond 2^56 bytes"});
  t.strides[0] = int64_t{1} << 50;  // 3 steps of 2^52 bytes: fine, though nothing is addressed
  EXPECT_NO_THROW(Matcher("op").tensor("x", t));

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
  expect_error([&] { Matcher("op").tensor("x", t); }, {"x.stride(0) = 6357378495248596991 is beyond 2^56 bytes"});

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

TEST(HostileShapes, ContiguousViewsOfHugeShapesAreDefinedAndRefused) {
  // The stride and element-count products wrap instead of overflowing (signed overflow is
  // undefined; libFuzzer's UBSan found it); the matcher refuses the view by its element count.
  Buf small(DType::f32, {4});
  const int64_t huge[2] = {int64_t{1} << 60, 64};
  const TensorView x = TensorView::contiguous(small.view.data, DType::f32, kCpu, huge, 2);
  EXPECT_EQ(x.strides[0], 64);
  (void)x.numel();
  (void)x.span_bytes();
  (void)x.is_contiguous();
  const int64_t huge3[3] = {int64_t{1} << 60, 64, 4};
  const TensorView y = TensorView::contiguous(small.view.data, DType::f32, kCpu, huge3, 3);
  expect_error([&] { residual_gate_add(y, y, y, y); }, {"residual", "more than 2^48 elements"});
}

TEST(HostileShapes, SymbolicShapeProductsThatOverflowAreErrors) {
  // The CLI's --shape and the output rules evaluate products of dims ("B*S", up128(...)).
  const std::vector<std::pair<std::string, int64_t>> dims = {{"B", int64_t{1} << 40}, {"S", int64_t{1} << 40}};
  expect_error([&] { symbolic_shape("B*S", dims); }, {"shape 'B*S': the product overflows int64"});
  expect_error([&] { symbolic_shape("up128(B*B/2*S)", dims); }, {"overflows int64"});
  const std::vector<std::pair<std::string, int64_t>> top = {{"M", std::numeric_limits<int64_t>::max()}};
  expect_error([&] { symbolic_shape("up128(M)", top); }, {"up128 overflows int64"});
  EXPECT_EQ(symbolic_shape("up128(B/1024/1024/1024)", dims), std::vector<int64_t>{1024});
}

// ---------------------------------------------------------------- the C ABI

// residual_gate_add over f32 host buffers [1, 2, 4] (gate [1, 1, 4]) through ditops_call.
struct CCall {
  float residual[8] = {1, 2, 3, 4, 5, 6, 7, 8}, update[8] = {1, 1, 1, 1, 2, 2, 2, 2}, gate[4] = {1, 2, 3, 4};
  float out[8];
  int64_t shape[3] = {1, 2, 4}, gate_shape[3] = {1, 1, 4};
  DLTensor t[4];
  const DLTensor* slots[4] = {&t[0], &t[1], &t[2], &t[3]};
  std::vector<ditops_option> options;
  char error[512];
  CCall() {
    float* data[4] = {residual, update, gate, out};
    for (int i = 0; i < 4; ++i) {
      t[i] = DLTensor{};
      t[i].data = data[i];
      t[i].device = {kDLCPU, 0};
      t[i].ndim = 3;
      t[i].dtype = {kDLFloat, 32, 1};
      t[i].shape = i == 2 ? gate_shape : shape;
    }
    for (float& v : out) v = -7;
  }
  // The return code; the message is in `error`. `out` must be untouched when the call fails.
  int call(const char* op = "residual_gate_add", size_t num_tensors = 4, const DLTensor* const* tensors = nullptr) {
    const int rc = ditops_call(op, tensors ? tensors : slots, num_tensors, options.empty() ? nullptr : options.data(),
                               options.size(), nullptr, nullptr, 0, error, sizeof error);
    if (rc != 0)
      for (float v : out) EXPECT_EQ(v, -7.0f) << "a refused call wrote out: " << error;
    return rc;
  }
};

void expect_c_error(CCall& c, std::initializer_list<const char*> parts, const char* op = "residual_gate_add",
                    size_t num_tensors = 4, const DLTensor* const* tensors = nullptr) {
  ASSERT_EQ(c.call(op, num_tensors, tensors), 1);
  const std::string what = c.error;
  for (const char* part : parts) EXPECT_NE(what.find(part), std::string::npos) << "'" << part << "' not in: " << what;
}

TEST(HostileCApi, ValidCallRuns) {
  CCall c;
  ASSERT_EQ(c.call(), 0) << c.error;
  EXPECT_STREQ(c.error, "");
  for (int i = 0; i < 8; ++i) EXPECT_EQ(c.out[i], c.residual[i] + c.update[i] * c.gate[i % 4]) << i;
}

TEST(HostileCApi, FramingIsRefusedByName) {
  CCall c;
  expect_c_error(c, {"ditops_call: op is NULL"}, nullptr);
  expect_c_error(c, {"unknown op 'nope' (known: ", "qknorm_rope", "residual_gate_add"}, "nope");
  expect_c_error(c, {"residual_gate_add: expected 4 tensors but got 3"}, "residual_gate_add", 3);
  expect_c_error(c, {"residual_gate_add: expected 4 tensors but got 0"}, "residual_gate_add", 0);
  CCall null_array;
  ASSERT_EQ(ditops_call("residual_gate_add", nullptr, 4, nullptr, 0, nullptr, nullptr, 0, null_array.error,
                        sizeof null_array.error), 1);
  EXPECT_STREQ(null_array.error, "residual_gate_add: the tensor array is NULL");
  ASSERT_EQ(ditops_call("residual_gate_add", c.slots, 4, nullptr, 2, nullptr, nullptr, 0, c.error, sizeof c.error), 1);
  EXPECT_STREQ(c.error, "residual_gate_add: the option array is NULL");
  // A NULL required tensor.
  const DLTensor* no_gate[4] = {&c.t[0], &c.t[1], nullptr, &c.t[3]};
  expect_c_error(c, {"residual_gate_add: tensor 'gate' is required"}, "residual_gate_add", 4, no_gate);
  // The message is cut to the buffer and NUL-terminated; no buffer at all is fine too.
  char small[8];
  EXPECT_EQ(ditops_call(nullptr, c.slots, 4, nullptr, 0, nullptr, nullptr, 0, small, sizeof small), 1);
  EXPECT_STREQ(small, "ditops_");
  EXPECT_EQ(ditops_call(nullptr, c.slots, 4, nullptr, 0, nullptr, nullptr, 0, nullptr, 100), 1);
  EXPECT_EQ(ditops_call(nullptr, c.slots, 4, nullptr, 0, nullptr, nullptr, 0, small, 0), 1);
}

TEST(HostileCApi, OptionsAreRefusedWithTheExpectedForm) {
  CCall c;
  c.options = {{"use_pdl", "maybe"}};
  expect_c_error(c, {"residual_gate_add: option 'use_pdl' must be true/false (or 1/0) but is 'maybe'"});
  c.options = {{"eps", "1e-5"}};
  expect_c_error(c, {"residual_gate_add: unknown option 'eps' (options: use_pdl, backend, quality)"});
  c.options = {{nullptr, "1"}};
  expect_c_error(c, {"residual_gate_add: option 0 has a NULL name or value"});
  c.options = {{"use_pdl", nullptr}};
  expect_c_error(c, {"residual_gate_add: option 0 has a NULL name or value"});
  c.options = {{"backend", "cuda"}};
  expect_c_error(c, {"unknown backend 'cuda' (expected kda, aot, jit, vendor or reference)"});
  c.options = {{"quality", "best"}};
  expect_c_error(c, {"unknown quality 'best' (expected exact, lossless or high)"});
  c.options = {{"backend", "jit"}};  // explicit: strict, and the tensors are on the CPU
  expect_c_error(c, {"residual_gate_add.jit"});
}

TEST(HostileCApi, TensorsBreakingTheImportRulesAreRefusedNamingTheSlot) {
  {
    CCall c;
    c.t[2].data = nullptr;
    expect_c_error(c, {"residual_gate_add: gate: from_dlpack: data is NULL but the tensor has 4 elements"});
  }
  {
    CCall c;
    c.t[0].byte_offset = uint64_t{1} << 62;
    expect_c_error(c, {"residual_gate_add: residual: from_dlpack: byte_offset 4611686018427387904 is larger than any "
                       "allocation"});
  }
  {
    CCall c;
    c.t[1].ndim = 9;
    expect_c_error(c, {"residual_gate_add: update: from_dlpack: rank 9 is outside [0, 8]"});
  }
  {
    CCall c;
    c.t[1].shape = nullptr;
    expect_c_error(c, {"residual_gate_add: update: from_dlpack: shape is NULL for rank 3"});
  }
  {
    CCall c;
    int64_t negative[3] = {1, -2, 4};
    c.t[3].shape = negative;
    expect_c_error(c, {"residual_gate_add: out: from_dlpack: shape[1] must be >= 0 but is -2"});
  }
  {
    CCall c;
    c.t[0].dtype = {kDLFloat, 32, 4};
    expect_c_error(c, {"residual_gate_add: residual: from_dlpack: unsupported dtype float32x4 (DLPack code 2, bits 32, "
                       "lanes 4); the dtypes ditops takes: "});
  }
  {
    CCall c;
    c.t[0].device = {7, 0};
    expect_c_error(c, {"residual_gate_add: residual: from_dlpack: unsupported device type 7"});
  }
  {
    CCall c;
    c.t[3].byte_offset = 2;  // f32 at an address 2 bytes off
    expect_c_error(c, {"out.data must be aligned to its element size (4 bytes for f32)"});
  }
  {
    CCall c;  // in place (out = residual) is refused, residual untouched
    const DLTensor* in_place[4] = {&c.t[0], &c.t[1], &c.t[2], &c.t[0]};
    expect_c_error(c, {"out must not overlap residual"}, "residual_gate_add", 4, in_place);
    EXPECT_EQ(c.residual[0], 1.0f);
  }
  {
    CCall c;  // the gate of the wrong width: names the tensor, the dim, expected and actual
    int64_t wide[3] = {1, 1, 5};
    c.t[2].shape = wide;
    expect_c_error(c, {"gate", "5", "4"});
  }
}

TEST(HostileCApi, OutOfRangeEnumsAndNumbersAreRefused) {
  // qknorm_rope's options through the C ABI: the issue's rounding = 7, norm_order = -1.
  QkProblem p(1, 4);
  auto dl = [](Buf& b, DLDataType dtype) {
    DLTensor d{};
    d.data = b.view.data;
    d.device = {kDLCPU, 0};
    d.ndim = b.view.rank;
    d.shape = b.view.shape;
    d.dtype = dtype;
    return d;
  };
  DLTensor q = dl(p.q, {kDLFloat, 16, 1}), k = dl(p.k, {kDLFloat, 16, 1}), qw = dl(p.qw, {kDLFloat, 16, 1}),
           kw = dl(p.kw, {kDLFloat, 16, 1}), cache = dl(p.cache, {kDLFloat, 32, 1}), pos = dl(p.pos, {kDLInt, 64, 1});
  const DLTensor* slots[6] = {&q, &k, &qw, &kw, &cache, &pos};
  char error[512];
  auto run = [&](const char* name, const char* value) {
    const ditops_option o{name, value};
    const int rc = ditops_call("qknorm_rope", slots, 6, &o, 1, nullptr, nullptr, 0, error, sizeof error);
    return rc == 0 ? std::string() : std::string(error);
  };
  EXPECT_EQ(run("rounding", "rounded"), "");
  EXPECT_EQ(run("rounding", "7"), "qknorm_rope: unknown rounding '7' (expected rounded or fp32)");
  EXPECT_EQ(run("norm_order", "-1"), "qknorm_rope: unknown norm_order '-1' (expected aten or warp or aten_mean)");
  EXPECT_EQ(run("norm_weight_rounding", "2"),
            "qknorm_rope: unknown norm_weight_rounding '2' (expected once or twice)");
  EXPECT_EQ(run("rope_dim", "99999999999999999999"),
            "qknorm_rope: option 'rope_dim' must be an integer but is '99999999999999999999'");
  EXPECT_EQ(run("rope_dim", "4294967296"), "qknorm_rope: option 'rope_dim' must fit 32 bits but is 4294967296");
  EXPECT_EQ(run("eps", "nan"), "qknorm_rope: option 'eps' must be a finite number but is 'nan'");
  EXPECT_EQ(run("eps", "1e400"), "qknorm_rope: option 'eps' must be a finite number but is '1e400'");
  EXPECT_EQ(run("is_neox", ""), "qknorm_rope: option 'is_neox' must be true/false (or 1/0) but is ''");
  // A position outside the cache: checked on the host before q or k is written.
  for (int i = 0; i < 64; ++i) p.q.as<uint16_t>()[i] = 0x3C00;  // the valid call above wrote q
  p.set_position(0, 100000000);
  EXPECT_EQ(run("rounding", "rounded"), "qknorm_rope: positions[0] = 100000000 is outside the cos_sin_cache rows [0, 4)");
  EXPECT_EQ(p.q.as<uint16_t>()[0], 0x3C00);
}

}  // namespace
