// fp8_rowwise_quant's cases: the model sites (FLUX.1's attention output, FF-down input and single
// block cat(attn, gelu(mlp)) at 4608 tokens; Wan 14B's attention and FF widths; Qwen-Image's CFG
// batch), scaled down for the CPU; odd widths (the scalar path), f16, rows of their own stride (a
// padded row, a column slice of a wider buffer, [B, S, K] views), zero rows, special values, the
// scale's rounding points (ties, the smallest amax with a nonzero scale, f16 scales in the
// subnormal range where fp32 then f16 rounding matters), an empty call, refusals and a row too wide
// for the kernel. act=none is byte-equal to the reference; act=gelu_tanh allows the reference's
// correctly rounded tanh against CUDA's tanhf (a GELU value one ulp away: one e4m3 code, and where
// it is a row's amax its scale by one ulp of the dtype). act=swiglu (FLUX.2's FF and single blocks,
// x = [gate | up], out N = K / 2 columns of it) allows the reference's exp against CUDA's expf: a
// silu value one ulp away, the product two, so two e4m3 codes and the scale four ulps of the dtype.
//
// The oracles (below): the recipe in double, exactly, for act=none; for act=gelu_tanh, the GELU in
// double within one e4m3 code and the scale within one ulp of the dtype; for act=swiglu, SwiGLU in
// double (each fp32 step rounded) within two codes and the scale within four ulps.
#include <cmath>
#include <string>
#include <vector>

#include "op_test_driver.h"
#include "rounding_oracle.h"

