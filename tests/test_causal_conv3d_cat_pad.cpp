// causal_conv3d_cat_pad beyond its driver cases (tests/cases/causal_conv3d_cat_pad_cases.cpp: the
// issue's shapes, odd sizes, padding, layouts, dtypes, pointer offsets with and without PDL,
// strides of extent-1 and empty dims, random bit patterns, overlaps and every invalid input,
// against the cat-then-pad oracle and the reference, on a device every CUDA implementation): what a
// case cannot express. Tensors on two devices; the op's description and alloc rule, the generic
// call and the C ABI (options as text, a NULL cache slot, an error as text) against an
// independent cat-then-pad; the row model's kernel choice and the 64-bit fast division; on a GPU
// (skipped without one) both kernels at both index widths launched directly on grids that loop.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/matcher.h"
#include "ditops/c_api.h"
#include "ditops/causal_conv3d_cat_pad.h"
#include "ditops/op.h"
#include "jit/cuda_driver.h"
#include "jit/jit.h"
#include "jit/kernel_request.h"
#include "jit/launch.h"
#include "kernels/causal_conv3d_cat_pad.cuh"

namespace {

using namespace ditops;

const Device kCpu{DeviceKind::cpu, 0};
constexpr unsigned char kSentinel = 0xA5;

// Logical [B, C, T, H, W]; physical NCTHW or (channels_last) [B, T, H, W, C].
std::vector<int64_t> dense_strides(const std::vector<int64_t>& s, bool channels_last) {
  if (!channels_last) return {s[1] * s[2] * s[3] * s[4], s[2] * s[3] * s[4], s[3] * s[4], s[4], 1};
  return {s[2] * s[3] * s[4] * s[1], 1, s[3] * s[4] * s[1], s[4] * s[1], s[1]};
}

int64_t product(const std::vector<int64_t>& v) {
  int64_t n = 1;
  for (int64_t x : v) n *= x;
  return n;
}

// A host tensor in its own byte buffer (`offset_elems` elements into it: pointers off 16 bytes).
struct HostTensor {
  std::vector<uint8_t> bytes;
  TensorView view;
  HostTensor() = default;
  HostTensor(const HostTensor&) = delete;  // the view points into `bytes`: moves keep the buffer
  HostTensor& operator=(const HostTensor&) = delete;
  HostTensor(HostTensor&&) = default;
  HostTensor& operator=(HostTensor&&) = default;
  HostTensor(DType dt, const std::vector<int64_t>& shape, bool channels_last, int offset_elems = 0) {
    const size_t es = dtype_size(dt);
    bytes.assign((product(shape) + offset_elems + 1) * es, kSentinel);
    view = TensorView::contiguous(bytes.data() + offset_elems * es, dt, kCpu, shape);
    const auto st = dense_strides(shape, channels_last);
    for (int d = 0; d < 5; ++d) view.strides[d] = st[d];
  }
  size_t es() const { return dtype_size(view.dtype); }
  int64_t offset(int64_t b, int64_t c, int64_t t, int64_t h, int64_t w) const {
    return b * view.strides[0] + c * view.strides[1] + t * view.strides[2] + h * view.strides[3] + w * view.strides[4];
  }
  const uint8_t* at(int64_t b, int64_t c, int64_t t, int64_t h, int64_t w) const {
    return static_cast<const uint8_t*>(view.data) + offset(b, c, t, h, w) * es();
  }
  // Every element random bits (NaNs with payloads, infinities, -0 among them), a -0 first.
  void randomize(std::mt19937& rng) {
    const int64_t n = product(std::vector<int64_t>(view.shape, view.shape + 5)) * static_cast<int64_t>(es());
    uint8_t* p = static_cast<uint8_t*>(view.data);
    uint64_t state = rng() | (static_cast<uint64_t>(rng()) << 32) | 1;
    for (int64_t i = 0; i < n; i += 8) {  // xorshift64: megabytes of inputs in milliseconds
      state ^= state << 13, state ^= state >> 7, state ^= state << 17;
      std::memcpy(p + i, &state, static_cast<size_t>(std::min<int64_t>(8, n - i)));
    }
    if (n > 0) std::memset(p, 0, es()), p[es() - 1] = 0x80;
  }
};

struct Case {
  std::vector<int64_t> x;  // [B, C, T, H, W]
  int64_t ct = 0;          // cache frames; -1: no cache
  int64_t wl = 0, wr = 0, ht = 0, hb = 0, dl = 0, dr = 0;
  DType dtype = DType::bf16;
  bool channels_last = false;
  std::string describe() const {
    std::string s = std::string(dtype_name(dtype)) + " x [";
    for (size_t i = 0; i < x.size(); ++i) s += (i ? "," : "") + std::to_string(x[i]);
    s += "] " + (ct < 0 ? std::string("no cache") : "ct " + std::to_string(ct)) + " pad (" + std::to_string(wl) +
         "," + std::to_string(wr) + "," + std::to_string(ht) + "," + std::to_string(hb) + "," + std::to_string(dl) +
         "," + std::to_string(dr) + ")" + (channels_last ? " channels-last" : "");
    return s;
  }
  std::vector<int64_t> cache_shape() const { return {x[0], x[1], ct, x[3], x[4]}; }
  std::vector<int64_t> out_shape() const {
    return {x[0], x[1], x[2] + dl + dr, x[3] + ht + hb, x[4] + wl + wr};
  }
  CausalConv3dCatPadOptions options() const {
    CausalConv3dCatPadOptions o;
    o.pad_w_left = wl;
    o.pad_w_right = wr;
    o.pad_h_top = ht;
    o.pad_h_bottom = hb;
    o.pad_t_left = dl;
    o.pad_t_right = dr;
    return o;
  }
};

// The independent oracle: torch.cat([cache, x], 2) into a dense NCTHW buffer, then F.pad with
// (wl, wr, ht, hb, dl - ct, dr) into another; returns the padded tensor's bytes (NCTHW).
std::vector<uint8_t> cat_then_pad(const Case& c, const HostTensor& x, const HostTensor* cache) {
  const size_t es = x.es();
  const int64_t B = c.x[0], C = c.x[1], T = c.x[2], H = c.x[3], W = c.x[4];
  const int64_t ct = cache ? c.ct : 0, Tc = ct + T;
  std::vector<uint8_t> cat(B * C * Tc * H * W * es);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t ch = 0; ch < C; ++ch)
      for (int64_t t = 0; t < Tc; ++t)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t w = 0; w < W; ++w)
            std::memcpy(&cat[((((b * C + ch) * Tc + t) * H + h) * W + w) * es],
                        t < ct ? cache->at(b, ch, t, h, w) : x.at(b, ch, t - ct, h, w), es);
  const int64_t pt = c.dl - ct;  // F.pad's left time padding
  const int64_t To = Tc + pt + c.dr, Ho = H + c.ht + c.hb, Wo = W + c.wl + c.wr;
  std::vector<uint8_t> out(B * C * To * Ho * Wo * es, 0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t ch = 0; ch < C; ++ch)
      for (int64_t t = 0; t < Tc; ++t)
        for (int64_t h = 0; h < H; ++h)
          std::memcpy(&out[((((b * C + ch) * To + t + pt) * Ho + h + c.ht) * Wo + c.wl) * es],
                      &cat[((((b * C + ch) * Tc + t) * H + h) * W) * es], W * es);
  return out;
}

