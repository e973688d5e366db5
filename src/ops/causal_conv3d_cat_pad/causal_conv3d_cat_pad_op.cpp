// causal_conv3d_cat_pad: argument matching, the kernel key and request, the launch, the CPU
// reference, the registry entries and the op's description.
#include <algorithm>
#include <cstring>

#include "core/builtin_ops.h"
#include "core/implementation.h"
#include "core/matcher.h"
#include "core/op_builder.h"
#include "ditops/causal_conv3d_cat_pad.h"
#include "jit/cuda_driver.h"
#include "jit/jit.h"
#include "jit/kernel_family.h"
#include "kernels/causal_conv3d_cat_pad.cuh"

namespace ditops {

namespace {

constexpr const char* kOp = "causal_conv3d_cat_pad";

// Physical order of the logical dims [B, C, T, H, W], outermost first.
constexpr int kNcthw[5] = {0, 1, 2, 3, 4};
constexpr int kNdhwc[5] = {0, 2, 3, 4, 1};

const char* layout_name(bool channels_last) {
  return channels_last ? "channels-last-3d (the strides of a dense [B, T, H, W, C])" : "NCTHW contiguous";
}

// The first dim of t whose stride breaks `channels_last`'s layout (-1 if none), with the stride
// it should have.
int layout_mismatch(const TensorView& t, bool channels_last, int64_t* expected) {
  return dense_layout_mismatch(t, channels_last ? kNdhwc : kNcthw, expected);
}

bool in_layout(const TensorView& t, bool channels_last) {
  int64_t unused = 0;
  return layout_mismatch(t, channels_last, &unused) < 0;
}

void require_layout(const Matcher& m, const TensorView& t, const std::string& name, bool channels_last) {
  int64_t expected = 0;
  const int d = layout_mismatch(t, channels_last, &expected);
  if (d >= 0)
    m.fail(name + ".stride(" + std::to_string(d) + ") must be " + std::to_string(expected) + " (" +
           layout_name(channels_last) + ", the layout of x) but is " + std::to_string(t.strides[d]) + " (" +
           t.describe() + ")");
}

void require_padding(const Matcher& m, const char* name, int64_t value) {
  if (value < 0)
    m.fail(std::string("option ") + name + " must be >= 0 (negative padding, i.e. cropping, is not supported) but is " +
           std::to_string(value));
}

// a + b + c for an extent of out, failing when it leaves int64.
int64_t padded_extent(const Matcher& m, int64_t extent, int64_t before, int64_t after, const char* what) {
  int64_t v = 0;
  if (__builtin_add_overflow(extent, before, &v) || __builtin_add_overflow(v, after, &v))
    m.fail(std::string("out's ") + what + " extent overflows int64");
  return v;
}

void complete(CausalConv3dCatPadCall& call, Matcher& m);  // the op's own rules, after the slots'

// The op described once: its slots state the checks every call gets (core/op_builder.h).
OpBuilder<CausalConv3dCatPadCall> describe() {
  using C = CausalConv3dCatPadCall;
  OpBuilder<C> b(
      kOp, "out = F.pad(torch.cat([cache, x], 2), (wl, wr, ht, hb, dl - ct, dr)) in one pass (causal Conv3D input)",
      "x [B, C, T, H, W], optional cache [B, C, ct, H, W]; F.pad's padding (wl, wr, ht, hb, dl, dr) is the options "
      "pad_w_left, pad_w_right, pad_h_top, pad_h_bottom, pad_t_left (dl >= ct), pad_t_right; NCTHW contiguous or "
      "channels-last-3d, one layout for every tensor; out must not overlap an input. Bit-exact (a copy). "
      "include/ditops/causal_conv3d_cat_pad.h, docs/causal_conv3d_cat_pad.md");
  b.dims("B=1,C=192,T=2,H=360,W=640,CT=2");  // the Cosmos3 decoder call of the issue
  // The layout (NCTHW or channels-last-3d, x decides) and out's padded extents are the op's own rules.
  b.tensor<&C::x>({.dtypes = "bf16|f16|f32", .shape = "B,C,T,H,W"});
  b.tensor<&C::cache>({.optional = true, .keyword = true, .dtypes = "=x", .shape = "B,C,CT,H,W",
                       .doc = "cached past frames, prepended along time (absent: none)"});
  // out's `shape` is its extents at zero padding (the CLI's example call); `alloc` has the rule.
  b.tensor<&C::out>({.role = TensorRole::out, .keyword = true, .dtypes = "=x", .shape = "B,C,T,H,W",
                     .alloc = "dim(x,0),dim(x,1),dim(x,2)+pad_t_left+pad_t_right,dim(x,3)+pad_h_top+pad_h_bottom,"
                              "dim(x,4)+pad_w_left+pad_w_right",
                     .alloc_format = "x",
                     .doc = "[B, C, T + pad_t_left + pad_t_right, H + pad_h_top + pad_h_bottom, W + pad_w_left + "
                            "pad_w_right], in x's layout",
                     .own = "shape"});
  b.option<&CausalConv3dCatPadOptions::pad_w_left>("zeros before W (F.pad padding[0])");
  b.option<&CausalConv3dCatPadOptions::pad_w_right>("zeros after W (F.pad padding[1])");
  b.option<&CausalConv3dCatPadOptions::pad_h_top>("zeros before H (F.pad padding[2])");
  b.option<&CausalConv3dCatPadOptions::pad_h_bottom>("zeros after H (F.pad padding[3])");
  b.option<&CausalConv3dCatPadOptions::pad_t_left>(
      "the conv's whole left time padding dl (>= the cache's frames ct; F.pad gets dl - ct)");
  b.option<&CausalConv3dCatPadOptions::pad_t_right>("zero frames after T (F.pad padding[5])");
  b.pdl_option<&CausalConv3dCatPadOptions::use_pdl>();
  b.complete(complete);
  return b;
}

void complete(CausalConv3dCatPadCall& call, Matcher& m) {
  const bool has_cache = call.cache.rank != 0;
  m.tensor("out", call.out).rank(5);

  const CausalConv3dCatPadOptions& o = call.options;
  require_padding(m, "pad_w_left", o.pad_w_left);
  require_padding(m, "pad_w_right", o.pad_w_right);
  require_padding(m, "pad_h_top", o.pad_h_top);
  require_padding(m, "pad_h_bottom", o.pad_h_bottom);
  require_padding(m, "pad_t_left", o.pad_t_left);
  require_padding(m, "pad_t_right", o.pad_t_right);
  const int64_t ct = has_cache ? call.cache.shape[2] : 0;
  if (o.pad_t_left < ct)
    m.fail("option pad_t_left must be >= cache.shape[2] = " + std::to_string(ct) +
           " (the cache supplies that many of the left time padding frames: F.pad takes pad_t_left - " +
           std::to_string(ct) + ") but is " + std::to_string(o.pad_t_left));

  // out = [B, C, T + pad_t_left + pad_t_right, H + pad_h_top + pad_h_bottom, W + pad_w_left + pad_w_right]
  const int64_t want[5] = {call.x.shape[0], call.x.shape[1],
                           padded_extent(m, call.x.shape[2], o.pad_t_left, o.pad_t_right, "time"),
                           padded_extent(m, call.x.shape[3], o.pad_h_top, o.pad_h_bottom, "height"),
                           padded_extent(m, call.x.shape[4], o.pad_w_left, o.pad_w_right, "width")};
  const char* rule[5] = {"x.shape[0]", "x.shape[1]", "x.shape[2] + pad_t_left + pad_t_right",
                         "x.shape[3] + pad_h_top + pad_h_bottom", "x.shape[4] + pad_w_left + pad_w_right"};
  for (int d = 0; d < 5; ++d)
    if (call.out.shape[d] != want[d])
      m.fail("out.shape[" + std::to_string(d) + "] must be " + std::to_string(want[d]) + " (" + rule[d] + ") but is " +
             std::to_string(call.out.shape[d]) + " (" + call.out.describe() + ")");

  // Layout: x decides (where x is both, e.g. C = 1, the one out and cache share; NCTHW first).
  const bool x_ncthw = in_layout(call.x, false), x_ndhwc = in_layout(call.x, true);
  if (!x_ncthw && !x_ndhwc) {
    int64_t e1 = 0, e2 = 0;
    const int d1 = layout_mismatch(call.x, false, &e1), d2 = layout_mismatch(call.x, true, &e2);
    m.fail("x must be NCTHW contiguous or channels-last-3d: as NCTHW x.stride(" + std::to_string(d1) + ") must be " +
           std::to_string(e1) + " but is " + std::to_string(call.x.strides[d1]) + ", as channels-last-3d x.stride(" +
           std::to_string(d2) + ") must be " + std::to_string(e2) + " but is " + std::to_string(call.x.strides[d2]) +
           " (" + call.x.describe() + ")");
  }
  bool channels_last = !x_ncthw;
  if (x_ncthw && x_ndhwc) {
    auto fits = [&](bool cl) { return in_layout(call.out, cl) && (!has_cache || in_layout(call.cache, cl)); };
    channels_last = !fits(false) && fits(true);
  }
  if (has_cache) require_layout(m, call.cache, "cache", channels_last);
  require_layout(m, call.out, "out", channels_last);

  call.out_numel = call.out.numel();
  if (!has_cache) call.cache = TensorView{};
  call.has_cache = has_cache;
  call.channels_last = channels_last;
  call.batch = call.x.shape[0];
  call.channels = call.x.shape[1];
  call.frames = call.x.shape[2];
  call.height = call.x.shape[3];
  call.width = call.x.shape[4];
  call.cache_frames = ct;
  call.out_frames = want[2];
  call.out_height = want[3];
  call.out_width = want[4];
}

}  // namespace

// ---------------------------------------------------------------- CPU reference

void causal_conv3d_cat_pad_reference(const CausalConv3dCatPadCall& c) {
  const size_t es = dtype_size(c.out.dtype);
  const auto* xb = static_cast<const unsigned char*>(c.x.data);
  const auto* cb = static_cast<const unsigned char*>(c.cache.data);
  auto* ob = static_cast<unsigned char*>(c.out.data);
  const CausalConv3dCatPadOptions& o = c.options;
  const int64_t frame_offset = o.pad_t_left - c.cache_frames;  // output frames before the first cache frame
  // No element: return before the outer loops, which may be long ([1, 2^40, 1, 1, 0]; libFuzzer).
  for (int64_t extent : {c.batch, c.channels, c.out_frames, c.out_height, c.out_width})
    if (extent == 0) return;
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t ch = 0; ch < c.channels; ++ch)
      for (int64_t t = 0; t < c.out_frames; ++t)
        for (int64_t h = 0; h < c.out_height; ++h)
          for (int64_t w = 0; w < c.out_width; ++w) {
            unsigned char* dst = ob + es * (b * c.out.strides[0] + ch * c.out.strides[1] + t * c.out.strides[2] +
                                            h * c.out.strides[3] + w * c.out.strides[4]);
            const int64_t st = t - frame_offset, ih = h - o.pad_h_top, iw = w - o.pad_w_left;
            const bool inside = st >= 0 && st < c.cache_frames + c.frames && ih >= 0 && ih < c.height && iw >= 0 &&
                                iw < c.width;
            if (!inside) {
              std::memset(dst, 0, es);
              continue;
            }
            const TensorView& src = st < c.cache_frames ? c.cache : c.x;
            const unsigned char* base = st < c.cache_frames ? cb : xb;
            const int64_t ts = st < c.cache_frames ? st : st - c.cache_frames;
            std::memcpy(dst,
                        base + es * (b * src.strides[0] + ch * src.strides[1] + ts * src.strides[2] +
                                     ih * src.strides[3] + iw * src.strides[4]),
                        es);
          }
}

