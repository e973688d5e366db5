// causal_conv3d_cat_pad on the CPU: the reference against an independent cat-then-pad written
// here (two dense passes, as eager runs it), over the issue's shapes (the first at full size, the
// others scaled down), odd sizes, asymmetric padding, no cache, dl > ct, dr > 0, every dtype, both
// layouts, strided extent-1 dims and empty tensors, compared as raw bits (random bit patterns: NaN
// payloads and -0 included); every bad input refused with a message naming what is wrong and out
// untouched; the generic call and the C ABI.
//
// GPU part (skipped without a device): every CUDA implementation byte-equal to the reference,
// with guard bytes around out untouched, over the issue's model shapes at full size, both layouts,
// every dtype, pointers off 16 bytes and odd widths; the 32- and 64-bit kernels launched directly
// on a grid that loops.
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

void run_case(const Case& c, uint32_t seed, int offset_elems = 0) {
  SCOPED_TRACE(c.describe() + " offset " + std::to_string(offset_elems));
  std::mt19937 rng(seed);
  HostTensor x(c.dtype, c.x, c.channels_last, offset_elems);
  x.randomize(rng);
  HostTensor cache;
  if (c.ct >= 0) {
    cache = HostTensor(c.dtype, c.cache_shape(), c.channels_last, offset_elems);
    cache.randomize(rng);
  }
  HostTensor out(c.dtype, c.out_shape(), c.channels_last, offset_elems);
  const std::string impl =
      causal_conv3d_cat_pad(x.view, c.ct >= 0 ? cache.view : TensorView{}, out.view, c.options());
  EXPECT_EQ(impl, "causal_conv3d_cat_pad.reference");
  EXPECT_EQ(compare(out, cat_then_pad(c, x, c.ct >= 0 ? &cache : nullptr)), "");
}

// The issue's (C, T, H, W) x cache time {1, 2} with padding (1, 1, 1, 1, ct, 0): the first at full
// size, the others with C, H, W scaled down (the GPU test runs them at full size).
TEST(CausalConv3dCatPadReference, IssueShapesAgreeWithCatThenPad) {
  const std::vector<std::vector<int64_t>> shapes = {
      {1, 1024, 1, 30, 52}, {1, 64, 2, 15, 26}, {1, 16, 4, 30, 52}, {1, 4, 4, 60, 104}};
  uint32_t seed = 1;
  for (const auto& s : shapes)
    for (int64_t ct : {1, 2})
      for (bool cl : {false, true}) run_case({s, ct, 1, 1, 1, 1, ct, 0, DType::bf16, cl}, seed++);
}

TEST(CausalConv3dCatPadReference, OddSizesAsymmetricPaddingEveryDtypeBothLayouts) {
  uint32_t seed = 100;
  for (DType dt : {DType::bf16, DType::f16, DType::f32})
    for (bool cl : {false, true}) {
      run_case({{1, 3, 5, 7, 9}, 3, 2, 1, 0, 3, 4, 2, dt, cl}, seed++);   // asymmetric, dl > ct, dr > 0
      run_case({{2, 5, 3, 4, 7}, -1, 1, 2, 1, 0, 2, 0, dt, cl}, seed++);  // no cache
      run_case({{2, 5, 3, 4, 7}, -1, 0, 0, 0, 0, 0, 0, dt, cl}, seed++);  // no cache, no padding: a copy
      run_case({{1, 7, 1, 3, 3}, 2, 3, 0, 2, 2, 5, 1, dt, cl}, seed++);   // dl > ct: zero frames
      run_case({{2, 1, 2, 3, 5}, 1, 1, 1, 1, 1, 1, 0, dt, cl}, seed++);   // C = 1 (both layouts at once)
      run_case({{1, 2, 2, 1, 1}, 2, 0, 7, 0, 0, 2, 3, dt, cl}, seed++);   // H = W = 1
      run_case({{3, 4, 2, 5, 13}, 2, 5, 2, 3, 0, 2, 0, dt, cl}, seed++, 1);  // pointers off 16 bytes
      run_case({{1, 9, 3, 2, 11}, 0, 1, 1, 1, 1, 0, 0, dt, cl}, seed++);  // an empty cache (ct = 0)
    }
}