// "" when out (read through its strides) holds `want` (dense NCTHW) bit for bit and nothing
// outside out's elements was written.
std::string compare(const HostTensor& out, const std::vector<uint8_t>& want) {
  const size_t es = out.es();
  const std::vector<int64_t> s(out.view.shape, out.view.shape + 5);
  int64_t differ = 0, first = -1, index = 0;
  std::vector<bool> touched(out.bytes.size(), false);
  for (int64_t b = 0; b < s[0]; ++b)
    for (int64_t c = 0; c < s[1]; ++c)
      for (int64_t t = 0; t < s[2]; ++t)
        for (int64_t h = 0; h < s[3]; ++h)
          for (int64_t w = 0; w < s[4]; ++w, ++index) {
            const uint8_t* p = out.at(b, c, t, h, w);
            for (size_t k = 0; k < es; ++k) touched[p - out.bytes.data() + k] = true;
            if (std::memcmp(p, &want[index * es], es) != 0 && differ++ == 0) first = index;
          }
  for (size_t i = 0; i < out.bytes.size(); ++i)
    if (!touched[i] && out.bytes[i] != kSentinel) return "byte " + std::to_string(i) + " outside out was written";
  if (differ) return std::to_string(differ) + " elements differ, first at NCTHW index " + std::to_string(first);
  return "";
}

