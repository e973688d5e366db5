// residual_gate_add beyond its driver cases (tests/cases/residual_gate_add_cases.cpp: every shape,
// layout, dtype, overlap and invalid input against the float64 oracle and the reference): what the
// matcher decides (gate modes, alignment, the transposed residual's chunks), explain on the CPU, the
// C ABI, and the kernel keys: their schedules, the fast division, the params' layout and NVRTC
// compiling every key for every target arch (no GPU needed).
#include <gtest/gtest.h>

#include <cstddef>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ditops/c_api.h"
#include "ditops/residual_gate_add.h"
#include "jit/kernel_request.h"
#include "jit/jit.h"
#include "jit/nvrtc.h"
#include "kernels/common/fast_divide.h"
#include "kernels/residual_gate_add.cuh"
#include "ops/residual_gate_add/residual_gate_add_kernels.h"
#include "reference/half.h"

namespace {

using namespace ditops;

const Device kCpu{DeviceKind::cpu, 0};

// ---- host tensors ----
struct HostTensor {
  std::vector<uint8_t> bytes;
  TensorView view;
  HostTensor(DType dtype, std::vector<int64_t> shape, size_t storage_elems = 0) {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    const size_t elems = storage_elems ? storage_elems : static_cast<size_t>(n);
    bytes.assign(elems * dtype_size(dtype) + 16, 0);
    view = TensorView::contiguous(bytes.data(), dtype, kCpu, shape);
  }
  float get(int64_t i) const { return ref::load_act(view.data, i, view.dtype); }
  void set(int64_t i, float v) { ref::store_act(view.data, i, view.dtype, v); }
  int64_t storage() const { return static_cast<int64_t>((bytes.size() - 16) / dtype_size(view.dtype)); }
  void fill(std::mt19937& rng, float scale) {
    std::normal_distribution<float> normal(0.0f, scale);
    for (int64_t i = 0; i < storage(); ++i) set(i, normal(rng));
  }
  uint32_t bits(int64_t i) const {
    const size_t s = dtype_size(view.dtype);
    uint32_t b = 0;
    std::memcpy(&b, bytes.data() + i * s, s);
    return b;
  }
};

// ---- classification and matching ----

TEST(ResidualGateAddMatch, GateModesAndAlignment) {
  auto classify = [](std::vector<int64_t> s, std::vector<int64_t> gs) {
    HostTensor r(DType::bf16, s), u(DType::bf16, s), g(DType::bf16, gs), o(DType::bf16, s);
    return match_residual_gate_add(r.view, u.view, g.view, o.view);
  };
  EXPECT_EQ(classify({1, 1, 65}, {1, 1, 65}).gate_mode, GateMode::full);  // full wins over row
  EXPECT_EQ(classify({4, 1}, {4, 1}).gate_mode, GateMode::full);          // and over per-token
  EXPECT_EQ(classify({1, 1024, 4096}, {1, 1, 4096}).gate_mode, GateMode::row);
  EXPECT_EQ(classify({1, 2560, 512}, {1, 2560, 1}).gate_mode, GateMode::token);
  const auto batch = classify({2, 33, 65}, {2, 1, 65});
  EXPECT_EQ(batch.gate_mode, GateMode::batch);
  EXPECT_EQ(batch.rows_per_batch, 33);
  for (DType dt : {DType::bf16, DType::f16, DType::f32}) {  // every dtype classifies alike
    HostTensor r(dt, {2, 33, 65}), u(dt, {2, 33, 65}), g(dt, {2, 33, 1}), o(dt, {2, 33, 65});
    const ResidualGateAddCall token = match_residual_gate_add(r.view, u.view, g.view, o.view);
    EXPECT_EQ(token.gate_mode, GateMode::token) << dtype_name(dt);
    EXPECT_FALSE(token.transposed);
    EXPECT_FALSE(token.gate_f32);
  }
  // Transposed [B, T, H] as strides (T H, 1, T): tokens and hidden read through them.
  {
    HostTensor r(DType::bf16, {2, 128, 33}), u(DType::bf16, {2, 33, 128}), g(DType::bf16, {2, 1, 128}),
        o(DType::bf16, {2, 128, 33});
    for (HostTensor* t : {&r, &o}) {
      t->view.shape[1] = 33;
      t->view.shape[2] = 128;
      t->view.strides[1] = 1;
      t->view.strides[2] = 33;
    }
    const ResidualGateAddCall call = match_residual_gate_add(r.view, u.view, g.view, o.view);
    EXPECT_TRUE(call.transposed);
    EXPECT_EQ(call.gate_mode, GateMode::batch);
    EXPECT_EQ(call.tokens, 33);
    EXPECT_EQ(call.hidden, 128);
  }
  // An f32 gate beside 16-bit data: the promoted chain, a chunk of [B, S, 6, D] per token strided.
  {
    HostTensor r(DType::f16, {2, 33, 72}), u(DType::f16, {2, 33, 72}), o(DType::f16, {2, 33, 72}),
        g(DType::f32, {2 * 33 * 6 * 72});
    TensorView chunk = TensorView::contiguous(static_cast<float*>(g.view.data) + 5 * 72, DType::f32, kCpu, {2, 33, 72});
    chunk.strides[0] = 33 * 6 * 72;
    chunk.strides[1] = 6 * 72;
    const ResidualGateAddCall call = match_residual_gate_add(r.view, u.view, chunk, o.view);
    EXPECT_TRUE(call.gate_f32);
    EXPECT_EQ(call.gate_mode, GateMode::strided);
    EXPECT_EQ(call.gate_row_stride, 6 * 72);
  }
  const auto frames = classify({2, 3, 4, 5, 8}, {2, 3, 1, 1, 8});
  EXPECT_EQ(frames.gate_mode, GateMode::batch);
  EXPECT_EQ(frames.rows_per_batch, 20);
  EXPECT_EQ(frames.rows, 2 * 3 * 4 * 5);
  // Vector path: D a multiple of 8 (16-bit) and every pointer 16-byte aligned.
  EXPECT_FALSE(classify({1, 17, 65}, {1, 1, 65}).aligned16);
  HostTensor r(DType::bf16, {4, 64}, 4 * 64 + 8), u(DType::bf16, {4, 64}), g(DType::bf16, {1, 64}),
      o(DType::bf16, {4, 64});
  r.view.data = r.bytes.data() + (16 - reinterpret_cast<uintptr_t>(r.bytes.data()) % 16) % 16;
  const bool aligned_all = reinterpret_cast<uintptr_t>(u.view.data) % 16 == 0 &&
                           reinterpret_cast<uintptr_t>(g.view.data) % 16 == 0 &&
                           reinterpret_cast<uintptr_t>(o.view.data) % 16 == 0;
  EXPECT_EQ(match_residual_gate_add(r.view, u.view, g.view, o.view).aligned16, aligned_all);
  r.view.data = static_cast<char*>(r.view.data) + 2;  // one bf16 element off
  EXPECT_FALSE(match_residual_gate_add(r.view, u.view, g.view, o.view).aligned16);
}

// A transposed residual whose lines cannot all start on 16 bytes (odd T, or residual off 16 bytes)
// is walked by aligned 16-byte chunks when the update side is 16-byte and out shares residual's
// offset within 16 bytes; otherwise it stays on the scalar residual side.
TEST(ResidualGateAddMatch, TransposedResidualTakesAlignedChunksWhenOutSharesItsOffset) {
  auto place = [](HostTensor& t, size_t offset_bytes) {  // 16-byte aligned start + offset_bytes
    const auto base = reinterpret_cast<uintptr_t>(t.bytes.data());
    t.view.data = t.bytes.data() + (16 - base % 16) % 16 + offset_bytes;
  };
  auto transposed = [](HostTensor& t, int64_t T, int64_t H) {
    t.view.shape[1] = T;
    t.view.shape[2] = H;
    t.view.strides[1] = 1;
    t.view.strides[2] = T;
  };
  for (int64_t T : {33, 32}) {
    const int64_t H = 64;
    HostTensor r(DType::bf16, {1, H, T}, H * T + 16), u(DType::bf16, {1, T, H}, T * H + 16),
        g(DType::bf16, {1, 1, H}, H + 16), o(DType::bf16, {1, H, T}, H * T + 16);
    transposed(r, T, H);
    transposed(o, T, H);
    for (auto [r_off, o_off] : {std::pair<size_t, size_t>{0, 0}, {2, 2}, {2, 0}, {0, 6}}) {
      place(r, r_off);
      place(o, o_off);
      place(u, 0);
      place(g, 0);
      const ResidualGateAddCall call = match_residual_gate_add(r.view, u.view, g.view, o.view);
      SCOPED_TRACE("T " + std::to_string(T) + ", residual +" + std::to_string(r_off) + " B, out +" +
                   std::to_string(o_off) + " B");
      EXPECT_TRUE(call.transposed);
      EXPECT_TRUE(call.update_aligned16);
      const bool all_aligned = T % 8 == 0 && r_off == 0 && o_off == 0;
      EXPECT_EQ(call.aligned16, all_aligned);
      EXPECT_EQ(call.residual_chunks16, !all_aligned && r_off == o_off);
    }
    place(r, 0);
    place(o, 0);
    place(u, 2);  // a scalar update side: no chunks either
    const ResidualGateAddCall scalar_update = match_residual_gate_add(r.view, u.view, g.view, o.view);
    EXPECT_FALSE(scalar_update.update_aligned16);
    EXPECT_FALSE(scalar_update.residual_chunks16);
  }
}

std::string error_of(const TensorView& r, const TensorView& u, const TensorView& g, const TensorView& o) {
  try {
    residual_gate_add(r, u, g, o);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ResidualGateAddMatch, ExplainListsEveryCandidateWithItsReason) {
  HostTensor r(DType::bf16, {1, 17, 65}), u(DType::bf16, {1, 17, 65}), g(DType::bf16, {1, 1, 65}),
      o(DType::bf16, {1, 17, 65});
  const DispatchReport report = explain_residual_gate_add(match_residual_gate_add(r.view, u.view, g.view, o.view));
  ASSERT_NE(report.chosen, nullptr);
  EXPECT_EQ(report.chosen->name, "residual_gate_add.reference");
  bool saw_jit = false, saw_ref = false;
  for (const auto& c : report.candidates) {
    if (c.name == "residual_gate_add.jit") {
      saw_jit = true;
      EXPECT_FALSE(c.eligible);
      EXPECT_FALSE(c.reason.empty());
    }
    if (c.name == "residual_gate_add.reference") saw_ref = c.chosen;
  }
  EXPECT_TRUE(saw_jit);
  EXPECT_TRUE(saw_ref);
  const std::string text = report.format();
  EXPECT_NE(text.find("residual_gate_add.jit"), std::string::npos) << text;
  EXPECT_NE(text.find("residual_gate_add.reference"), std::string::npos) << text;
  // Requesting the jit backend explicitly for CPU tensors fails loudly.
  ResidualGateAddOptions opt;
  opt.dispatch.backend = Provenance::jit;
  EXPECT_THROW(residual_gate_add(r.view, u.view, g.view, o.view, opt), Error);
}

TEST(ResidualGateAddCApi, RunsAndReportsErrors) {
  std::mt19937 rng(11);
  HostTensor r(DType::f16, {3, 40}), u(DType::f16, {3, 40}), g(DType::f16, {3, 1}), o(DType::f16, {3, 40});
  r.fill(rng, 1.0f);
  u.fill(rng, 1.0f);
  g.fill(rng, 1.0f);
  auto dl = [](HostTensor& t, int64_t* shape, int64_t* strides) {
    DLTensor d{};
    d.data = t.view.data;
    d.device = {kDLCPU, 0};
    d.ndim = t.view.rank;
    d.dtype = {kDLFloat, 16, 1};
    for (int i = 0; i < t.view.rank; ++i) {
      shape[i] = t.view.shape[i];
      strides[i] = t.view.strides[i];
    }
    d.shape = shape;
    d.strides = strides;
    return d;
  };
  int64_t s[4][2], st[4][2];
  DLTensor dr = dl(r, s[0], st[0]), du = dl(u, s[1], st[1]), dg = dl(g, s[2], st[2]), dout = dl(o, s[3], st[3]);
  char impl[64], err[512];
  // The generic entry, in the op table's slot order (residual, update, gate, out).
  const DLTensor* slots[] = {&dr, &du, &dg, &dout};
  ASSERT_EQ(ditops_call("residual_gate_add", slots, 4, nullptr, 0, nullptr, impl, sizeof impl, err, sizeof err), 0)
      << err;
  EXPECT_STREQ(impl, "residual_gate_add.reference");
  HostTensor want(DType::f16, {3, 40});  // the C++ facade's result on the same inputs
  residual_gate_add(r.view, u.view, g.view, want.view);
  EXPECT_EQ(o.bytes, want.bytes);
  const DLTensor* aliased[] = {&dr, &du, &dg, &dr};
  EXPECT_EQ(ditops_call("residual_gate_add", aliased, 4, nullptr, 0, nullptr, impl, sizeof impl, err, sizeof err), 1);
  EXPECT_NE(std::string(err).find("out must not overlap residual"), std::string::npos) << err;
  char report[4096];
  ASSERT_EQ(ditops_explain("residual_gate_add", slots, 4, nullptr, 0, report, sizeof report, err, sizeof err), 0);
  EXPECT_NE(std::string(report).find("residual_gate_add.reference"), std::string::npos);
}

// ---- every kernel key compiles with NVRTC for every target arch (no GPU needed) ----

TEST(ResidualGateAddJit, EveryKernelKeyCompilesForEveryTargetArch) {
  std::string why;
  if (jit::nvrtc_version(&why) == 0) GTEST_SKIP() << "NVRTC not loadable here: " << why;
  std::vector<RgaKernelKey> keys;
  for (DType dt : {DType::bf16, DType::f16, DType::f32})
    for (GateMode mode : {GateMode::full, GateMode::row, GateMode::token, GateMode::batch})
      for (bool vector : {true, false})
        for (int tile : {0, 16, 32, 64}) {
          if (tile == 16 && vector) continue;  // 16-tiles: the scalar path only
          RgaKernelKey k;
          k.dtype = dt;
          k.mode = mode;
          k.vector = vector;
          k.transposed = tile != 0;
          k.tile = tile;
          keys.push_back(k);
          if (tile == 0 && dt == DType::bf16) {  // the flat kernel of 64-bit indices
            RgaKernelKey wide = k;
            wide.index64 = true;
            keys.push_back(wide);
          }
          if (tile == 0 && !vector) {  // the scalar flat kernel of one element per thread
            k.one_wave = true;
            keys.push_back(k);
          }
          if (tile == 64 && vector && dt != DType::f32) {  // the tall tile: 128 tokens x 64 channels
            RgaKernelKey tall = k;
            tall.vector_update = true;
            tall.token_tile = 128;
            keys.push_back(tall);
          }
          if (tile != 0 && !vector) {  // scalar residual side, 16-byte update side
            k.vector_update = true;
            keys.push_back(k);
            if (tile != 16) {  // the residual side by the aligned 16-byte chunks of each line
              k.chunked_residual = true;
              keys.push_back(k);
            }
          }
        }
  int compiled = 0;
  for (const char* arch : {"sm_90a", "sm_100a", "sm_120a"})
    for (const auto& key : keys) {
      const auto request = rga_kernel_request(key);
      std::vector<uint8_t> cubin;
      ASSERT_NO_THROW(cubin = jit::nvrtc_compile(jit::wrapper_source(request, "ditops_entry"), "rga_entry.cu", arch,
                                                 jit::embedded_sources()))
          << key.to_string() << " for " << arch;
      ASSERT_GT(cubin.size(), 1000u);
      EXPECT_EQ(cubin[0], 0x7f);
      ++compiled;
    }
  std::printf("compiled %d (key, arch) pairs\n", compiled);
}

// The flat kernel's measured schedule reaches the kernel: one 16-byte unit per thread (a grid over
// the whole tensor), 8 single elements on the scalar path; the transposed kernel takes no units.
TEST(ResidualGateAddJit, FlatKernelUnitsFollowTheMeasuredSchedule) {
  RgaKernelKey k;
  k.dtype = DType::bf16;
  k.mode = GateMode::row;
  k.vector = true;
  EXPECT_EQ(rga_flat_units(k), 1);
  EXPECT_NE(rga_kernel_request(k).template_args.find(", 1, false"), std::string::npos)
      << rga_kernel_request(k).template_args;
  k.vector = false;
  EXPECT_EQ(rga_flat_units(k), 8);
  EXPECT_NE(rga_kernel_request(k).template_args.find(", 8, false"), std::string::npos);
  k.one_wave = true;
  EXPECT_EQ(rga_flat_units(k), 1) << "a scalar call one wave of threads covers: one element per thread";
  EXPECT_NE(rga_kernel_request(k).template_args.find(", 1, false"), std::string::npos);
  RgaKernelKey eight_units = k;
  eight_units.one_wave = false;
  EXPECT_NE(k.packed(), eight_units.packed());
  EXPECT_NE(k.to_string(), eight_units.to_string());
  k.one_wave = false;
  k.transposed = true;
  k.tile = 32;
  EXPECT_EQ(rga_kernel_request(k).template_args.find(", 8, false"), std::string::npos)
      << "the transposed kernel has no units parameter";
  // Its last two arguments are kVectorUpdate (with the vector path, or alone on a scalar residual
  // side) and kChunkedResidual.
  auto ends_with = [](const std::string& s, const std::string& tail) {
    return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
  };
  k.pdl = false;
  EXPECT_TRUE(ends_with(rga_kernel_request(k).template_args, "32, false, false, false")) << rga_kernel_request(k).template_args;
  k.vector_update = true;
  EXPECT_TRUE(ends_with(rga_kernel_request(k).template_args, "32, false, true, false")) << rga_kernel_request(k).template_args;
  EXPECT_NE(k.to_string().find("transposed32,update16"), std::string::npos) << k.to_string();
  // A chunked residual side: 16-byte residual units (third argument) and kChunkedResidual last.
  RgaKernelKey chunked = k;
  chunked.chunked_residual = true;
  EXPECT_TRUE(ends_with(rga_kernel_request(chunked).template_args, "32, false, true, true"))
      << rga_kernel_request(chunked).template_args;
  EXPECT_NE(rga_kernel_request(chunked).template_args.find(", true, 32"), std::string::npos)
      << rga_kernel_request(chunked).template_args;
  EXPECT_NE(chunked.to_string().find("transposed32,chunk16"), std::string::npos) << chunked.to_string();
  EXPECT_NE(chunked.packed(), k.packed());
  EXPECT_EQ(rga_block_threads(chunked), 128) << "one thread per 16-byte chunk of a 32 x 32 bf16 tile";
  EXPECT_TRUE(ends_with(rga_kernel_request(k).template_args, "32, false, true, false"))
      << rga_kernel_request(k).template_args;
  k.vector = true;
  EXPECT_NE(k.to_string().find("transposed32,vec16"), std::string::npos) << k.to_string();
}

// The promoted chain and the strided gate rows reach the key and the request: an f32 gate's type as
// the flat kernel's last template argument, the strided mode's constant; the transposed layout
// takes neither.
TEST(ResidualGateAddJit, PromotedGateAndStridedRowsReachTheKernel) {
  RgaKernelKey k;
  k.dtype = DType::bf16;
  k.mode = GateMode::strided;
  k.gate_f32 = true;
  const KernelRequest r = rga_kernel_request(k);
  EXPECT_NE(r.template_args.find("ditops::kRgaGateStrided"), std::string::npos) << r.template_args;
  EXPECT_EQ(r.template_args.substr(r.template_args.size() - 7), ", float") << r.template_args;
  EXPECT_NE(k.to_string().find("strided,flat,vec16,gate_f32"), std::string::npos) << k.to_string();
  RgaKernelKey same = k;
  same.gate_f32 = false;
  EXPECT_NE(same.packed(), k.packed());
  EXPECT_EQ(rga_kernel_request(same).template_args.find("float"), std::string::npos);
  // Matching: the f32 gate beside bf16 data is the promoted chain; a 16-byte unit's gate values are
  // 32 bytes, the vector path needs them 16-byte aligned and the gate rows 16 bytes apart.
  HostTensor res(DType::bf16, {2, 8, 64}), upd(DType::bf16, {2, 8, 64}), out(DType::bf16, {2, 8, 64});
  HostTensor g(DType::f32, {2 * 6 * 64 + 8});
  TensorView chunk = TensorView::contiguous(g.view.data, DType::f32, kCpu, {2, 1, 64});
  chunk.strides[0] = 6 * 64;
  chunk.data = static_cast<float*>(g.view.data) + 2 * 64;
  const bool aligned = reinterpret_cast<uintptr_t>(chunk.data) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(res.view.data) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(upd.view.data) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(out.view.data) % 16 == 0;
  ResidualGateAddCall call = match_residual_gate_add(res.view, upd.view, chunk, out.view);
  EXPECT_TRUE(call.gate_f32);
  EXPECT_EQ(call.gate_mode, GateMode::strided);
  EXPECT_EQ(call.gate_row_stride, 6 * 64);
  EXPECT_EQ(call.rows_per_batch, 8);
  EXPECT_EQ(call.aligned16, aligned);
  chunk.strides[0] = 6 * 64 + 2;  // rows 8 bytes apart: the scalar path
  EXPECT_FALSE(match_residual_gate_add(res.view, upd.view, chunk, out.view).aligned16);
}

// The flat kernel of 32-bit indices divides by a multiply and a shift (kernels/common/fast_divide.h):
// exact for every dividend below 2^31, checked against `/` at divisors 1..2048, around every power
// of two up to 2^31 - 1 and at model row lengths, with dividends at 0, around multiples of the
// divisor and at the top of the range.
TEST(ResidualGateAddJit, FastDivisionEqualsIntegerDivisionBelowTwoToThe31) {
  std::vector<uint32_t> divisors;
  for (uint32_t d = 1; d <= 2048; ++d) divisors.push_back(d);
  for (int k = 11; k <= 31; ++k)
    for (int64_t d : {(int64_t{1} << k) - 1, int64_t{1} << k, (int64_t{1} << k) + 1, (int64_t{1} << k) / 3 * 2 + 1})
      if (d >= 1 && d <= 0x7fffffff) divisors.push_back(static_cast<uint32_t>(d));
  for (uint32_t d : {384u, 3072u / 8u * 4608u, 5120u * 32760u / 8u, 65u * 33u, 6912u * 384u}) divisors.push_back(d);
  const uint32_t top = 0x7fffffff;
  std::mt19937 rng(7);
  int64_t checked = 0;
  for (uint32_t d : divisors) {
    const FastDivisor f = fast_divisor(d);
    ASSERT_GE(f.shift, 31u) << d;
    ASSERT_LE(f.shift, 62u) << d;
    std::vector<uint32_t> dividends = {0, 1, 2, top, top - 1, top - d + 1, top / d * d, top / d * d - 1};
    for (uint32_t q : {1u, 2u, 3u, 1000u, top / d / 2, top / d})
      for (int64_t delta : {-1, 0, 1}) {
        const int64_t n = int64_t{q} * d + delta;
        if (n >= 0 && n <= top) dividends.push_back(static_cast<uint32_t>(n));
      }
    for (int i = 0; i < 64; ++i) dividends.push_back(rng() & top);
    for (uint32_t n : dividends) {
      ASSERT_EQ(fast_quotient(n, f), n / d) << n << " / " << d << " (multiplier " << f.multiplier << ", shift "
                                            << f.shift << ")";
      ++checked;
    }
  }
  EXPECT_GT(checked, 50000);
}

// The 64-bit kernel is a key of its own, taken from 2^31 units (the fast division's range).
TEST(ResidualGateAddJit, SixtyFourBitIndicesFromTwoToThe31Units) {
  EXPECT_FALSE(flat_index64(1));
  EXPECT_FALSE(flat_index64(int64_t{0x7fffffff}));
  EXPECT_TRUE(flat_index64(int64_t{0x80000000}));
  EXPECT_TRUE(flat_index64(int64_t{1} << 40));
  RgaKernelKey k;
  k.pdl = false;
  EXPECT_EQ(k.to_string().find("index64"), std::string::npos) << k.to_string();
  const std::string narrow_args = rga_kernel_request(k).template_args;
  RgaKernelKey wide = k;
  wide.index64 = true;
  EXPECT_NE(wide.to_string().find(",index64"), std::string::npos) << wide.to_string();
  EXPECT_NE(wide.packed(), k.packed());
  const std::string wide_args = rga_kernel_request(wide).template_args;
  EXPECT_EQ(narrow_args.substr(narrow_args.size() - 7), ", false") << narrow_args;
  EXPECT_EQ(wide_args.substr(wide_args.size() - 6), ", true") << wide_args;
}

// What the 32-bit flat kernel reads before its loads fits the params' first 48 bytes (the constant
// line it shares with the memory descriptor on sm_90: kernels/residual_gate_add.cuh), and
// rga_set_flat_sizes fills the 32-bit sizes and divisors only where every unit index fits.
TEST(ResidualGateAddJit, FlatSizesOfThe32BitKernelLeadTheParams) {
  EXPECT_EQ(offsetof(ResidualGateAddParams, units32), 24u);
  EXPECT_EQ(offsetof(ResidualGateAddParams, units_per_gate_row_divisor) + sizeof(FastDivisor), 48u);
  EXPECT_EQ(offsetof(ResidualGateAddParams, out), 48u);
  ResidualGateAddParams p{};
  rga_set_flat_sizes(p, 4608 * 384, 384, 4608 * 384 * 2);  // a batch gate row past the tensor
  EXPECT_EQ(p.units32, 4608u * 384u);
  EXPECT_EQ(p.row_units32, 384u);
  EXPECT_EQ(p.units, 4608 * 384);
  EXPECT_EQ(p.units_per_gate_row, 4608 * 384 * 2);
  EXPECT_EQ(fast_quotient(4607 * 384 + 5, p.row_units_divisor), 4607u);
  EXPECT_EQ(fast_quotient(4608 * 384 - 1, p.units_per_gate_row_divisor), 0u);
  ResidualGateAddParams wide{};
  rga_set_flat_sizes(wide, int64_t{0x80000000}, 384, int64_t{0x80000000});
  EXPECT_EQ(wide.units, int64_t{0x80000000});
  EXPECT_EQ(wide.units32, 0u);  // the 64-bit kernel's call: no 32-bit sizes
  EXPECT_EQ(wide.row_units_divisor.multiplier, 0u);
  ResidualGateAddParams empty{};
  rga_set_flat_sizes(empty, 0, 384, 384);  // no division by zero on the host
  EXPECT_EQ(empty.units32, 0u);
}

// The transposed kernel's block has one thread per unit of a tile, at most 256; the launch, the
// request's __launch_bounds__ and the kernel's own count (rga_transposed_threads) agree.
TEST(ResidualGateAddJit, TransposedBlockHasOneThreadPerTileUnit) {
  RgaKernelKey k;
  k.transposed = true;
  k.vector = true;
  k.tile = 32;
  for (DType dt : {DType::bf16, DType::f16}) {
    k.dtype = dt;
    EXPECT_EQ(rga_block_threads(k), 128) << "32 x 32 tile of 16-bit elements = 128 16-byte units";
  }
  k.dtype = DType::f32;
  EXPECT_EQ(rga_block_threads(k), 256);
  k.tile = 64;
  EXPECT_EQ(rga_block_threads(k), 256) << "a 64-tile has 512 units: two per thread";
  RgaKernelKey tall = k;
  tall.dtype = DType::bf16;
  tall.vector_update = true;
  tall.token_tile = 128;
  EXPECT_EQ(rga_block_threads(tall), 512) << "a 128 x 64 tile has 1024 units: two per thread";
  EXPECT_EQ(rga_kernel_request(tall).max_threads, 512);
  EXPECT_NE(tall.to_string().find("transposed128x64,vec16"), std::string::npos) << tall.to_string();
  const std::string args = rga_kernel_request(tall).template_args;
  EXPECT_EQ(args.substr(args.size() - 12), ", false, 128")
      << args << ": kChannelTilesFastest off, then kTokenTile";
  RgaKernelKey square = tall;
  square.token_tile = 64;
  EXPECT_NE(square.packed(), tall.packed());
  EXPECT_EQ(square.to_string().find("128x"), std::string::npos) << square.to_string();
  EXPECT_EQ(rga_block_threads(square), 256);
  k.vector = false;
  k.tile = 32;
  EXPECT_EQ(rga_block_threads(k), 256);
  k.dtype = DType::bf16;
  k.vector = true;
  EXPECT_EQ(rga_kernel_request(k).max_threads, 128);
  k.transposed = false;
  k.tile = 0;
  EXPECT_EQ(rga_block_threads(k), kRgaThreads);
  EXPECT_EQ(rga_kernel_request(k).max_threads, kRgaThreads);
}

}  // namespace