namespace ditops::optest {
namespace {

struct Rq {
  std::vector<int64_t> lead = {33};  // x's leading dims
  int64_t K = 3072, Kp = 0;
  DType dtype = DType::bf16;
  const char* act = "none";  // swiglu: K = 2 N, the output takes N columns of x
  int64_t x_pad = 0, prefix_pad = 0;  // elements beyond each row (a row stride of its own)
  double amplitude = 2.0;
};

std::vector<int64_t> shape_of(const std::vector<int64_t>& lead, int64_t w) {
  std::vector<int64_t> s = lead;
  s.push_back(w);
  return s;
}

// Strides of rows padded by `pad` elements (leading dims collapsing into one row stride).
std::vector<int64_t> padded_strides(const std::vector<int64_t>& lead, int64_t w, int64_t pad) {
  return pad == 0 ? std::vector<int64_t>{} : row_strides(lead, w + pad);
}

int64_t rows_of(const std::vector<int64_t>& lead) {
  int64_t r = 1;
  for (int64_t e : lead) r *= e;
  return r;
}

OpCase rq_case(const Rq& s, CaseKind kind, uint32_t seed) {
  OpCase c{.op = "fp8_rowwise_quant", .kind = kind, .seed = seed};
  std::string lead;
  for (int64_t e : s.lead) lead += (lead.empty() ? "" : "x") + std::to_string(e);
  c.name = std::string(dtype_name(s.dtype)) + "_" + lead + "_K" + std::to_string(s.K) +
           (s.Kp ? "_Kp" + std::to_string(s.Kp) : "") + "_" + s.act +
           (s.x_pad ? "_xpad" + std::to_string(s.x_pad) : "") + (s.prefix_pad ? "_ppad" + std::to_string(s.prefix_pad) : "");
  TensorCase x{"x", s.dtype, shape_of(s.lead, s.K), padded_strides(s.lead, s.K, s.x_pad)};
  x.fill = Fill::normal(s.amplitude);
  c.tensors = {x};
  if (s.Kp) {
    TensorCase p{"prefix", s.dtype, shape_of(s.lead, s.Kp), padded_strides(s.lead, s.Kp, s.prefix_pad)};
    p.fill = Fill::normal(s.amplitude / 2);
    c.tensors.push_back(p);
  }
  c.options = {{"act", s.act}};
  if (std::string(s.act) == "gelu_tanh") {
    c.tolerance = {1, 0.0, 0.05, 64};
    // One ulp of the dtype in the scale: 2^16 (bf16) or 2^13 (f16) fp32 ulps.
    c.tolerance_for = {{"out_scale", {s.dtype == DType::bf16 ? 65536.0 : 8192.0, 0.0, 0.05, 2}}};
  } else if (std::string(s.act) == "swiglu") {
    c.tolerance = {2, 0.0, 0.05, 64};
    c.tolerance_for = {{"out_scale", {s.dtype == DType::bf16 ? 4 * 65536.0 : 4 * 8192.0, 0.0, 0.05, 2}}};
  }
  c.large = rows_of(s.lead) * (s.K + s.Kp) > (1 << 22);
  return c;
}

// Rows given as raw patterns: rows x width bits (each row's values), K = width, no prefix.
OpCase bits_case(const std::string& name, DType dtype, int64_t rows, int64_t width, std::vector<uint64_t> bits,
                 uint32_t seed, const char* act = "none") {
  Rq s;
  s.lead = {rows};
  s.K = width;
  s.dtype = dtype;
  s.act = act;
  OpCase c = rq_case(s, CaseKind::odd, seed);
  c.name = std::string(dtype_name(dtype)) + "_" + name;
  c.tensors[0].fill = Fill::bits(std::move(bits));
  return c;
}

std::vector<OpCase> make() {
  std::vector<OpCase> out;
  uint32_t seed = 1;
  auto add = [&](const Rq& s, CaseKind kind) { out.push_back(rq_case(s, kind, seed++)); };
  // The model sites at full size (large: where a device compares them) and at 33 rows.
  struct Site {
    std::vector<int64_t> lead;
    int64_t K, Kp;
    const char* act;
  };
  for (const Site& site : std::vector<Site>{{{1, 4608}, 3072, 0, "none"},          // FLUX.1 attention output
                                            {{1, 4608}, 12288, 0, "gelu_tanh"},    // FLUX.1 FF-down input
                                            {{1, 4608}, 12288, 3072, "gelu_tanh"},  // FLUX.1 single block proj_out
                                            {{1, 8190}, 5120, 0, "none"},          // Wan 14B (a quarter of 32760)
                                            {{1, 8190}, 13824, 0, "gelu_tanh"},
                                            {{2, 6912}, 3072, 0, "none"},          // Qwen-Image, CFG batch
                                            {{1, 512}, 3072, 0, "none"},           // FLUX.1 text tokens
                                            {{1, 512}, 12288, 3072, "gelu_tanh"},
                                            {{1, 4608}, 18432, 6144, "gelu_tanh"},  // FLUX.2 single block, GELU
                                            // FLUX.2's SwiGLU (H = 18432): the FF's linear_out input
                                            // (image and text tokens), the single block's to_out input
                                            // cat(attn, swiglu(mlp)) (prefix: the attention output)
                                            {{1, 4608}, 36864, 0, "swiglu"},
                                            {{1, 512}, 36864, 0, "swiglu"},
                                            {{1, 4608}, 36864, 6144, "swiglu"}})
  {
    Rq s;
    s.lead = site.lead;
    s.K = site.K;
    s.Kp = site.Kp;
    s.act = site.act;
    add(s, CaseKind::model);
    s.lead = {33};  // the same widths at 33 rows, once per width
    OpCase small = rq_case(s, CaseKind::model, seed++);
    bool seen = false;
    for (const OpCase& c : out) seen = seen || c.name == small.name;
    if (!seen) out.push_back(small);
  }
  for (const char* act : {"none", "gelu_tanh"})
    for (int64_t K : {int64_t{5120}, int64_t{13824}, int64_t{3072}}) {
      Rq s;
      s.lead = {2, 9};
      s.K = K;
      s.dtype = DType::f16;
      s.act = act;
      add(s, CaseKind::model);
    }
  // SwiGLU in f16, and at tiny widths (N = 1, 8, 17 with a 3-column prefix: the scalar path; 16
  // beside a 16-column prefix: the vector path).
  for (const auto& [K, Kp] : std::vector<std::pair<int64_t, int64_t>>{{6144, 0}, {2, 0}, {16, 0}, {34, 3}, {32, 16}}) {
    Rq s;
    s.lead = {2, 9};
    s.K = K;
    s.Kp = Kp;
    s.dtype = K == 6144 ? DType::f16 : DType::bf16;
    s.act = "swiglu";
    add(s, K == 6144 ? CaseKind::model : CaseKind::odd);
  }
  // Wide amplitudes: the clamp is never reached (|y / s| <= 448 by construction), small and huge rows.
  for (double amplitude : {1e-30, 1e-3, 1e30}) {
    Rq s;
    s.lead = {7};
    s.K = 1024;
    s.Kp = 512;
    s.amplitude = amplitude;
    OpCase c = rq_case(s, CaseKind::odd, seed++);
    c.name += "_amp" + std::to_string(static_cast<int>(std::log10(amplitude)));
    out.push_back(c);
  }
  // Odd widths: the scalar path (any K, Kp), a unit straddling the prefix boundary, both dtypes, both acts.
  for (DType dt : {DType::bf16, DType::f16})
    for (const auto& [K, Kp] : std::vector<std::pair<int64_t, int64_t>>{{1, 0}, {5, 0}, {17, 3}, {100, 16}, {3071, 1},
                                                                         {0, 24}, {16, 5}, {48, 16}})
      for (const char* act : {"none", "gelu_tanh"}) {
        Rq s;
        s.lead = {3, 5};
        s.K = K;
        s.Kp = Kp;
        s.dtype = dt;
        s.act = act;
        add(s, CaseKind::odd);
      }
  // SwiGLU's odd widths (K even): N = 1, 17, 100, 3071, none beside a prefix, 16 beside 5 columns.
  for (DType dt : {DType::bf16, DType::f16})
    for (const auto& [K, Kp] : std::vector<std::pair<int64_t, int64_t>>{{2, 0}, {34, 3}, {200, 16}, {6142, 1},
                                                                         {0, 24}, {32, 5}, {96, 16}}) {
      Rq s;
      s.lead = {3, 5};
      s.K = K;
      s.Kp = Kp;
      s.dtype = dt;
      s.act = "swiglu";
      add(s, CaseKind::odd);
    }
  // Rows of their own stride: padded x and prefix rows ([M, K] and [B, S, K] views).
  for (const auto& [x_pad, prefix_pad] : std::vector<std::pair<int64_t, int64_t>>{{8, 0}, {0, 24}, {3, 5}, {64, 8}}) {
    Rq s;
    s.lead = {2, 7};
    s.K = 256;
    s.Kp = 128;
    s.x_pad = x_pad;
    s.prefix_pad = prefix_pad;
    for (const char* act : {"gelu_tanh", "swiglu"}) {
      s.act = act;
      add(s, CaseKind::strided);
    }
  }
  // x and prefix as column slices of one buffer of `row` columns (prefix from column 0, x from
  // `offset`): one [M, 3 * 128] projection (prefix columns 0..127, x 256..383); FLUX.2's single
  // block in small, x the MLP columns 192..447 (gate then up) of a [M, 3 * 64 + 256]
  // to_qkv_mlp_proj-like buffer, whose first 64 columns are the prefix here.
  auto slices = [&](int64_t K, int64_t Kp, int64_t row, int64_t offset, const char* act, const char* what) {
    Rq s;
    s.lead = {9};
    s.K = K;
    s.Kp = Kp;
    s.act = act;
    OpCase c = rq_case(s, CaseKind::view, seed++);
    c.name += what;
    c.tensors[1].strides = {row, 1};
    c.tensors[0].strides = {row, 1};
    c.tensors[0].storage = "prefix";
    c.tensors[0].offset = offset;
    std::swap(c.tensors[0], c.tensors[1]);  // the buffer's owner first
    out.push_back(c);
  };
  slices(128, 128, 384, 256, "none", "_slices_of_one_projection");
  slices(256, 64, 448, 192, "swiglu", "_mlp_columns_of_one_projection");
  // One row and one element: a [K] x; a [1, 1, 16] x.
  {
    Rq s;
    s.lead = {};
    s.K = 100;
    add(s, CaseKind::odd);
    s.lead = {1, 1};
    s.K = 16;
    s.act = "gelu_tanh";
    add(s, CaseKind::odd);
  }
  // Zero rows: +0 and -0 (scale 1 by our rule, e4m3 zeros with their signs), and zeros beside a row.
  out.push_back(bits_case("zero_rows", DType::bf16, 4, 32, {0x0000, 0x8000}, seed++));
  out.push_back(bits_case("zero_rows", DType::f16, 4, 32, {0x8000, 0x0000, 0x0000}, seed++));
  out.push_back(bits_case("zero_rows_gelu", DType::bf16, 2, 20, {0x8000}, seed++, "gelu_tanh"));
  out.push_back(bits_case("zero_rows_swiglu", DType::bf16, 2, 40, {0x8000, 0x0000, 0x0000}, seed++, "swiglu"));
  // The scale's rounding points: bf16 amax 0x00E0 (amax / 448 is a tie that rounds to 0: scale 1),
  // 0x00E1 (the smallest amax with a nonzero scale), 0x01A8 and 0x020C (ties away from 0); f16 amax
  // whose fp32 product then f16 rounding in the subnormal range differs from one rounding of amax / 448
  // (0x09B0, 0x0D78, 0x1516), 0x00E0 and 0x00E1. One row each: its amax first, then smaller values.
  {
    std::vector<uint64_t> bf, hf;
    for (uint64_t a : {0x00E0u, 0x00E1u, 0x01A8u, 0x020Cu, 0x3F80u, 0x7F7Fu})
      for (int j = 0; j < 16; ++j) bf.push_back(j == 0 ? a : (j % 2 ? a - 1 : 0x8000u | (a >> 1)));
    out.push_back(bits_case("scale_rounding_points", DType::bf16, 6, 16, bf, seed++));
    for (uint64_t a : {0x09B0u, 0x0D78u, 0x1516u, 0x00E0u, 0x00E1u, 0x7BFFu})
      for (int j = 0; j < 16; ++j) hf.push_back(j == 0 ? a : (j % 2 ? a - 1 : 0x8000u | (a >> 1)));
    out.push_back(bits_case("scale_rounding_points", DType::f16, 6, 16, hf, seed++));
  }
  // Special values: a row holding +Inf (scale Inf: finite values give 0, Inf/Inf NaN), a row with a
  // NaN (every byte NaN), the largest finite values, subnormals; then every third element special.
  out.push_back(bits_case("inf_row", DType::bf16, 1, 16, {0x7F80, 0x3F80, 0xBF80, 0xFF80, 0x0000, 0x8000, 0x4000, 0x0001},
                          seed++));
  out.push_back(bits_case("nan_row", DType::bf16, 1, 16, {0x3F80, 0x7FC0, 0xBF80, 0x0000}, seed++));
  out.push_back(bits_case("negative_nan_row", DType::f16, 1, 16, {0x3C00, 0xFE00, 0x8000}, seed++));
  out.push_back(bits_case("largest_finite", DType::bf16, 2, 16, {0x7F7F, 0xFF7F, 0x7F7E, 0x0001, 0x3F80}, seed++));
  out.push_back(bits_case("subnormal_rows", DType::bf16, 2, 16, {0x0001, 0x8002, 0x007F, 0x0040}, seed++));
  out.push_back(bits_case("subnormal_rows", DType::f16, 2, 16, {0x0001, 0x8002, 0x03FF, 0x0200}, seed++));
  out.push_back(bits_case("inf_row_gelu", DType::bf16, 1, 16, {0x7F80, 0x3F80, 0xFF80, 0xC120, 0x4120}, seed++, "gelu_tanh"));
  // SwiGLU's edges (gate | up of 16 columns each, the patterns cycling across both halves): silu of
  // +-Inf (Inf, NaN), of -100 (exp overflows: -0), Inf * 0 (NaN), products past the largest finite
  // value (an Inf scale), subnormal gates; and rows without Inf or NaN: large and tiny magnitudes.
  out.push_back(bits_case("swiglu_inf_nan", DType::bf16, 2, 32, {0x7F80, 0x0000, 0xFF80, 0x3F80, 0xC2C8, 0x7F80, 0x4120},
                          seed++, "swiglu"));
  out.push_back(bits_case("swiglu_finite_edges", DType::bf16, 3, 32,
                          {0x42C8, 0xC2C8, 0x4120, 0xC120, 0x3F80, 0xBF80, 0x0000, 0x8000, 0x0001, 0x7F7F, 0x80FF},
                          seed++, "swiglu"));
  out.push_back(bits_case("swiglu_finite_edges", DType::f16, 3, 32,
                          {0x5640, 0xD640, 0x4900, 0xC900, 0x3C00, 0xBC00, 0x0000, 0x8000, 0x0001, 0x7BFF, 0x83FF},
                          seed++, "swiglu"));
  for (DType dt : {DType::bf16, DType::f16})
    for (const char* act : {"none", "gelu_tanh", "swiglu"}) {
      Rq s;
      s.lead = {4, 6};
      s.K = 64;
      s.Kp = 32;
      s.dtype = dt;
      s.act = act;
      OpCase c = rq_case(s, CaseKind::odd, seed++);
      c.name += "_special";
      c.tensors[0].fill = Fill::special(3.0, 17);  // a few rows without a special value
      c.tensors[1].fill = Fill::special(1.0, 23);
      out.push_back(c);
    }
  // Empty calls: no rows ([0, 64]; [2, 0, 64]).
  {
    Rq s;
    s.lead = {0};
    s.K = 64;
    add(s, CaseKind::empty);
    s.lead = {2, 0};
    s.Kp = 16;
    add(s, CaseKind::empty);
    s.act = "swiglu";
    add(s, CaseKind::empty);
  }
  // A row too wide for the kernel's registers: the CPU reference takes it, the jit refuses.
  {
    Rq s;
    s.lead = {2};
    s.K = 32768;
    s.Kp = 16;
    OpCase c = rq_case(s, CaseKind::odd, seed++);
    c.unsupported = {{"fp8_rowwise_quant.jit", "wider than the kernel's 32768"}};
    out.push_back(c);
    s.K = 65536;  // swiglu: 16 + 32768 output columns
    s.act = "swiglu";
    c = rq_case(s, CaseKind::odd, seed++);
    c.unsupported = {{"fp8_rowwise_quant.jit", "Kp + N = 32784 columns are wider than the kernel's 32768"}};
    out.push_back(c);
  }
  // Refusals.
  Rq small;
  small.lead = {2, 4};
  small.K = 64;
  small.Kp = 32;
  auto invalid = [&](const std::string& name, std::vector<std::string> fragments, auto edit) {
    OpCase c = rq_case(small, CaseKind::invalid, seed++);
    c.name = name;
    edit(c);
    c.invalid = std::move(fragments);
    out.push_back(c);
  };
  invalid("x_f32", {"x.dtype must be", "f32"}, [](OpCase& c) { c.tensors[0].dtype = DType::f32; });
  invalid("prefix_dtype_differs", {"prefix.dtype must be bf16", "f16"}, [](OpCase& c) { c.tensors[1].dtype = DType::f16; });
  invalid("prefix_rows_differ", {"prefix.shape[1] must equal x.shape[1]=4 but is 5"},
          [](OpCase& c) { c.tensors[1].shape = {2, 5, 32}; });
  invalid("prefix_rank_differs", {"prefix must have rank 3 (as x) but has rank 2"},
          [](OpCase& c) { c.tensors[1].shape = {8, 32}; });
  invalid("out_width_wrong", {"out must be [M, Kp + K] = [8, 96]", "[8, 95]"},
          [](OpCase& c) { c.tensors.push_back({"out", DType::f8e4m3fn, {8, 95}}); });
  invalid("out_three_dims", {"out must be [M, Kp + K] = [8, 96]"},
          [](OpCase& c) { c.tensors.push_back({"out", DType::f8e4m3fn, {2, 4, 96}}); });
  invalid("out_bf16", {"out.dtype must be f8e4m3fn", "bf16"}, [](OpCase& c) { c.tensors.push_back({"out", DType::bf16, {8, 96}}); });
  invalid("out_strided", {"out must be contiguous"},
          [](OpCase& c) { c.tensors.push_back({"out", DType::f8e4m3fn, {8, 96}, {112, 1}}); });
  invalid("out_scale_one_dim", {"out_scale must be [M, 1] = [8, 1]"},
          [](OpCase& c) { c.tensors.push_back({"out_scale", DType::f32, {8}}); });
  invalid("out_scale_bf16", {"out_scale.dtype must be f32", "bf16"},
          [](OpCase& c) { c.tensors.push_back({"out_scale", DType::bf16, {8, 1}}); });
  invalid("x_last_stride_2", {"x.stride(2) must be 1 but is 2"}, [](OpCase& c) { c.tensors[0].strides = {512, 128, 2}; });
  invalid("x_rows_not_collapsing", {"x.stride(0) must be 256", "but is 1000"},
          [](OpCase& c) { c.tensors[0].strides = {1000, 64, 1}; });
  invalid("no_columns", {"prefix's width must be >= 1", "but is 0"}, [](OpCase& c) {
    c.tensors.pop_back();
    c.tensors[0].shape = {2, 4, 0};
  });
  invalid("swiglu_odd_K", {"x.shape[2] must be even for act=swiglu", "but is 63"}, [](OpCase& c) {
    c.tensors[0].shape = {2, 4, 63};
    c.options[0].second = "swiglu";
  });
  invalid("swiglu_out_width_wrong", {"out must be [M, Kp + K/2] (act=swiglu) = [8, 64]", "[8, 96]"}, [](OpCase& c) {
    c.options[0].second = "swiglu";
    c.tensors.push_back({"out", DType::f8e4m3fn, {8, 96}});
  });
  {
    OpCase c = rq_case(small, CaseKind::aliased, seed++);
    c.name = "out_over_x";
    c.tensors.push_back({"out", DType::f8e4m3fn, {8, 96}, {}, "x"});
    c.invalid = {"x overlaps out in memory"};
    out.push_back(c);
    c = rq_case(small, CaseKind::aliased, seed++);
    c.name = "out_scale_inside_out";
    c.tensors.push_back({"out", DType::f8e4m3fn, {8, 96}});
    c.tensors.push_back({"out_scale", DType::f32, {8, 1}, {}, "out", 0});
    c.invalid = {"out_scale overlaps out in memory"};
    out.push_back(c);
  }
  // Every model case again with each buffer an element off its alignment (the scalar path), with
  // longer rows, and without PDL.
  Variants v;
  v.misalign = {"x", "prefix", "out"};
  v.pad_rows = {"x", "prefix"};
  v.options = {{{{"use_pdl", "false"}}, "nopdl"}};
  add_variants(out, v);
  return out;
}

const CaseSet kCases("fp8_rowwise_quant", make);

using testing_oracle::round_dtype;
using testing_oracle::round_e4m3_saturated;
using testing_oracle::round_f32;
using testing_oracle::gelu_tanh;
using testing_oracle::swiglu;

// The case's rows as the op sees them: prefix columns, then x's (by logical index).
struct Rows {
  int x, prefix, out, scale;
  DType dtype;
  int64_t rows, K, Kp;  // K: x's columns
};

Rows rows_of(const OracleIo& io) {
  Rows r;
  r.x = io.id("x");
  r.prefix = io.id("prefix");
  r.out = io.id("out");
  r.scale = io.id("out_scale");
  r.dtype = io.dtype(r.x);
  const auto& shape = io.shape(r.x);
  r.K = shape.back();
  r.rows = 1;
  for (size_t d = 0; d + 1 < shape.size(); ++d) r.rows *= shape[d];
  r.Kp = r.prefix >= 0 ? io.shape(r.prefix).back() : 0;
  return r;
}

// One e4m3 code at |q| (the spacing of the e4m3 values there).
double e4m3_step(double q) {
  const double a = std::fabs(q);
  if (a < 0x1p-6) return 0x1p-9;
  return std::ldexp(1.0, static_cast<int>(std::floor(std::log2(a))) - 3);
}

enum class Act { none, gelu, swiglu };

void rowwise_oracle(OracleIo& io, Act act) {
  const Rows r = rows_of(io);
  const double inv448 = round_f32(1.0 / 448.0);
  const int64_t N = act == Act::swiglu ? r.K / 2 : r.K, W = r.Kp + N;
  // Bounds in ulps of the dtype (scale) and e4m3 codes (bytes); act none: exact.
  const int scale_ulps = act == Act::swiglu ? 4 : 1, codes = act == Act::swiglu ? 2 : 1;
  std::vector<double> y(static_cast<size_t>(W));
  for (int64_t row = 0; row < r.rows; ++row) {
    double amax = 0;
    bool nan = false;
    for (int64_t j = 0; j < W; ++j) {
      double v = j < r.Kp ? io.in(r.prefix, row * r.Kp + j) : io.in(r.x, row * r.K + j - r.Kp);
      if (j >= r.Kp && act == Act::gelu) v = gelu_tanh(v, r.dtype);
      if (j >= r.Kp && act == Act::swiglu) v = swiglu(v, io.in(r.x, row * r.K + j - r.Kp + N), r.dtype);
      y[static_cast<size_t>(j)] = v;
      nan = nan || std::isnan(v);
      amax = std::fmax(amax, std::fabs(v));
    }
    double s = nan ? NAN : round_dtype(round_f32(amax * inv448), r.dtype);
    if (s == 0) s = 1;
    const double scale_bound =
        act != Act::none ? scale_ulps * std::ldexp(std::fabs(s), r.dtype == DType::bf16 ? -7 : -10) : -1;
    io.expect(r.scale, row, s, scale_bound);
    for (int64_t j = 0; j < W; ++j) {
      const double q = round_e4m3_saturated(round_f32(y[static_cast<size_t>(j)] / s));
      io.expect(r.out, row * W + j, q, act != Act::none ? codes * e4m3_step(q) : -1);
    }
  }
}

bool act_is(const OpCase& c, const std::string& act) {
  if (!c.invalid.empty() || c.large) return false;
  for (const auto& [name, value] : c.options)
    if (name == "act") return value == act;
  return act == "none";
}

const Oracle kExact{.name = "the rowwise recipe in double (act=none)",
                    .expect = [](OracleIo& io) { rowwise_oracle(io, Act::none); },
                    .applies = [](const OpCase& c) { return act_is(c, "none"); }};
const Oracle kGelu{.name = "GELU(tanh) in double, then the recipe: one e4m3 code, the scale within one ulp",
                   .expect = [](OracleIo& io) { rowwise_oracle(io, Act::gelu); },
                   .applies = [](const OpCase& c) { return act_is(c, "gelu_tanh"); }};
const Oracle kSwiglu{.name = "SwiGLU in double, then the recipe: two e4m3 codes, the scale within four ulps",
                     .expect = [](OracleIo& io) { rowwise_oracle(io, Act::swiglu); },
                     .applies = [](const OpCase& c) { return act_is(c, "swiglu"); }};
const OracleSet kOracles[] = {
    {"fp8_rowwise_quant", kExact}, {"fp8_rowwise_quant", kGelu}, {"fp8_rowwise_quant", kSwiglu}};

}  // namespace
}  // namespace ditops::optest