// ---- bad input: an Error naming what is wrong, nothing written ----

struct BadCall {
  HostTensor x, cache, out;
  CausalConv3dCatPadOptions options;
  bool use_cache = true;
  explicit BadCall(const Case& c = {{2, 3, 2, 4, 5}, 2, 1, 1, 1, 1, 2, 0})
      : x(c.dtype, c.x, c.channels_last), cache(c.dtype, c.cache_shape(), c.channels_last),
        out(c.dtype, c.out_shape(), c.channels_last), options(c.options()) {
    std::mt19937 rng(3);
    x.randomize(rng);
    cache.randomize(rng);
  }
  // The message of the Error the call throws ("" when it does not), and whether out was left alone.
  std::string run() {
    const std::vector<uint8_t> before = out.bytes;
    std::string message;
    try {
      causal_conv3d_cat_pad(x.view, use_cache ? cache.view : TensorView{}, out.view, options);
    } catch (const Error& e) {
      message = e.what();
    }
    EXPECT_EQ(before, out.bytes) << "out was written by a refused call: " << message;
    return message;
  }
};

void expect_refused(BadCall& call, const std::vector<std::string>& fragments) {
  const std::string message = call.run();
  ASSERT_FALSE(message.empty()) << "expected an Error";
  EXPECT_EQ(message.rfind("causal_conv3d_cat_pad: ", 0), 0u) << message;
  for (const auto& f : fragments) EXPECT_NE(message.find(f), std::string::npos) << "'" << f << "' not in: " << message;
}

TEST(CausalConv3dCatPadErrors, MixedDevices) {
  BadCall c;
  c.cache.view.device = {DeviceKind::cuda, 0};
  expect_refused(c, {"cache.device must be cpu (as x) but is cuda:0"});
  BadCall o;
  o.out.view.device = {DeviceKind::cuda, 1};
  expect_refused(o, {"out.device must be cpu (as x) but is cuda:1"});
}

// ---- the generic call (what every binding runs) and the C ABI ----

TEST(CausalConv3dCatPadBindings, DescriptionTakesFPadOrderAndAllocatesThePaddedShape) {
  const OpDescription& d = op("causal_conv3d_cat_pad");
  ASSERT_EQ(d.tensors.size(), 3u);
  EXPECT_EQ(d.tensors[0].name, "x");
  EXPECT_EQ(d.tensors[1].name, "cache");
  EXPECT_TRUE(d.tensors[1].optional);
  EXPECT_EQ(d.tensors[2].name, "out");
  const char* pads[] = {"pad_w_left", "pad_w_right", "pad_h_top", "pad_h_bottom", "pad_t_left", "pad_t_right"};
  for (int i = 0; i < 6; ++i) {
    ASSERT_EQ(d.options[i].name, pads[i]);
    EXPECT_EQ(d.options[i].default_text, "0");
  }
}