// ---------------------------------------------------------------- CUDA kernel

namespace {

constexpr int kCcpThreads = 256;
// Resident blocks of 256 threads per SM each kernel is compiled for (its register cap: 64 and 51
// per thread): the general kernel's loads of a step are 32 bytes per thread in flight, so 1024
// threads per SM keep 32 KB of loads in flight; the aligned kernel's 64 bytes at 1280; the parts
// kernel's up to 128 bytes (four granules per window, two windows) at 768 (78 registers; at 64 it
// spills); the chunks kernel's 64 bytes (four granules a lane at 2 windows) at 1024 (56 registers
// at 2 windows a lane, 2- and 4-byte, no spills: ptxas 13.0 -v, sm_90a).
constexpr int kCcpMinBlocksGeneral = 4;
constexpr int kCcpMinBlocksAligned = 5;
constexpr int kCcpMinBlocksParts = 3;
constexpr int kCcpMinBlocksChunks = 4;

struct CcpKernelKey {
  int elem_bytes = 2;        // 2 (bf16, f16) or 4 (f32): the kernel copies bits
  int path = kCcpGeneral;    // ccp_path: general, aligned (one load per window), parts or chunks
  bool index64 = false;      // ccp_index64: out of 2^31 - 64 bytes or more
  bool pdl = true;