TEST(CausalConv3dCatPadReference, EmptyTensorsAreANoOpOrZeroFill) {
  uint32_t seed = 200;
  run_case({{0, 4, 2, 3, 5}, 1, 1, 1, 1, 1, 1, 0}, seed++);  // B = 0: empty out
  run_case({{1, 0, 2, 3, 5}, 1, 1, 1, 1, 1, 1, 0}, seed++);  // C = 0: empty out
  run_case({{1, 3, 0, 3, 5}, 2, 1, 1, 1, 1, 3, 1}, seed++);  // T = 0: cache frames and zeros
  run_case({{1, 3, 0, 3, 5}, -1, 1, 1, 1, 1, 3, 1}, seed++);  // no source at all: all zeros
  run_case({{1, 3, 2, 0, 5}, 1, 1, 1, 1, 1, 1, 0}, seed++);  // H = 0: zeros
  run_case({{1, 3, 2, 4, 0}, 1, 1, 1, 1, 1, 1, 0}, seed++, 0);  // W = 0: zeros
}

// An empty out returns at once, however large its other extents (libFuzzer, C ABI target: the
// reference's outer loops ran 2^40 times over a width of 0).
TEST(CausalConv3dCatPadReference, EmptyOutWithHugeExtentsReturnsAtOnce) {
  static uint16_t none[1];
  const Device cpu{DeviceKind::cpu, 0};
  const int64_t huge = int64_t{1} << 40;
  const TensorView x = TensorView::contiguous(none, DType::bf16, cpu, {1, huge, 1, 1, 0});
  const TensorView out = TensorView::contiguous(none, DType::bf16, cpu, {1, huge, 3, 1, 0});
  CausalConv3dCatPadOptions options;
  options.pad_t_left = 1;
  options.pad_t_right = 1;
  EXPECT_EQ(causal_conv3d_cat_pad(x, TensorView{}, out, options), "causal_conv3d_cat_pad.reference");
}

// Extent-1 dims may carry any stride (as PyTorch leaves them): still the layout.
TEST(CausalConv3dCatPadReference, ExtentOneDimsTakeAnyStride) {
  std::mt19937 rng(7);
  const Case c{{1, 4, 1, 3, 5}, 1, 1, 1, 1, 1, 1, 0};
  HostTensor x(c.dtype, c.x, false), cache(c.dtype, c.cache_shape(), false), out(c.dtype, c.out_shape(), false);
  x.randomize(rng);
  cache.randomize(rng);
  x.view.strides[0] = 12345;
  x.view.strides[2] = 777;
  cache.view.strides[2] = 1;
  causal_conv3d_cat_pad(x.view, cache.view, out.view, c.options());
  EXPECT_EQ(compare(out, cat_then_pad(c, x, &cache)), "");
}