// The alloc rule the bindings evaluate: the padded shape from x and the options, unset options
// at their defaults; in x's memory format.
TEST(CausalConv3dCatPadBindings, AllocRuleGivesThePaddedShape) {
  const OpDescription& d = op("causal_conv3d_cat_pad");
  HostTensor x(DType::bf16, {2, 3, 4, 5, 6}, true);
  GenericCall g = generic_call(d);
  g.tensors[0] = x.view;
  g.given[0] = true;
  g.options[d.option_index("pad_w_left")] = int64_t{1};
  g.options[d.option_index("pad_w_right")] = int64_t{2};
  g.options[d.option_index("pad_h_bottom")] = int64_t{3};
  g.options[d.option_index("pad_t_left")] = int64_t{4};
  EXPECT_EQ(alloc_shape(d, d.tensors[2], g), (std::vector<int64_t>{2, 3, 8, 8, 9}));
  EXPECT_EQ(d.tensors[2].alloc_format, "x");
}

TEST(CausalConv3dCatPadBindings, GenericCallAndCAbiAgreeWithCatThenPad) {
  const Case c{{1, 3, 2, 4, 5}, 2, 1, 2, 0, 1, 3, 1, DType::f16};
  std::mt19937 rng(11);
  HostTensor x(c.dtype, c.x, false), cache(c.dtype, c.cache_shape(), false), out(c.dtype, c.out_shape(), false);
  x.randomize(rng);
  cache.randomize(rng);
  const std::vector<uint8_t> want = cat_then_pad(c, x, &cache);

  const OpDescription& d = op("causal_conv3d_cat_pad");
  GenericCall g = generic_call(d);
  g.tensors = {x.view, cache.view, out.view};
  g.given = {true, true, true};
  const int64_t pads[] = {c.wl, c.wr, c.ht, c.hb, c.dl, c.dr};
  for (int i = 0; i < 6; ++i) g.options[i] = pads[i];
  EXPECT_EQ(call("causal_conv3d_cat_pad", g), "causal_conv3d_cat_pad.reference");
  EXPECT_EQ(compare(out, want), "");

  // The C ABI: tensors in slot order, options as text.
  HostTensor out2(c.dtype, c.out_shape(), false);
  auto dl = [](const TensorView& t, int64_t* shape, int64_t* strides) {
    DLTensor v{};
    v.data = t.data;
    v.device = {kDLCPU, 0};
    v.ndim = t.rank;
    v.dtype = {kDLFloat, 16, 1};
    for (int i = 0; i < t.rank; ++i) shape[i] = t.shape[i], strides[i] = t.strides[i];
    v.shape = shape;
    v.strides = strides;
    return v;
  };
  int64_t s[3][5], st[3][5];
  DLTensor dx = dl(x.view, s[0], st[0]), dc = dl(cache.view, s[1], st[1]), dout = dl(out2.view, s[2], st[2]);
  const DLTensor* slots[] = {&dx, &dc, &dout};
  const ditops_option options[] = {{"pad_w_left", "1"}, {"pad_w_right", "2"}, {"pad_h_top", "0"},
                                   {"pad_h_bottom", "1"}, {"pad_t_left", "3"}, {"pad_t_right", "1"}};
  char impl[64], err[512];
  ASSERT_EQ(ditops_call("causal_conv3d_cat_pad", slots, 3, options, 6, nullptr, impl, sizeof impl, err, sizeof err), 0)
      << err;
  EXPECT_STREQ(impl, "causal_conv3d_cat_pad.reference");
  EXPECT_EQ(compare(out2, want), "");

  // No cache (a NULL slot) and dl < ct through the C ABI: the error comes back as text.
  const DLTensor* no_cache[] = {&dx, nullptr, &dout};
  HostTensor out3(c.dtype, {1, 3, 2 + 3 + 1, 5, 8}, false);
  DLTensor d3 = dl(out3.view, s[2], st[2]);
  no_cache[2] = &d3;
  ASSERT_EQ(ditops_call("causal_conv3d_cat_pad", no_cache, 3, options, 6, nullptr, impl, sizeof impl, err, sizeof err),
            0)
      << err;
  Case nc = c;
  nc.ct = -1;
  EXPECT_EQ(compare(out3, cat_then_pad(nc, x, nullptr)), "");
  const ditops_option short_dl[] = {{"pad_t_left", "1"}};
  EXPECT_EQ(ditops_call("causal_conv3d_cat_pad", slots, 3, short_dl, 1, nullptr, impl, sizeof impl, err, sizeof err), 1);
  EXPECT_NE(std::string(err).find("pad_t_left must be >= cache.shape[2] = 2"), std::string::npos) << err;
}

