// causal_conv3d_cat_pad's cases: the Cosmos3 shapes (C, T, H, W) x cache time {1, 2}
// with padding (1, 1, 1, 1, ct, 0) and the SGLang point [1, 192, 2, 360, 640] (large: on the
// device run), scaled-down copies for the CPU, channels-last-3d, odd sizes, asymmetric padding,
// dl > ct, dr > 0, no cache, every dtype, pointers off 16 bytes; empty, overlapping (refused) and
// invalid calls. Bit-exact: bytes equal.
#include <array>

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
  OpCase c;
  c.op = "causal_conv3d_cat_pad";
  c.kind = kind;
  c.seed = seed;
  const auto& p = s.pad;
  c.name = std::string(dtype_name(s.dtype)) + "_" + dims(s.x) + (s.ct < 0 ? "_nocache" : "_ct" + std::to_string(s.ct)) +
           "_pad" + dims(p) + (s.channels_last ? "_cl" : "") + (s.misalign ? "_off" + std::to_string(s.misalign) : "");
  const char* names[] = {"pad_w_left", "pad_w_right", "pad_h_top", "pad_h_bottom", "pad_t_left", "pad_t_right"};
  for (int i = 0; i < 6; ++i) c.options.emplace_back(names[i], std::to_string(p[i]));
  TensorCase x{"x", s.dtype, s.x, layout_strides(s.x, s.channels_last)};
  x.offset = s.misalign;
  c.tensors.push_back(x);
  if (s.ct >= 0) {
    const std::vector<int64_t> cs = {s.x[0], s.x[1], s.ct, s.x[3], s.x[4]};
    TensorCase cache{"cache", s.dtype, cs, layout_strides(cs, s.channels_last)};
    cache.offset = s.misalign;
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
  add({{0, 4, 2, 3, 5}, 1, {1, 1, 1, 1, 1, 0}}, CaseKind::empty);  // B = 0: nothing to write
  add({{1, 3, 0, 3, 5}, 2, {1, 1, 1, 1, 3, 1}}, CaseKind::odd);    // T = 0: cache frames and zeros
  add({{1, 3, 2, 4, 0}, 1, {1, 1, 1, 1, 1, 0}}, CaseKind::odd);    // W = 0: zeros

  // out overlapping an input: refused.
  OpCase over = ccp_case({{1, 2, 2, 3, 4}, 1, {1, 1, 1, 1, 1, 0}}, CaseKind::aliased, seed++);
  over.name = "out_overlaps_x";
  over.tensors[2].storage = "x";
  over.invalid = {"x overlaps out in memory"};
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
  c.name = "out_channels_last_beside_ncthw_x";
  c.tensors[2].strides = layout_strides(c.tensors[2].shape, true);
  c.invalid = {"out.stride(", "NCTHW contiguous, the layout of x"};
  out.push_back(c);
  return out;
}

const CaseSet kCases("causal_conv3d_cat_pad", make);

}  // namespace
}  // namespace ditops::optest