// Tensors without elements address nothing: any strides (torch's empty [1, 3, 0, 3, 5] has
// (45, 15, 15, 5, 1), in neither layout's dense form).
TEST(CausalConv3dCatPadReference, EmptyInputsTakeAnyStrides) {
  std::mt19937 rng(8);
  const Case c{{1, 3, 0, 3, 5}, 0, 1, 1, 1, 1, 2, 1};
  HostTensor x(c.dtype, c.x, false), cache(c.dtype, c.cache_shape(), false), out(c.dtype, c.out_shape(), true);
  const int64_t torch_strides[5] = {45, 15, 15, 5, 1};
  for (int d = 0; d < 5; ++d) x.view.strides[d] = cache.view.strides[d] = torch_strides[d];
  causal_conv3d_cat_pad(x.view, cache.view, out.view, c.options());  // out channels-last: all zeros
  EXPECT_EQ(compare(out, cat_then_pad(c, x, &cache)), "");
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

TEST(CausalConv3dCatPadErrors, DtypeMismatch) {
  BadCall c;
  c.cache.view.dtype = DType::f16;
  expect_refused(c, {"cache.dtype must be bf16 (as x) but is f16"});
  BadCall o;
  o.out.view.dtype = DType::f16;
  expect_refused(o, {"out.dtype must be bf16 (as x) but is f16"});
  BadCall i;
  i.x.view.dtype = DType::i32;
  i.cache.view.dtype = DType::i32;
  expect_refused(i, {"x.dtype must be bf16, f16 or f32 but is i32"});
}

TEST(CausalConv3dCatPadErrors, CacheBatchChannelHeightWidthMismatch) {
  const char* names[] = {"B", "C", "", "H", "W"};
  for (int d : {0, 1, 3, 4}) {
    BadCall c;
    c.cache.view.shape[d] += 1;
    expect_refused(c, {"cache.shape[" + std::to_string(d) + "] must equal " + names[d] + "=" +
                           std::to_string(c.x.view.shape[d]) + " (bound by x.shape[" + std::to_string(d) + "]) but is " +
                           std::to_string(c.x.view.shape[d] + 1)});
  }
}

TEST(CausalConv3dCatPadErrors, LeftTimePaddingBelowTheCacheLength) {
  BadCall c;
  c.options.pad_t_left = 1;  // the cache has 2 frames
  expect_refused(c, {"pad_t_left must be >= cache.shape[2] = 2", "but is 1"});
}

TEST(CausalConv3dCatPadErrors, TensorsThatAreNot5D) {
  BadCall x;
  x.x.view.rank = 4;
  expect_refused(x, {"x must have rank 5 but has rank 4"});
  BadCall c;
  c.cache.view.rank = 6;
  c.cache.view.shape[5] = 1;
  c.cache.view.strides[5] = 1;
  expect_refused(c, {"cache must have rank 5 but has rank 6"});
  BadCall o;
  o.out.view.rank = 3;
  expect_refused(o, {"out must have rank 5 but has rank 3"});
  BadCall n;
  n.use_cache = false;
  n.options.pad_t_left = 0;
  TensorView cache0{};
  cache0.data = n.cache.view.data;  // rank 0 with data: not "no cache"
  const std::vector<uint8_t> before = n.out.bytes;
  try {
    causal_conv3d_cat_pad(n.x.view, cache0, n.out.view, n.options);
    ADD_FAILURE() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cache has rank 0 but a data pointer"), std::string::npos) << e.what();
  }
  EXPECT_EQ(before, n.out.bytes);
}

TEST(CausalConv3dCatPadErrors, MixedDevices) {
  BadCall c;
  c.cache.view.device = {DeviceKind::cuda, 0};
  expect_refused(c, {"cache.device must be cpu (as x) but is cuda:0"});
  BadCall o;
  o.out.view.device = {DeviceKind::cuda, 1};
  expect_refused(o, {"out.device must be cpu (as x) but is cuda:1"});
}

TEST(CausalConv3dCatPadErrors, NegativePadding) {
  const char* names[] = {"pad_w_left", "pad_w_right", "pad_h_top", "pad_h_bottom", "pad_t_left", "pad_t_right"};
  for (int i = 0; i < 6; ++i) {
    BadCall c;
    c.use_cache = false;
    int64_t* fields[] = {&c.options.pad_w_left, &c.options.pad_w_right, &c.options.pad_h_top,
                         &c.options.pad_h_bottom, &c.options.pad_t_left, &c.options.pad_t_right};
    *fields[i] = -1;
    expect_refused(c, {std::string("option ") + names[i] + " must be >= 0", "but is -1"});
  }
}

TEST(CausalConv3dCatPadErrors, OutOfTheWrongShape) {
  for (int d = 0; d < 5; ++d) {
    BadCall c;
    c.out.view.shape[d] -= 1;
    expect_refused(c, {"out.shape[" + std::to_string(d) + "] must be " + std::to_string(c.out.view.shape[d] + 1),
                       "but is " + std::to_string(c.out.view.shape[d])});
  }
}

TEST(CausalConv3dCatPadErrors, LayoutsThatDifferOrAreNeither) {
  const Case ncthw{{2, 3, 2, 4, 5}, 2, 1, 1, 1, 1, 2, 0};
  Case cl = ncthw;
  cl.channels_last = true;
  {  // out channels-last beside an NCTHW x
    BadCall c(ncthw);
    const auto st = dense_strides(ncthw.out_shape(), true);
    for (int d = 0; d < 5; ++d) c.out.view.strides[d] = st[d];
    expect_refused(c, {"out.stride(", "(NCTHW contiguous, the layout of x)"});
  }
  {  // cache NCTHW beside a channels-last x
    BadCall c(cl);
    const auto st = dense_strides(cl.cache_shape(), false);
    for (int d = 0; d < 5; ++d) c.cache.view.strides[d] = st[d];
    expect_refused(c, {"cache.stride(", "channels-last-3d"});
  }
  {  // x [B, C, T, H, W] stored as [B, C, H, W, T]: neither layout
    BadCall c(ncthw);
    const auto& s = ncthw.x;
    c.x.view.strides[2] = 1;
    c.x.view.strides[3] = s[4] * s[2];
    c.x.view.strides[4] = s[2];
    expect_refused(c, {"x must be NCTHW contiguous or channels-last-3d", "as NCTHW x.stride(", "as channels-last-3d"});
  }
}

TEST(CausalConv3dCatPadErrors, OutOverlappingAnInput) {
  {
    BadCall c;
    c.x.view.data = c.out.view.data;  // x inside out's bytes (out is larger)
    expect_refused(c, {"x overlaps out in memory"});
  }
  {
    BadCall c;
    c.cache.view.data = static_cast<uint8_t*>(c.out.view.data) + 2 * c.out.es();
    expect_refused(c, {"cache overlaps out in memory"});
  }
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

std::vector<Provenance> cuda_backends() {
  std::vector<Provenance> out;
  for (const KernelSpec* s : Registry::global().list("causal_conv3d_cat_pad"))
    if (s->provenance != Provenance::reference) out.push_back(s->provenance);
  return out;
}

// The storage bytes of out (dense in its layout) as the CPU reference writes them.
std::vector<uint8_t> reference_bytes(const Case& c, const HostTensor& x, const HostTensor* cache, int offset_elems) {
  HostTensor out(c.dtype, c.out_shape(), c.channels_last, offset_elems);
  causal_conv3d_cat_pad(x.view, cache ? cache->view : TensorView{}, out.view, c.options());
  const uint8_t* p = static_cast<const uint8_t*>(out.view.data);
  return std::vector<uint8_t>(p, p + product(c.out_shape()) * out.es());
}

void run_gpu_case(const Case& c, uint32_t seed, int offset_elems = 0) {
  SCOPED_TRACE(c.describe() + " offset " + std::to_string(offset_elems));
  std::mt19937 rng(seed);
  HostTensor x(c.dtype, c.x, c.channels_last, offset_elems);
  x.randomize(rng);
  HostTensor cache;
  if (c.ct >= 0) {
    cache = HostTensor(c.dtype, c.cache_shape(), c.channels_last, offset_elems);
    cache.randomize(rng);
  }
  const std::vector<uint8_t> want = reference_bytes(c, x, c.ct >= 0 ? &cache : nullptr, offset_elems);
  HostTensor out_like(c.dtype, c.out_shape(), c.channels_last, offset_elems);
  const DeviceTensor dx(x, true);
  std::unique_ptr<DeviceTensor> dc;
  if (c.ct >= 0) dc = std::make_unique<DeviceTensor>(cache, true);
  for (Provenance backend : cuda_backends())
    for (bool pdl : {true, false}) {
      DeviceTensor dout(out_like, false);
      CausalConv3dCatPadOptions o = c.options();
      o.use_pdl = pdl;
      o.dispatch.backend = backend;
      const std::string impl = causal_conv3d_cat_pad(dx.view(x), dc ? dc->view(cache) : TensorView{},
                                                     dout.view(out_like), o);
      check_cu(jit::require_cuda_driver().cuCtxSynchronize(), "sync");
      const CausalConv3dCatPadCall call =
          match_causal_conv3d_cat_pad(dx.view(x), dc ? dc->view(cache) : TensorView{}, dout.view(out_like), o);
      EXPECT_EQ(dout.compare(want, x.es()), "") << impl << " (template key "
                                                 << explain_causal_conv3d_cat_pad(call).template_key << ")";
    }
}

// The issue's (C, T, H, W) x cache time {1, 2}, padding (1, 1, 1, 1, ct, 0), at full size, and
// the SGLang reference point [1, 192, 2, 360, 640] with a 2-frame cache; bf16, both layouts.
TEST_F(CausalConv3dCatPadGpu, IssueShapesAreByteEqualToTheReference) {
  const std::vector<std::vector<int64_t>> shapes = {
      {1, 1024, 1, 30, 52}, {1, 1024, 2, 60, 104}, {1, 512, 4, 120, 208}, {1, 256, 4, 240, 416}};
  uint32_t seed = 1000;
  for (const auto& s : shapes)
    for (int64_t ct : {1, 2}) run_gpu_case({s, ct, 1, 1, 1, 1, ct, 0}, seed++);
  run_gpu_case({{1, 192, 2, 360, 640}, 2, 1, 1, 1, 1, 2, 0}, seed++);
  run_gpu_case({{1, 192, 2, 360, 640}, 2, 1, 1, 1, 1, 2, 0, DType::bf16, true}, seed++);
  run_gpu_case({{1, 512, 4, 120, 208}, 2, 1, 1, 1, 1, 2, 0, DType::bf16, true}, seed++);
}

TEST_F(CausalConv3dCatPadGpu, OddSizesLayoutsDtypesAndMisalignedPointers) {
  uint32_t seed = 2000;
  for (DType dt : {DType::bf16, DType::f16, DType::f32})
    for (bool cl : {false, true})
      for (int offset : {0, 1, 3}) {
        run_gpu_case({{1, 3, 5, 7, 9}, 3, 2, 1, 0, 3, 4, 2, dt, cl}, seed++, offset);    // asymmetric, dl > ct, dr > 0
        run_gpu_case({{2, 5, 3, 4, 7}, -1, 1, 2, 1, 0, 2, 0, dt, cl}, seed++, offset);   // no cache
        run_gpu_case({{1, 7, 1, 3, 3}, 2, 3, 0, 2, 2, 5, 1, dt, cl}, seed++, offset);    // zero frames
        run_gpu_case({{2, 1, 2, 3, 5}, 1, 1, 1, 1, 1, 1, 0, dt, cl}, seed++, offset);    // C = 1
        run_gpu_case({{1, 2, 2, 1, 1}, 2, 0, 7, 0, 0, 2, 3, dt, cl}, seed++, offset);    // H = W = 1
        run_gpu_case({{1, 33, 2, 17, 61}, 1, 3, 2, 1, 1, 1, 0, dt, cl}, seed++, offset);  // odd widths
        run_gpu_case({{1, 64, 2, 30, 52}, 2, 1, 1, 1, 1, 2, 0, dt, cl}, seed++, offset);  // 16-byte rows (cl)
        run_gpu_case({{1, 16, 1, 8, 64}, 0, 8, 8, 0, 0, 0, 0, dt, cl}, seed++, offset);   // aligned source and out
      }
  run_gpu_case({{0, 4, 2, 3, 5}, 1, 1, 1, 1, 1, 1, 0}, seed++);  // empty out: no launch
  run_gpu_case({{1, 3, 0, 3, 5}, 2, 1, 1, 1, 1, 3, 1}, seed++);  // T = 0
  run_gpu_case({{1, 3, 2, 4, 0}, 1, 1, 1, 1, 1, 1, 0}, seed++);  // W = 0: zeros
}

// Both kernels launched directly on a 3-block grid that loops (the op launches the 32-bit kernel
// over the whole output and the 64-bit one only from 2^31 units), NCTHW rows of 9 + 3 elements
// (every phase), parameters filled here from the row model of kernels/causal_conv3d_cat_pad.cuh.
TEST_F(CausalConv3dCatPadGpu, BothIndexWidthsOnAGridThatLoops) {
  const Case c{{2, 3, 3, 5, 9}, 2, 1, 2, 1, 1, 3, 1};
  std::mt19937 rng(3000);
  HostTensor x(c.dtype, c.x, false), cache(c.dtype, c.cache_shape(), false), out_like(c.dtype, c.out_shape(), false);
  x.randomize(rng);
  cache.randomize(rng);
  const std::vector<uint8_t> want = reference_bytes(c, x, &cache, 0);
  const DeviceTensor dx(x, true), dc(cache, true);
  for (bool index64 : {false, true}) {
    jit::KernelRequest r;
    r.header = "causal_conv3d_cat_pad.cuh";
    r.function = "ditops::causal_conv3d_cat_pad";
    r.template_args = std::string("ditops::kernel::bf16, false, ") + (index64 ? "true" : "false");
    r.params_type = "ditops::CausalConv3dCatPadParams";
    r.template_key = std::string("test:") + (index64 ? "64" : "32");
    const jit::LoadedKernel& kernel = jit::jit_kernel(r, 0);
    DeviceTensor dout(out_like, false);
    CausalConv3dCatPadParams p{};
    p.x = dx.view(x).data;
    p.cache = dc.view(cache).data;
    p.out = dout.view(out_like).data;
    const auto s = c.out_shape();
    p.rows_out = s[3];
    p.frames_out = s[2];
    p.row_elems = s[4];
    p.head = c.wl;
    p.run = c.x[4];
    p.src_rows = c.x[3];
    p.x_frames = c.x[2];
    p.cache_frames = c.ct;
    p.frame_offset = c.dl - c.ct;
    p.row_offset = c.ht;
    p.row_windows = (s[4] * 2 + 14 + 15) / 16;
    p.units = s[0] * s[1] * s[2] * s[3] * p.row_windows;
    ccp_set_divisors(p);
    jit::launch(kernel, 3, 256, &p, sizeof p, nullptr, false);
    check_cu(jit::require_cuda_driver().cuCtxSynchronize(), "sync");
    EXPECT_EQ(dout.compare(want, 2), "") << (index64 ? "64" : "32") << "-bit indices";
  }
}

}  // namespace