// ---- the GPU part: every CUDA implementation against the reference (skipped without a device) ----

using jit::check_cu;

constexpr size_t kGuard = 256;  // sentinel bytes before and after every device tensor

struct DeviceTensor {
  CUdeviceptr base = 0;
  size_t offset, bytes, total;
  DeviceTensor(const HostTensor& like, bool upload)
      : offset(kGuard + (static_cast<const uint8_t*>(like.view.data) - like.bytes.data())),
        bytes(static_cast<size_t>(product(std::vector<int64_t>(like.view.shape, like.view.shape + 5))) * like.es()),
        total(bytes + 2 * kGuard + 16) {
    const auto& d = jit::require_cuda_driver();
    check_cu(d.cuMemAlloc(&base, total), "alloc");
    check_cu(d.cuMemsetD8(base, kSentinel, total), "memset");
    if (upload && bytes) check_cu(d.cuMemcpyHtoD(base + offset, like.view.data, bytes), "h2d");
  }
  ~DeviceTensor() { jit::require_cuda_driver().cuMemFree(base); }
  DeviceTensor(const DeviceTensor&) = delete;
  DeviceTensor& operator=(const DeviceTensor&) = delete;
  TensorView view(const HostTensor& like) const {
    TensorView v = like.view;
    v.data = reinterpret_cast<void*>(base + offset);
    v.device = {DeviceKind::cuda, 0};
    return v;
  }
  // "" when the device bytes of the tensor equal `want` (dense storage order) and the guards hold.
  std::string compare(const std::vector<uint8_t>& want, size_t es) const {
    std::vector<uint8_t> all(total);
    check_cu(jit::require_cuda_driver().cuMemcpyDtoH(all.data(), base, total), "d2h");
    for (size_t i = 0; i < total; ++i)
      if ((i < offset || i >= offset + bytes) && all[i] != kSentinel)
        return "byte " + std::to_string(i) + " outside out was written";
    int64_t differ = 0, first = -1;
    for (size_t e = 0; e < bytes / es; ++e)
      if (std::memcmp(&all[offset + e * es], &want[e * es], es) != 0 && differ++ == 0) first = static_cast<int64_t>(e);
    if (differ) return std::to_string(differ) + " elements differ, first at storage index " + std::to_string(first);
    return "";
  }
};

class CausalConv3dCatPadGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!jit::cuda_driver()) GTEST_SKIP() << "no CUDA device: the GPU implementations are checked on the device run";
    jit::bind_primary_context(0);
  }
};

// The storage bytes of out (dense in its layout) as the CPU reference writes them.
std::vector<uint8_t> reference_bytes(const Case& c, const HostTensor& x, const HostTensor* cache, int offset_elems) {
  HostTensor out(c.dtype, c.out_shape(), c.channels_last, offset_elems);
  causal_conv3d_cat_pad(x.view, cache ? cache->view : TensorView{}, out.view, c.options());
  const uint8_t* p = static_cast<const uint8_t*>(out.view.data);
  return std::vector<uint8_t>(p, p + product(c.out_shape()) * out.es());
}