  // "2-byte,parts,index32,pdl"
  std::string to_string() const {
    return std::to_string(elem_bytes) + "-byte," + path_name() + (index64 ? ",index64" : ",index32") +
           (pdl ? ",pdl" : ",nopdl");
  }
  const char* path_name() const {
    return path == kCcpAligned ? "aligned" : path == kCcpParts ? "parts" : path == kCcpChunks ? "chunks" : "general";
  }
  uint64_t packed() const { return pack_key({{elem_bytes, 5}, {path, 4}, index64, pdl}); }
};

// The row model of kernels/causal_conv3d_cat_pad.cuh with the call's pointers, and its number of
// rows; nothing when out is empty (its extents may overflow any product of them).
CausalConv3dCatPadParams row_model(const CausalConv3dCatPadCall& c, int64_t* rows) {
  CausalConv3dCatPadParams p{};
  *rows = 0;
  if (c.out_numel == 0) return p;
  const int64_t es = static_cast<int64_t>(dtype_size(c.out.dtype));
  const int64_t inner = (c.channels_last ? c.channels : 1) * es;  // bytes per W position in a row
  p.x = c.x.data;
  p.cache = c.has_cache && c.cache_frames > 0 ? c.cache.data : nullptr;
  p.out = c.out.data;
  p.row_bytes = c.out_width * inner;
  p.head_bytes = c.options.pad_w_left * inner;
  p.run_bytes = c.width * inner;
  p.rows_out = c.out_height;
  p.frames_out = c.out_frames;
  p.src_rows = c.height;
  p.x_frames = c.frames;
  p.cache_frames = c.cache_frames;
  p.frame_offset = c.options.pad_t_left - c.cache_frames;
  p.row_offset = c.options.pad_h_top;
  *rows = (c.channels_last ? c.batch : c.batch * c.channels) * c.out_frames * c.out_height;
  return p;
}

CcpKernelKey key_for(const CausalConv3dCatPadCall& c, const DeviceInfo& device) {
  int64_t rows = 0;
  const CausalConv3dCatPadParams p = row_model(c, &rows);
  CcpKernelKey key;
  key.elem_bytes = static_cast<int>(dtype_size(c.out.dtype));
  key.path = ccp_path(p);
  key.index64 = ccp_index64(rows * p.row_bytes);
  key.pdl = c.options.use_pdl && (device.features & kFeaturePdl);
  return key;
}

KernelRequest ccp_kernel_request(const CcpKernelKey& key) {
  return {.header = "causal_conv3d_cat_pad.cuh",
          .function = "ditops::causal_conv3d_cat_pad",
          .template_args = jit::kernel_args(key.elem_bytes, key.path, key.pdl, key.index64),
          .params_type = "ditops::CausalConv3dCatPadParams",
          .max_threads = kCcpThreads,
          .min_blocks = key.index64                   ? 0  // 64-bit: would spill
                        : key.path == kCcpAligned ? kCcpMinBlocksAligned
                        : key.path == kCcpParts   ? kCcpMinBlocksParts
                        : key.path == kCcpChunks  ? kCcpMinBlocksChunks
                                                  : kCcpMinBlocksGeneral,
          .template_key = std::string(kOp) + ":" + key.to_string()};
}

// Keys covering every code path: both element sizes, the four kernels, both index widths, with
// and without PDL.
std::vector<CcpKernelKey> ccp_variant_keys() {
  return {{2, kCcpGeneral, false, true}, {2, kCcpAligned, true, false}, {4, kCcpGeneral, true, false},
          {4, kCcpAligned, false, true}, {2, kCcpGeneral, true, true},  {4, kCcpAligned, true, false},
          {2, kCcpParts, false, true},   {4, kCcpParts, false, false},  {2, kCcpParts, true, false},
          {4, kCcpParts, true, true},    {2, kCcpChunks, false, true}, {4, kCcpChunks, false, false},
          {2, kCcpChunks, true, false},  {4, kCcpChunks, true, true}};
}

void launch_causal_conv3d_cat_pad(const CausalConv3dCatPadCall& c, const CcpKernelKey& key,
                                  const jit::LoadedKernel& kernel) {
  int64_t rows = 0;
  CausalConv3dCatPadParams p = row_model(c, &rows);
  ccp_finish_params(p, rows, key.index64);
  // Each warp takes a contiguous range of steps (32 x unroll windows). The aligned, parts and
  // chunks kernels launch one step per warp, the general kernel at most the resident grid
  // (ccp_tune.cu, H100, 2670cc6: chunks at 2 windows 243.3 us one-step against 267.6 resident at
  // SGLang's bf16 point; aligned 238.9 against 257.5 at its channels-last point; the general
  // kernel one-step from 7 % faster to 4 % slower than resident across the NCTHW cases).
  const int64_t step = 32 * ccp_unroll(key.path);
  const int64_t warps = (p.windows + step - 1) / step;
  const int64_t cover = (warps + kCcpThreads / 32 - 1) / (kCcpThreads / 32);
  const int64_t resident = std::max<int64_t>(1, static_cast<int64_t>(kernel.blocks_per_sm) * kernel.multiprocessors);
  const int64_t grid = std::clamp<int64_t>(key.path == kCcpGeneral ? std::min(cover, resident) : cover, 1, 0x7fffffff);
  jit::launch(kernel, static_cast<unsigned>(grid), kCcpThreads, &p, sizeof p, static_cast<CUstream>(c.stream), key.pdl);
}

constexpr KernelFunctions<CausalConv3dCatPadCall, CcpKernelKey> kKernels{
    .key = key_for, .request = ccp_kernel_request, .launch = launch_causal_conv3d_cat_pad,
    .nothing_to_do = [](const CausalConv3dCatPadCall& c) { return c.out_numel == 0; },
    .variant_keys = ccp_variant_keys};
using Kernels = OpKernels<describe, kKernels>;

void register_causal_conv3d_cat_pad(Registry& registry) {
  const std::string oracle =
      "eager PyTorch `F.pad(torch.cat([cache, x], 2), (wl, wr, ht, hb, dl - ct, dr))` (a copy plus zero fill: "
      "every bit, fp16, bf16 and fp32)";
  add_jit<Kernels>(
      registry,
      {.contract = Contract::bit_exact(oracle).verified(
           "H200 (sm_90), scripts/device_run.sh verify at bf0f87e: the window kernels torch.equal in 49 of 49 cases of bench/causal_conv3d_cat_pad_torch.py (both "
           "layouts, f16/bf16/f32, graph replay) and the GPU tests and driver parts"),
       .description =
           "one pass over out's 16-byte windows of memory, a warp over consecutive windows: 16-byte stores, aligned "
           "16-byte loads shifted in registers, the next granule from the next lane; a copy kernel where rows, heads "
           "and pointers lie on 16 bytes; NVRTC at first use"});
  add_reference<Kernels>(
      registry, causal_conv3d_cat_pad_reference,
      Contract::bit_exact(oracle + "; the portable oracle")
          .verified("on every CI run (CPU) by the op's tests; on the GPU every CUDA implementation "
                    "matched it within each case's bound (H200 (sm_90), scripts/device_run.sh ops, "
                    "at 8dea671)"),
      "CPU reference: every output element from its source through the views' strides, or 0");
}

}  // namespace

DITOPS_OP_ENTRIES(causal_conv3d_cat_pad, Kernels, register_causal_conv3d_cat_pad);

}  // namespace ditops
