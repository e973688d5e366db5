// causal_conv3d_cat_pad's cases: the Cosmos3 shapes (C, T, H, W) x cache time {1, 2}
// with padding (1, 1, 1, 1, ct, 0) and the SGLang point [1, 192, 2, 360, 640] (large: on the
// device run), scaled-down copies for the CPU, channels-last-3d, odd sizes, asymmetric padding,
// dl > ct, dr > 0, no cache, every dtype, pointers off 16 bytes; empty, overlapping (refused) and
// invalid calls; the bespoke tests' odd sizes, layouts, dtypes and pointer offsets with and without
// PDL, extent-1 dims of any stride, empty tensors of any strides, random bit patterns (NaN payloads,
// -0). Bit-exact: bytes equal. The oracle below: torch.cat([cache, x], 2) then F.pad, element by
// element (raw bits copied, zeros where padded).
#include <array>
#include <cstring>

#include "op_test_driver.h"

namespace ditops::optest {
namespace {

struct Ccp {
  std::vector<int64_t> x;  // [B, C, T, H, W]
  int64_t ct = 0;          // cache frames; -1: no cache
  std::vector<int64_t> pad = {0, 0, 0, 0, 0, 0};  // F.pad order (wl, wr, ht, hb, dl, dr)
  DType dtype = DType::bf16;
  bool channels_last = false;
  int64_t misalign = 0;  // elements every pointer is moved off 16-byte alignment
  bool pdl = true;
  bool random_bits = false;  // x and cache: random bit patterns (NaN payloads, infinities, -0)
};

std::string dims(const std::vector<int64_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "x" : "") + std::to_string(v[i]);
  return s;
}

// Strides (elements) of a dense [B, C, T, H, W] in channels-last-3d order; empty for NCTHW.
std::vector<int64_t> layout_strides(const std::vector<int64_t>& s, bool channels_last) {
  if (!channels_last) return {};
  return {s[2] * s[3] * s[4] * s[1], 1, s[3] * s[4] * s[1], s[4] * s[1], s[1]};
}

OpCase ccp_case(const Ccp& s, CaseKind kind, uint32_t seed) {
  OpCase c{.op = "causal_conv3d_cat_pad", .kind = kind, .seed = seed};
  const auto& p = s.pad;
  c.name = std::string(dtype_name(s.dtype)) + "_" + dims(s.x) + (s.ct < 0 ? "_nocache" : "_ct" + std::to_string(s.ct)) +
           "_pad" + dims(p) + (s.channels_last ? "_cl" : "") + (s.misalign ? "_off" + std::to_string(s.misalign) : "") +
           (s.pdl ? "" : "_nopdl") + (s.random_bits ? "_bits" : "");
  if (!s.pdl) c.options.emplace_back("use_pdl", "false");
  const char* names[] = {"pad_w_left", "pad_w_right", "pad_h_top", "pad_h_bottom", "pad_t_left", "pad_t_right"};
  for (int i = 0; i < 6; ++i) c.options.emplace_back(names[i], std::to_string(p[i]));
  TensorCase x{"x", s.dtype, s.x, layout_strides(s.x, s.channels_last)};
  x.offset = s.misalign;
  if (s.random_bits) x.fill = Fill::special(1.0, 2);
  c.tensors.push_back(x);
  if (s.ct >= 0) {
    const std::vector<int64_t> cs = {s.x[0], s.x[1], s.ct, s.x[3], s.x[4]};
    TensorCase cache{"cache", s.dtype, cs, layout_strides(cs, s.channels_last)};
    cache.offset = s.misalign;
    if (s.random_bits) cache.fill = Fill::special(1.0, 2);
    c.tensors.push_back(cache);
  }
  const std::vector<int64_t> os = {s.x[0], s.x[1], s.x[2] + p[4] + p[5], s.x[3] + p[2] + p[3], s.x[4] + p[0] + p[1]};
  TensorCase out{"out", s.dtype, os, layout_strides(os, s.channels_last)};
  out.offset = s.misalign;
  c.tensors.push_back(out);
  int64_t n = 1;
  for (int64_t e : os) n *= e;
  c.large = n > (1 << 22);
  return c;
}

std::vector<OpCase> make() {
  std::vector<OpCase> out;
  uint32_t seed = 1;
  auto add = [&](const Ccp& s, CaseKind kind) { out.push_back(ccp_case(s, kind, seed++)); };
  // The shapes at full size (large), then scaled down for the CPU.
  for (const auto& [C, T, H, W] : std::vector<std::array<int64_t, 4>>{
           {1024, 1, 30, 52}, {1024, 2, 60, 104}, {512, 4, 120, 208}, {256, 4, 240, 416}})
    for (int64_t ct : {1, 2}) {
      add({{1, C, T, H, W}, ct, {1, 1, 1, 1, ct, 0}}, CaseKind::model);
      add({{1, C / 64, T, H / 2, W / 4}, ct, {1, 1, 1, 1, ct, 0}}, CaseKind::model);
    }
  add({{1, 192, 2, 360, 640}, 2, {1, 1, 1, 1, 2, 0}}, CaseKind::model);  // the SGLang reference point
  add({{1, 192, 2, 360, 640}, 2, {1, 1, 1, 1, 2, 0}, DType::bf16, true}, CaseKind::strided);
  add({{1, 512, 4, 120, 208}, 2, {1, 1, 1, 1, 2, 0}, DType::bf16, true}, CaseKind::strided);
  for (DType dt : {DType::f16, DType::bf16, DType::f32})
    for (bool cl : {false, true}) {
      const CaseKind layout = cl ? CaseKind::strided : CaseKind::odd;
      add({{1, 16, 2, 15, 26}, 2, {1, 1, 1, 1, 2, 0}, dt, cl}, cl ? CaseKind::strided : CaseKind::model);
      add({{1, 3, 5, 7, 9}, 3, {2, 1, 0, 3, 4, 2}, dt, cl}, layout);   // asymmetric, dl > ct, dr > 0
      add({{2, 5, 3, 4, 7}, -1, {1, 2, 1, 0, 2, 0}, dt, cl}, layout);  // no cache
      add({{1, 7, 1, 3, 3}, 2, {3, 0, 2, 2, 5, 1}, dt, cl}, layout);   // zero frames between
      add({{2, 1, 2, 3, 5}, 1, {1, 1, 1, 1, 1, 0}, dt, cl}, layout);   // C = 1: both layouts at once
      add({{1, 33, 2, 17, 61}, 1, {3, 2, 1, 1, 1, 0}, dt, cl}, layout);  // odd widths
      add({{1, 16, 1, 8, 64}, 0, {8, 8, 0, 0, 0, 0}, dt, cl}, layout);   // empty cache, aligned rows
      add({{3, 4, 2, 5, 13}, 2, {5, 2, 3, 0, 2, 0}, dt, cl, 1}, CaseKind::misaligned);
      add({{1, 9, 3, 2, 11}, 1, {1, 1, 1, 1, 1, 0}, dt, cl, 3}, CaseKind::misaligned);
    }
  // The bespoke tests' odd sizes on every dtype and layout: no cache without padding (a copy),
  // H = W = 1, an empty cache with x's time padding only; with special values in x and cache.
  for (DType dt : {DType::f16, DType::bf16, DType::f32})
    for (bool cl : {false, true}) {
      const CaseKind layout = cl ? CaseKind::strided : CaseKind::odd;
      add({{2, 5, 3, 4, 7}, -1, {0, 0, 0, 0, 0, 0}, dt, cl}, layout);
      add({{1, 2, 2, 1, 1}, 2, {0, 7, 0, 0, 2, 3}, dt, cl}, layout);
      add({{1, 9, 3, 2, 11}, 0, {1, 1, 1, 1, 0, 0}, dt, cl}, layout);
      add({{1, 3, 5, 7, 9}, 3, {2, 1, 0, 3, 4, 2}, dt, cl, 0, true, true}, layout);
    }
  // The shapes scaled down another way (C, H, W by 16, 2, 2 and more), both layouts.
  for (const auto& x : std::vector<std::vector<int64_t>>{
           {1, 1024, 1, 30, 52}, {1, 64, 2, 15, 26}, {1, 16, 4, 30, 52}, {1, 4, 4, 60, 104}})
    for (int64_t ct : {1, 2})
      for (bool cl : {false, true}) {
        OpCase c = ccp_case({x, ct, {1, 1, 1, 1, ct, 0}, DType::bf16, cl}, cl ? CaseKind::strided : CaseKind::model,
                            seed++);
        c.large = false;  // the CPU runs these (the first: 5M elements)
        bool seen = false;
        for (OpCase& o : out)
          if (o.name == c.name) seen = true, o.large = false;
        if (!seen) out.push_back(c);
      }
  // The GPU sweep: every dtype and layout, pointers 0, 1 and 3 elements off, with and without PDL.
  for (DType dt : {DType::bf16, DType::f16, DType::f32})
    for (bool cl : {false, true})
      for (int64_t off : {0, 1, 3})
        for (bool pdl : {true, false}) {
          const CaseKind kind = off ? CaseKind::misaligned : cl ? CaseKind::strided : CaseKind::odd;
          for (const Ccp& s : std::vector<Ccp>{{{1, 3, 5, 7, 9}, 3, {2, 1, 0, 3, 4, 2}},
                                                {{2, 5, 3, 4, 7}, -1, {1, 2, 1, 0, 2, 0}},
                                                {{1, 7, 1, 3, 3}, 2, {3, 0, 2, 2, 5, 1}},
                                                {{2, 1, 2, 3, 5}, 1, {1, 1, 1, 1, 1, 0}},
                                                {{1, 2, 2, 1, 1}, 2, {0, 7, 0, 0, 2, 3}},
                                                {{1, 33, 2, 17, 61}, 1, {3, 2, 1, 1, 1, 0}},
                                                {{1, 64, 2, 30, 52}, 2, {1, 1, 1, 1, 2, 0}},
                                                {{1, 16, 1, 8, 64}, 0, {8, 8, 0, 0, 0, 0}}}) {
            Ccp v = s;
            v.dtype = dt;
            v.channels_last = cl;
            v.misalign = off;
            v.pdl = pdl;
            OpCase c = ccp_case(v, kind, seed++);
            bool seen = false;
            for (const OpCase& o : out) seen = seen || o.name == c.name;
            if (!seen) out.push_back(c);
          }
        }
  // The kernels' own paths on every dtype and layout: rows on 16 bytes in frames shorter than a
  // warp's step (the aligned kernel's rows past its frame pair); frames back to back without
  // padding rows, so a window's second row takes its source from another frame or from x after
  // the cache (the general kernel's per-window path); rows under 16 bytes (windows over 3 rows);
  // NCTHW pads adding 2 elements to runs of 40 (the chunks kernel), frames back to back (its
  // per-window path where a chunk's two rows come from different frames) and pads (2, 0); runs of
  // 640 (SGLang's width: the chunks kernel at 1284- and 2568-byte rows) with pads (1, 1), frames
  // back to back, no cache and pointers off 16 bytes, and with pads adding 3 elements (the general
  // kernel at long rows).
  for (DType dt : {DType::bf16, DType::f16, DType::f32})
    for (bool cl : {false, true}) {
      const CaseKind layout = cl ? CaseKind::strided : CaseKind::odd;
      const int64_t w16 = 16 / static_cast<int64_t>(dtype_size(dt));  // W of one 16-byte row (NCTHW)
      add({{2, cl ? w16 : 5, 3, 1, cl ? 1 : w16}, 1, {0, 0, 0, 0, 2, 1}, dt, cl}, layout);
      add({{1, 4, 3, 6, 13}, 2, {1, 2, 0, 0, 2, 0}, dt, cl}, layout);
      add({{2, 3, 2, 5, 3}, 1, {0, 1, 0, 0, 1, 1}, dt, cl}, layout);
      add({{1, 3, 3, 5, 40}, 2, {1, 1, 0, 0, 2, 0}, dt, cl}, layout);
      add({{2, 2, 2, 4, 40}, 1, {2, 0, 1, 0, 1, 1}, dt, cl}, layout);
      add({{1, 2, 2, 3, 640}, 2, {1, 1, 1, 1, 2, 0}, dt, cl}, layout);
      add({{2, 2, 2, 3, 640}, 1, {1, 1, 0, 0, 1, 1}, dt, cl}, layout);
      add({{1, 3, 2, 2, 640}, -1, {1, 1, 1, 1, 1, 0}, dt, cl, 3}, CaseKind::misaligned);
      add({{1, 2, 2, 3, 640}, 1, {1, 2, 1, 0, 2, 0}, dt, cl}, layout);
    }
  // The shapes at full size without PDL (large: where a device compares them).
  for (size_t i = 0, n = out.size(); i < n; ++i)
    if (out[i].large) {
      OpCase c = option_variant(out[i], {{"use_pdl", "false"}}, "nopdl");
      out.push_back(c);
    }

  add({{0, 4, 2, 3, 5}, 1, {1, 1, 1, 1, 1, 0}}, CaseKind::empty);  // B = 0: nothing to write
  add({{1, 0, 2, 3, 5}, 1, {1, 1, 1, 1, 1, 0}}, CaseKind::empty);  // C = 0
  add({{1, 3, 0, 3, 5}, -1, {1, 1, 1, 1, 3, 1}}, CaseKind::odd);   // T = 0 and no cache: all zeros
  add({{1, 3, 2, 0, 5}, 1, {1, 1, 1, 1, 1, 0}}, CaseKind::odd);    // H = 0: zeros
  // An empty out returns at once, however large its other extents (found by libFuzzer).
  {
    const int64_t huge = int64_t{1} << 40;
    OpCase c = ccp_case({{1, huge, 1, 1, 0}, -1, {0, 0, 0, 0, 1, 1}}, CaseKind::empty, seed++);
    c.name = "empty_out_of_2_to_the_40_channels";
    out.push_back(c);
  }
  // Extent-1 dims may carry any stride (as PyTorch leaves them); tensors without elements take any
  // strides (torch's empty [1, 3, 0, 3, 5] has (45, 15, 15, 5, 1), neither layout's dense form).
  {
    OpCase c = ccp_case({{1, 4, 1, 3, 5}, 1, {1, 1, 1, 1, 1, 0}}, CaseKind::strided, seed++);
    c.name = "extent_one_dims_of_any_stride";
    c.tensors[0].strides = {12345, 15, 777, 5, 1};
    c.tensors[1].strides = {60, 15, 1, 5, 1};
    out.push_back(c);
    c = ccp_case({{1, 3, 0, 3, 5}, 0, {1, 1, 1, 1, 2, 1}, DType::bf16, true}, CaseKind::strided, seed++);
    c.name = "empty_inputs_of_torch_strides";
    c.tensors[0].strides = c.tensors[1].strides = {45, 15, 15, 5, 1};
    out.push_back(c);
  }
  add({{1, 3, 0, 3, 5}, 2, {1, 1, 1, 1, 3, 1}}, CaseKind::odd);    // T = 0: cache frames and zeros
  add({{1, 3, 2, 4, 0}, 1, {1, 1, 1, 1, 1, 0}}, CaseKind::odd);    // W = 0: zeros

  // out overlapping an input: refused.
  OpCase over = ccp_case({{1, 2, 2, 3, 4}, 1, {1, 1, 1, 1, 1, 0}}, CaseKind::aliased, seed++);
  over.name = "out_overlaps_x";
  over.tensors[2].storage = "x";
  over.invalid = {"x overlaps out in memory"};
  out.push_back(over);
  over = ccp_case({{2, 3, 2, 4, 5}, 2, {1, 1, 1, 1, 2, 0}}, CaseKind::aliased, seed++);
  over.name = "cache_inside_out";
  std::swap(over.tensors[1], over.tensors[2]);  // out before cache: it owns the buffer
  over.tensors[2].storage = "out";
  over.tensors[2].offset = 2;
  over.invalid = {"cache overlaps out in memory"};
  out.push_back(over);

  // Invalid inputs.
  const Ccp base{{1, 4, 2, 3, 5}, 2, {1, 1, 1, 1, 2, 0}};
  OpCase c = ccp_case(base, CaseKind::invalid, seed++);
  c.name = "cache_dtype_differs";
  c.tensors[1].dtype = DType::f16;
  c.invalid = {"cache.dtype must be bf16 (as x) but is f16"};
  out.push_back(c);
  c = ccp_case(base, CaseKind::invalid, seed++);
  c.name = "cache_channels_differ";
  c.tensors[1].shape[1] = 5;
  c.invalid = {"cache.shape[1] must equal C=4", "but is 5"};
  out.push_back(c);
  c = ccp_case(base, CaseKind::invalid, seed++);
  c.name = "cache_width_differs";
  c.tensors[1].shape[4] = 6;
  c.invalid = {"cache.shape[4] must equal W=5", "but is 6"};
  out.push_back(c);
  c = ccp_case({{1, 4, 2, 3, 5}, 2, {1, 1, 1, 1, 1, 0}}, CaseKind::invalid, seed++);
  c.name = "pad_t_left_below_cache_frames";
  c.invalid = {"pad_t_left must be >= cache.shape[2] = 2", "but is 1"};
  out.push_back(c);
  c = ccp_case({{1, 4, 2, 3, 5}, -1, {1, 1, 1, 1, 0, 0}}, CaseKind::invalid, seed++);
  c.name = "x_rank_4";
  c.tensors[0].shape = {4, 2, 3, 5};
  c.invalid = {"x must have rank 5 but has rank 4"};
  out.push_back(c);
  c = ccp_case({{1, 4, 2, 3, 5}, -1, {1, 1, 1, 1, 0, 0}}, CaseKind::invalid, seed++);
  c.name = "negative_padding";
  c.options[1].second = "-1";
  c.invalid = {"option pad_w_right must be >= 0", "but is -1"};
  out.push_back(c);
  c = ccp_case(base, CaseKind::invalid, seed++);
  c.name = "out_frames_differ";
  c.tensors[2].shape[2] -= 1;
  c.invalid = {"out.shape[2] must be 4 (x.shape[2] + pad_t_left + pad_t_right) but is 3"};
  out.push_back(c);
  c = ccp_case(base, CaseKind::invalid, seed++);
  c.name = "out_dtype_differs";
  c.tensors[2].dtype = DType::f16;
  c.invalid = {"out.dtype must be bf16 (as x) but is f16"};
  out.push_back(c);
  c = ccp_case(base, CaseKind::invalid, seed++);
  c.name = "i32_tensors";
  for (TensorCase& t : c.tensors) t.dtype = DType::i32;
  c.invalid = {"x.dtype must be bf16, f16 or f32 but is i32"};
  out.push_back(c);
  for (const auto& [d, name] : {std::pair<int, const char*>{0, "B"}, {3, "H"}}) {
    c = ccp_case(base, CaseKind::invalid, seed++);
    c.name = std::string("cache_") + name + "_differs";
    c.tensors[1].shape[d] += 1;
    c.invalid = {"cache.shape[" + std::to_string(d) + "] must equal " + name + "=" + std::to_string(base.x[d]) +
                 " (bound by x.shape[" + std::to_string(d) + "]) but is " + std::to_string(base.x[d] + 1)};
    out.push_back(c);
  }
  c = ccp_case(base, CaseKind::invalid, seed++);
  c.name = "cache_rank_6";
  c.tensors[1].shape.push_back(1);
  c.invalid = {"cache must have rank 5 but has rank 6"};
  out.push_back(c);
  c = ccp_case(base, CaseKind::invalid, seed++);
  c.name = "out_rank_3";
  c.tensors[2].shape = {1, 4, 4};
  c.tensors[2].strides.clear();
  c.invalid = {"out must have rank 5 but has rank 3"};
  out.push_back(c);
  c = ccp_case({{1, 4, 2, 3, 5}, -1, {1, 1, 1, 1, 0, 0}}, CaseKind::invalid, seed++);
  c.name = "cache_rank_0_with_data";
  c.tensors.insert(c.tensors.begin() + 1, TensorCase{"cache", DType::bf16, {}});
  c.invalid = {"cache has rank 0 but a data pointer"};
  out.push_back(c);
  const char* pads[] = {"pad_w_left", "pad_w_right", "pad_h_top", "pad_h_bottom", "pad_t_left", "pad_t_right"};
  for (int i : {0, 2, 3, 4, 5}) {
    c = ccp_case({{1, 4, 2, 3, 5}, -1, {1, 1, 1, 1, 0, 0}}, CaseKind::invalid, seed++);
    c.name = std::string("negative_") + pads[i];
    c.options[i].second = "-1";
    c.invalid = {std::string("option ") + pads[i] + " must be >= 0", "but is -1"};
    out.push_back(c);
  }
  for (int d : {0, 1, 3, 4}) {
    c = ccp_case(base, CaseKind::invalid, seed++);
    c.name = "out_dim_" + std::to_string(d) + "_short";
    c.tensors[2].shape[d] -= 1;
    c.invalid = {"out.shape[" + std::to_string(d) + "] must be " + std::to_string(c.tensors[2].shape[d] + 1),
                 "but is " + std::to_string(c.tensors[2].shape[d])};
    out.push_back(c);
  }
  {
    Ccp cl = base;
    cl.channels_last = true;
    c = ccp_case(cl, CaseKind::invalid, seed++);
    c.name = "cache_ncthw_beside_channels_last_x";
    c.tensors[1].strides = layout_strides(c.tensors[1].shape, false);
    if (c.tensors[1].strides.empty()) {
      const auto& sh = c.tensors[1].shape;
      c.tensors[1].strides = {sh[1] * sh[2] * sh[3] * sh[4], sh[2] * sh[3] * sh[4], sh[3] * sh[4], sh[4], 1};
    }
    c.invalid = {"cache.stride(", "channels-last-3d"};
    out.push_back(c);
  }
  c = ccp_case(base, CaseKind::invalid, seed++);
  c.name = "x_in_neither_layout";
  c.tensors[0].strides = {base.x[1] * base.x[2] * base.x[3] * base.x[4], base.x[2] * base.x[3] * base.x[4], 1,
                          base.x[4] * base.x[2], base.x[2]};  // [B, C, T, H, W] stored as [B, C, H, W, T]
  c.invalid = {"x must be NCTHW contiguous or channels-last-3d", "as NCTHW x.stride(", "as channels-last-3d"};
  out.push_back(c);
  c = ccp_case(base, CaseKind::invalid, seed++);
  c.name = "out_channels_last_beside_ncthw_x";
  c.tensors[2].strides = layout_strides(c.tensors[2].shape, true);
  c.invalid = {"out.stride(", "NCTHW contiguous, the layout of x"};
  out.push_back(c);
  // Every model case again with each pointer an element off its alignment.
  add_variants(out, {{"x", "cache", "out"}});
  return out;
}

const CaseSet kCases("causal_conv3d_cat_pad", make);

void ccp_oracle(OracleIo& io) {
  const int x = io.id("x"), cache = io.id("cache"), out = io.id("out");
  const std::vector<int64_t>& xs = io.shape(x);
  const std::vector<int64_t>& os = io.shape(out);
  const int64_t ct = cache >= 0 ? io.shape(cache)[2] : 0;
  const int64_t wl = static_cast<int64_t>(io.number("pad_w_left")), ht = static_cast<int64_t>(io.number("pad_h_top"));
  const int64_t lead = static_cast<int64_t>(io.number("pad_t_left")) - ct;  // F.pad's left time padding
  const int64_t T = xs[2], H = xs[3], W = xs[4];
  if (io.numel(out) == 0) return;  // however large the other extents
  int64_t i = 0;
  for (int64_t b = 0; b < os[0]; ++b)
    for (int64_t c = 0; c < os[1]; ++c)
      for (int64_t t = 0; t < os[2]; ++t)
        for (int64_t h = 0; h < os[3]; ++h)
          for (int64_t w = 0; w < os[4]; ++w, ++i) {
            const int64_t tc = t - lead, hs = h - ht, ws = w - wl;  // in cat(cache, x)
            uint64_t bits = 0;  // padding: +0
            if (tc >= 0 && tc < ct + T && hs >= 0 && hs < H && ws >= 0 && ws < W) {
              const bool from_cache = tc < ct;
              const int64_t frames = from_cache ? ct : T;
              const int64_t at = (((b * xs[1] + c) * frames + (from_cache ? tc : tc - ct)) * H + hs) * W + ws;
              bits = io.bits(from_cache ? cache : x, at);
            }
            io.expect_bits(out, i, bits);
          }
}

const OracleSet kOracle("causal_conv3d_cat_pad", {"cat then pad, element by element", ccp_oracle});

}  // namespace
}  // namespace ditops::optest