// The row model of kernels/causal_conv3d_cat_pad.cuh for a case, filled here from the case's
// extents (the op fills it from the matched call).
CausalConv3dCatPadParams params_for(const Case& c, const void* x, const void* cache, void* out, bool index64) {
  const int64_t inner = (c.channels_last ? c.x[1] : 1) * static_cast<int64_t>(dtype_size(c.dtype));
  const auto s = c.out_shape();
  CausalConv3dCatPadParams p{};
  p.x = x;
  p.cache = c.ct > 0 ? cache : nullptr;
  p.out = out;
  p.row_bytes = s[4] * inner;
  p.head_bytes = c.wl * inner;
  p.run_bytes = c.x[4] * inner;
  p.rows_out = s[3];
  p.frames_out = s[2];
  p.src_rows = c.x[3];
  p.x_frames = c.x[2];
  p.cache_frames = c.ct > 0 ? c.ct : 0;
  p.frame_offset = c.dl - p.cache_frames;
  p.row_offset = c.ht;
  ccp_finish_params(p, (c.channels_last ? s[0] : s[0] * s[1]) * s[2] * s[3], index64);
  return p;
}

// What picks the kernel: ccp_aligned where rows, heads, runs and pointers lie on 16 bytes (the
// channels-last model shapes), else chunks where the pads add 4 or 8 bytes and runs are
// 16 x kCcpUnrollChunks bytes or more (ccp_chunks_fit), rows of any length; else parts where rows
// are 16 to 511 bytes, general otherwise (ccp_path);
// the 64-bit kernel from 2^31 - 64 bytes of out; the derived fields of the row model (out's phase
// and its windows).
TEST(CausalConv3dCatPadJit, RowModelPicksTheKernel) {
  alignas(16) static unsigned char buf[64];
  const Case cl{{1, 192, 2, 360, 640}, 2, 1, 1, 1, 1, 2, 0, DType::bf16, true};
  EXPECT_TRUE(ccp_aligned(params_for(cl, buf, buf + 16, buf + 32, false)));
  EXPECT_FALSE(ccp_aligned(params_for(cl, buf, buf + 16, buf + 34, false)));  // out off 16 bytes
  EXPECT_FALSE(ccp_aligned(params_for(cl, buf, buf + 18, buf + 32, false)));  // cache off 16 bytes
  const Case nc{{1, 192, 2, 360, 640}, 2, 1, 1, 1, 1, 2, 0};
  EXPECT_FALSE(ccp_aligned(params_for(nc, buf, buf, buf, false)));  // rows of 1284 bytes
  const Case copy{{1, 16, 1, 8, 64}, 0, 8, 8, 0, 0, 0, 0};
  EXPECT_TRUE(ccp_aligned(params_for(copy, buf, buf, buf, false)));  // NCTHW rows of 160, heads of 16 bytes
  EXPECT_EQ(ccp_path(params_for(cl, buf, buf + 16, buf + 32, false)), kCcpAligned);
  EXPECT_EQ(ccp_path(params_for(cl, buf, buf + 16, buf + 34, false)), kCcpGeneral);  // rows of 246 KB, off 16 bytes
  EXPECT_EQ(ccp_path(params_for(nc, buf, buf, buf, false)), kCcpChunks);             // rows of 1284 bytes
  const Case nc_f32{{1, 192, 2, 360, 640}, 2, 1, 1, 1, 1, 2, 0, DType::f32};             // rows of 2568 bytes
  EXPECT_EQ(ccp_path(params_for(nc_f32, buf, buf, buf + 4, false)), kCcpChunks);
  const Case long_pads6{{1, 4, 2, 6, 640}, 2, 1, 2, 1, 1, 2, 0};  // rows of 1286 bytes, pads adding 6 bytes
  EXPECT_EQ(ccp_path(params_for(long_pads6, buf, buf, buf, false)), kCcpGeneral);
  const Case long_pads16{{1, 4, 2, 6, 640}, 2, 4, 4, 1, 1, 2, 0};  // rows of 1296 bytes, pads adding 16 bytes
  EXPECT_EQ(ccp_path(params_for(long_pads16, buf, buf, buf, false)), kCcpGeneral);
  const Case vae{{1, 1024, 2, 60, 104}, 2, 1, 1, 1, 1, 2, 0};  // rows of 212 bytes
  EXPECT_EQ(ccp_path(params_for(vae, buf, buf, buf, false)), kCcpChunks);
  const Case vae_f32{{1, 1024, 2, 30, 52}, 1, 1, 1, 1, 1, 1, 0, DType::f32};  // rows of 216 bytes, pads of 8
  EXPECT_EQ(ccp_path(params_for(vae_f32, buf, buf, buf, false)), kCcpChunks);
  const Case pads12{{1, 4, 2, 6, 104}, 2, 1, 2, 1, 1, 2, 0};  // pads adding 6 bytes
  EXPECT_EQ(ccp_path(params_for(pads12, buf, buf, buf, false)), kCcpParts);
  const Case short_run{{1, 4, 2, 6, 8 * kCcpUnrollChunks - 1}, 2, 1, 1, 1, 1, 2, 0};  // runs under a chunk
  EXPECT_EQ(ccp_path(params_for(short_run, buf, buf, buf, false)), kCcpParts);
  const Case row16{{1, 2, 1, 3, 6}, 0, 1, 1, 0, 0, 0, 0};  // NCTHW rows of 8 elements: 16 bytes
  EXPECT_EQ(ccp_path(params_for(row16, buf, buf, buf + 2, false)), kCcpParts);
  const Case row14{{1, 2, 1, 3, 5}, 0, 1, 1, 0, 0, 0, 0};  // 14 bytes: a window may meet three rows
  EXPECT_EQ(ccp_path(params_for(row14, buf, buf, buf, false)), kCcpGeneral);
  const CausalConv3dCatPadParams p = params_for(nc, buf, buf, buf + 6, false);
  EXPECT_EQ(p.out_bytes, int64_t{192} * 4 * 362 * 642 * 2);
  EXPECT_EQ(p.out_phase, 6);
  EXPECT_EQ(p.windows, (p.out_bytes + 6 + 15) / 16);
  EXPECT_FALSE(ccp_index64(kCcpIndex32Bytes - 1));
  EXPECT_TRUE(ccp_index64(kCcpIndex32Bytes));
  EXPECT_TRUE(ccp_index64(int64_t{1} << 40));
}

// The 64-bit kernel divides by a multiply-high and a shift (kernels/common/fast_divide.h): exact
// for every dividend below 2^63, checked against `/` at divisors 1..2048, around every power of two
// up to 2^63 - 1, at model row lengths and at random, with dividends at 0, around multiples of the
// divisor, at the top of the range and at random.
TEST(CausalConv3dCatPadJit, FastDivision64EqualsIntegerDivisionBelowTwoToThe63) {
  std::vector<uint64_t> divisors;
  for (uint64_t d = 1; d <= 2048; ++d) divisors.push_back(d);
  for (int k = 11; k <= 62; ++k)
    for (uint64_t d : {(uint64_t{1} << k) - 1, uint64_t{1} << k, (uint64_t{1} << k) + 1, (uint64_t{1} << k) / 3 * 2 + 1})
      divisors.push_back(d);
  divisors.push_back((uint64_t{1} << 63) - 1);
  for (uint64_t d : {1284u, 642u * 192u * 2u, 362u, 4u, 54u * 2u}) divisors.push_back(d);
  std::mt19937_64 rng(7);
  for (int i = 0; i < 256; ++i) divisors.push_back(((rng() >> 1) >> (rng() % 62)) | 1);
  const uint64_t top = (uint64_t{1} << 63) - 1;
  int64_t checked = 0;
  for (uint64_t d : divisors) {
    const FastDivisor64 f = fast_divisor64(d);
    std::vector<uint64_t> dividends = {0, 1, 2, top, top - 1, top - d + 1, top / d * d, top / d * d - 1, d - 1, d, d + 1};
    for (int i = 0; i < 48; ++i) dividends.push_back((rng() >> 1) >> (rng() % 63));
    for (uint64_t n : dividends) {
      ASSERT_EQ(fast_quotient64(n, f), n / d) << n << " / " << d << " (multiplier " << f.multiplier << ", shift "
                                              << f.shift << ")";
      ++checked;
    }
  }
  EXPECT_GT(checked, 100000);
}

// Every kernel at both index widths launched directly on grids of 1 and 3 blocks (each warp then
// takes several steps, frame pairs change inside a warp's range): NCTHW rows of 9 + 3 elements
// (every phase; ccp_path's parts kernel, and the general one), NCTHW rows of 40 + 2 and of
// 640 + 2 elements (SGLang's width: ccp_path's chunks kernel, and the other two) and
// channels-last rows of 16-byte units (the aligned one), parameters from params_for. The op
// launches the 64-bit kernels only from 2^31 - 64 bytes.
TEST_F(CausalConv3dCatPadGpu, EveryKernelAndIndexWidthOnGridsThatLoop) {
  const Case cases[] = {{{2, 3, 3, 5, 9}, 2, 1, 2, 1, 1, 3, 1},
                        {{2, 3, 3, 5, 40}, 2, 1, 1, 1, 1, 3, 1},
                        {{1, 2, 2, 3, 640}, 2, 1, 1, 1, 1, 2, 0},
                        {{2, 8, 3, 5, 9}, 2, 1, 2, 1, 1, 3, 1, DType::bf16, true}};
  for (const Case& c : cases) {
    const bool chunks = c.x[4] == 40 || c.x[4] == 640;
    std::mt19937 rng(3000);
    HostTensor x(c.dtype, c.x, c.channels_last), cache(c.dtype, c.cache_shape(), c.channels_last),
        out_like(c.dtype, c.out_shape(), c.channels_last);
    x.randomize(rng);
    cache.randomize(rng);
    const std::vector<uint8_t> want = reference_bytes(c, x, &cache, 0);
    const DeviceTensor dx(x, true), dc(cache, true);
    const std::vector<int> paths = c.channels_last ? std::vector<int>{kCcpAligned}
                                   : chunks        ? std::vector<int>{kCcpChunks, kCcpParts, kCcpGeneral}
                                                   : std::vector<int>{kCcpParts, kCcpGeneral};
    for (int path : paths)
      for (bool index64 : {false, true})
        for (unsigned grid : {1u, 3u}) {
          DeviceTensor dout(out_like, false);
          const CausalConv3dCatPadParams p =
              params_for(c, dx.view(x).data, dc.view(cache).data, dout.view(out_like).data, index64);
          EXPECT_EQ(ccp_path(p), c.channels_last ? kCcpAligned : chunks ? kCcpChunks : kCcpParts) << c.describe();
          KernelRequest r;
          r.header = "causal_conv3d_cat_pad.cuh";
          r.function = "ditops::causal_conv3d_cat_pad";
          r.template_args = "2, " + std::to_string(path) + ", false, " + (index64 ? "true" : "false");
          r.params_type = "ditops::CausalConv3dCatPadParams";
          r.template_key = "test:path" + std::to_string(path) + (index64 ? ",64" : ",32");
          const jit::LoadedKernel& kernel = jit::jit_kernel(r, 0);
          jit::launch(kernel, grid, 256, &p, sizeof p, nullptr, false);
          check_cu(jit::require_cuda_driver().cuCtxSynchronize(), "sync");
          EXPECT_EQ(dout.compare(want, 2), "") << c.describe() << ", path " << path << (index64 ? ", 64" : ", 32")
                                               << "-bit indices, grid " << grid;
        }
  }
}

}  // namespace
