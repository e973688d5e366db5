// qknorm_rope's cases: the GPU grid (head dims, partial rotary, NeoX, GQA, packed QKV, cache and
// position dtypes), in both rounding modes and norm orders, diffusers' RMSNorm chain (aten_mean
// order, weight rounding twice), plus empty, strided, misaligned, aliased and invalid calls; the
// reference's sweeps (every dtype, head dim, rotary width, pairing, cache layout and dtype, rounding
// and order at small sizes; padded heads, cache rows and positions; GQA; many rows) and the
// relations between options (orders equal at D 128 and told apart elsewhere, a full-width cache
// holding the compact one's values, weights of 1 rounded once or twice).
//
// Three oracles, written without the reference's code (below the cases):
//   * float64: rms = sqrt(mean(x^2) + eps), n = x / rms * w, y = n0 c -+ n1 s in double, within a
//     bound derived from the roundings the contract performs;
//   * the exact chain of docs/qknorm_rope.md, op by op (products exact in double rounded once to
//     fp32, 16-bit rounding by frexp/nearbyint, the sums of squares as separately written trees),
//     bit for bit;
//   * diffusers' RMSNorm (norm_order=aten_mean, weights rounded twice) as torch runs it on CUDA,
//     then eager's RoPE, emulated op by op, bit for bit.
// float64 catches wrong pairing, cache indexing, signs, positions and strides; the chains catch
// wrong reduction orders and rounding points, which stay far below any float64 bound.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "op_test_driver.h"
#include "reference/half.h"
#include "rounding_oracle.h"

namespace ditops::optest {
namespace {

struct Qk {
  int64_t T;
  int64_t Hq, Hk, D, R;
  bool neox = false, full_width = false;
  DType act = DType::bf16, cache = DType::f32, pos = DType::i64;
  bool packed = false;      // q and k are views of one [T, (Hq + 2 Hk) D] QKV projection
  int64_t row_padding = 0;  // elements after each token's heads (a strided token row)
  int64_t misalign = 0;     // elements q's buffer is moved off its alignment
  bool spread_weights = false;  // weights 1 + 0.5 N(0,1) (some negative) instead of 0.5 + |N(0,1)|
  int64_t head_pad = 0;   // elements after each head (head stride D + head_pad; not packed)
  int64_t cache_pad = 0;  // elements after each cache row
  int64_t pos_stride = 1;
  double amplitude = 1.0;
  const char* eps = "";   // "": the op's default
  int64_t P = 0;          // cache rows; 0: 2 T + 8
  bool unit_weights = false;
};

OpCase qk_case(const Qk& s, const char* rounding, const char* order, CaseKind kind,
               const char* weight_rounding = "once", const char* rope_product = "real") {
  const int64_t P = s.P ? s.P : 2 * s.T + 8, width = s.full_width ? 2 * s.R : s.R;
  char amp[32];
  std::snprintf(amp, sizeof amp, "%g", s.amplitude);
  OpCase c{.op = "qknorm_rope", .kind = kind};
  c.name = "T" + std::to_string(s.T) + "_Hq" + std::to_string(s.Hq) + "_Hk" + std::to_string(s.Hk) + "_D" +
           std::to_string(s.D) + "_R" + std::to_string(s.R) + (s.neox ? "_neox" : "") + (s.full_width ? "_full" : "") +
           "_" + dtype_name(s.act) + "_cache_" + dtype_name(s.cache) + "_pos_" + dtype_name(s.pos) +
           (s.packed ? "_packed" : "") + (s.row_padding ? "_padded" : "") + (s.misalign ? "_misaligned" : "") + "_" +
           rounding + "_" + order + (std::string(weight_rounding) == "once" ? "" : std::string("_") + weight_rounding) +
           (s.spread_weights ? "_spread_weights" : "") + (s.unit_weights ? "_unit_weights" : "") +
           (s.head_pad ? "_headpad" + std::to_string(s.head_pad) : "") +
           (s.cache_pad ? "_cachepad" + std::to_string(s.cache_pad) : "") +
           (s.pos_stride != 1 ? "_posstride" + std::to_string(s.pos_stride) : "") +
           (s.amplitude != 1.0 ? std::string("_amp") + amp : "") + (*s.eps ? std::string("_eps") + s.eps : "") +
           (s.P ? "_P" + std::to_string(s.P) : "") +
           (s.packed && s.row_padding ? "_gap" + std::to_string(s.row_padding) : "") +
           (std::string(rope_product) == "real" ? "" : std::string("_") + rope_product);
  c.seed = static_cast<uint32_t>(s.T * 131 + s.D + s.R + s.neox);
  const int64_t hs = s.D + s.head_pad;  // head stride
  const int64_t row = s.packed ? (s.Hq + 2 * s.Hk) * s.D + s.row_padding : s.Hq * hs + s.row_padding;
  TensorCase q{"q", s.act, {s.T, s.Hq, s.D}, {row, hs, 1}};
  q.offset = s.misalign;
  q.fill = Fill::normal(s.amplitude);
  TensorCase k{"k", s.act, {s.T, s.Hk, s.D}};
  k.fill = Fill::normal(s.amplitude);
  if (s.packed) {
    k.strides = {row, s.D, 1};
    k.storage = "q";
    k.offset = s.misalign + s.Hq * s.D;
  } else if (s.row_padding || s.head_pad) {
    k.strides = {s.Hk * hs + s.row_padding, hs, 1};
  }
  TensorCase wq{"q_weight", s.act, {s.D}}, wk{"k_weight", s.act, {s.D}};
  wq.fill = wk.fill = s.unit_weights ? Fill::constant(1.0) : s.spread_weights ? Fill::normal(0.5, 2.0) : Fill::positive(0.5);
  TensorCase cache{"cos_sin_cache", s.cache, {P, width}};
  if (s.cache_pad) cache.strides = {width + s.cache_pad, 1};
  cache.fill = Fill::wave();
  TensorCase pos{"positions", s.pos, {s.T}};
  if (s.pos_stride != 1) pos.strides = {s.pos_stride};
  pos.fill = Fill::index(P);
  c.tensors = {q, k, wq, wk, cache, pos};
  c.options = {{"is_neox", s.neox ? "true" : "false"}, {"rope_dim", std::to_string(s.R)},
               {"cache_full_width", s.full_width ? "true" : "false"}, {"rounding", rounding}, {"norm_order", order},
               {"norm_weight_rounding", weight_rounding}};
  if (*s.eps) c.options.emplace_back("eps", s.eps);
  if (std::string(rope_product) != "real") c.options.push_back({"rope_product", rope_product});
  // The reference's rsqrt is correctly rounded, the GPU's is rsqrtf (as aten's): where the factor
  // differs in its last bit a normalized value moves by one ulp, which the rotation carries into
  // its outputs (one ulp at the inputs' scale, |w x / rms| <= ~4), and a 16-bit cache's rotation
  // by one more (H200: 2 ulp on 5 of 921088 elements with a bf16 full-width cache). With the
  // weight rounding twice the factor's ulp moves rne16(x * factor), which the weight multiply
  // rounds again: the same bound is expected there, unmeasured on a device.
  c.tolerance = {2, 4.0, 0.1, 64};
  c.large = s.T * (s.Hq + s.Hk) * s.D > (1 << 20);  // the CPU reference takes ~0.1 s per million
  return c;
}

std::vector<OpCase> make() {
  std::vector<OpCase> out;
  auto modes = [&](const Qk& s, CaseKind kind) {
    for (const char* rounding : {"rounded", "fp32"})
      for (const char* order : {"aten", "warp"}) out.push_back(qk_case(s, rounding, order, kind));
  };
  // The GPU grid: head dims, partial rotary, NeoX, tokens 1 / 9 (packed QKV) / 129 (GQA) / 1031.
  for (int64_t D : {64, 128, 256})
    for (int64_t R : {D, D / 2})
      for (bool neox : {false, true})
        for (int64_t T : {1, 9, 129, 1031})
          for (DType pos : {DType::i32, DType::i64}) {
            Qk s{T, T == 129 ? 32 : 24, T == 129 ? 8 : 24, D, R, neox};
            s.pos = pos;
            s.packed = T == 9;
            modes(s, T == 9 ? CaseKind::view : T == 1031 ? CaseKind::model : CaseKind::odd);
          }
  // Activation and cache dtypes, compact and full-width caches, on a packed QKV projection.
  for (DType act : {DType::bf16, DType::f16})
    for (DType cache : {DType::f32, act})
      for (bool full : {false, true})
        for (bool neox : {false, true}) {
          Qk s{257, 28, 28, 128, 128, neox, full, act, cache, DType::i64, true};
          modes(s, CaseKind::view);
        }
  // Model shape (FLUX: 4608 tokens of 24 heads), scaled down on the CPU.
  modes(Qk{4608, 24, 24, 128, 128}, CaseKind::model);
  modes(Qk{64, 24, 24, 128, 128}, CaseKind::model);
  // Strided token rows; pointers off 16 bytes (the unaligned loads).
  modes(Qk{33, 8, 4, 128, 64, false, false, DType::bf16, DType::f32, DType::i64, false, 24}, CaseKind::strided);
  modes(Qk{17, 4, 4, 64, 64, true, false, DType::f16, DType::f16, DType::i32, false, 8, 1}, CaseKind::misaligned);
  modes(Qk{17, 3, 5, 128, 32, false, false, DType::bf16, DType::f32, DType::i64, true, 0, 3}, CaseKind::misaligned);
  // Empty: no tokens, nothing written.
  modes(Qk{0, 8, 8, 128, 128}, CaseKind::empty);

  // diffusers' RMSNorm (norm_order=aten_mean, norm_weight_rounding=twice; HunyuanVideo, Qwen-Image)
  // and MochiRMSNorm (aten_mean, once), D 64 and 128, bf16 and fp16, weights spread around 1
  // (weights of exactly 1 make once and twice the same computation).
  for (int64_t D : {64, 128})
    for (DType act : {DType::bf16, DType::f16})
      for (bool neox : {false, true}) {
        Qk s{129, 24, 8, D, D, neox, !neox, act, DType::f32, DType::i64};
        s.spread_weights = true;
        for (const char* weight_rounding : {"twice", "once"})
          out.push_back(qk_case(s, "rounded", "aten_mean", CaseKind::model, weight_rounding));
      }
  // Qwen-Image's chain: diffusers' RMSNorm (aten_mean, twice), then the complex64 product
  // (interleaved pairs, compact fp32 cache); its batch of 2 x 6912 tokens scaled down, a packed
  // QKV view, partial rotary, pointers off 16 bytes, one token.
  {
    Qk qwen{129, 24, 24, 128, 128};
    Qk packed{9, 6, 6, 128, 128, false, false, DType::bf16, DType::f32, DType::i32, true};
    Qk partial{17, 3, 5, 128, 64, false, false, DType::f16, DType::f32, DType::i64, false, 24};
    Qk misaligned{9, 4, 4, 64, 64, false, false, DType::bf16, DType::f32, DType::i64, false, 8, 1};
    Qk single{1, 24, 24, 128, 128};
    for (Qk* s : {&qwen, &packed, &partial, &misaligned, &single}) s->spread_weights = true;
    out.push_back(qk_case(qwen, "rounded", "aten_mean", CaseKind::model, "twice", "complex"));
    out.push_back(qk_case(packed, "rounded", "aten_mean", CaseKind::view, "twice", "complex"));
    out.push_back(qk_case(partial, "rounded", "aten_mean", CaseKind::strided, "twice", "complex"));
    out.push_back(qk_case(misaligned, "rounded", "aten_mean", CaseKind::misaligned, "twice", "complex"));
    out.push_back(qk_case(single, "rounded", "aten_mean", CaseKind::odd, "twice", "complex"));
    out.push_back(qk_case(qwen, "rounded", "aten", CaseKind::odd, "once", "complex"));
    OpCase c = qk_case(Qk{4, 2, 2, 128, 128, true}, "rounded", "aten_mean", CaseKind::invalid, "twice", "complex");
    c.invalid = {"rope_product=complex rotates interleaved pairs", "is_neox is true"};
    out.push_back(c);
    c = qk_case(Qk{4, 2, 2, 128, 128}, "fp32", "aten", CaseKind::invalid, "once", "complex");
    c.invalid = {"rope_product=complex needs rounding=rounded"};
    out.push_back(c);
    c = qk_case(Qk{4, 2, 2, 128, 128, false, false, DType::bf16, DType::bf16}, "rounded", "aten", CaseKind::invalid,
                "once", "complex");
    c.invalid = {"rope_product=complex needs a f32 cos_sin_cache", "bf16"};
    out.push_back(c);
    c = qk_case(Qk{4, 2, 2, 128, 128, false, true}, "rounded", "aten", CaseKind::invalid, "once", "complex");
    c.invalid = {"rope_product=complex multiplies each pair by one complex frequency", "cache_full_width is true"};
    out.push_back(c);
  }
  {
    // The twice chain on a packed QKV view with a 16-bit cache, partial rotary with strided rows,
    // pointers off 16 bytes, one token, and the other orders (defined, no eager chain).
    Qk packed{33, 6, 6, 128, 128, true, false, DType::bf16, DType::bf16, DType::i32, true};
    Qk partial{17, 3, 5, 128, 64, false, true, DType::f16, DType::f32, DType::i64, false, 24};
    Qk misaligned{9, 4, 4, 64, 64, true, false, DType::bf16, DType::f32, DType::i64, false, 8, 1};
    Qk single{1, 24, 24, 128, 128, false, true};
    for (Qk* s : {&packed, &partial, &misaligned, &single}) s->spread_weights = true;
    out.push_back(qk_case(packed, "rounded", "aten_mean", CaseKind::view, "twice"));
    out.push_back(qk_case(partial, "rounded", "aten_mean", CaseKind::strided, "twice"));
    out.push_back(qk_case(misaligned, "rounded", "aten_mean", CaseKind::misaligned, "twice"));
    out.push_back(qk_case(single, "rounded", "aten_mean", CaseKind::odd, "twice"));
    for (const char* order : {"aten", "warp"}) out.push_back(qk_case(single, "rounded", order, CaseKind::odd, "twice"));
    Qk wide{9, 4, 4, 256, 256};
    wide.spread_weights = true;
    out.push_back(qk_case(wide, "rounded", "warp", CaseKind::odd, "twice"));
    out.push_back(qk_case(Qk{0, 8, 8, 64, 64}, "rounded", "aten_mean", CaseKind::empty, "twice"));
  }

  // The reference's sweep: every dtype, head dim, rotary width, pairing, cache layout and dtype,
  // rounding and order at 9 tokens of 3 + 2 heads; positions' dtype, amplitude, eps, a packed QKV
  // projection, padded token rows, padded heads, strided positions and padded cache rows rotate.
  {
    int index = 0;
    const double amps[] = {1.0, 1e-3, 40.0};
    const char* epss[] = {"1e-06", "1e-05", "0.01"};
    for (DType act : {DType::bf16, DType::f16})
      for (int64_t D : {64, 128, 256})
        for (bool neox : {false, true})
          for (int64_t R : D == 64 ? (neox ? std::vector<int64_t>{64, 32, 16} : std::vector<int64_t>{64, 32, 48})
                                   : std::vector<int64_t>{D, D / 2, 96})
            for (bool full : {false, true})
              for (DType cache : {DType::f32, act})
                for (const char* rounding : {"rounded", "fp32"})
                  for (const char* order : {"aten", "warp"}) {
                    Qk s{9, 3, 2, D, R, neox, full, act, cache, index % 2 ? DType::i32 : DType::i64};
                    s.amplitude = amps[index % 3];
                    s.eps = epss[(index / 3) % 3];
                    s.packed = index % 4 == 1;
                    s.row_padding = index % 5 == 0 ? 0 : 8;
                    s.head_pad = !s.packed && index % 6 == 2 ? 24 : 0;
                    s.pos_stride = index % 7 == 3 ? 3 : 1;
                    s.cache_pad = index % 3 == 2 ? 5 : 0;
                    ++index;
                    out.push_back(qk_case(s, rounding, order, s.packed ? CaseKind::view : CaseKind::strided));
                  }
  }
  // GQA and odd token counts over a cache of 300 rows.
  {
    int index = 0;
    for (int64_t T : {1, 9, 129})
      for (auto [hq, hk] : std::vector<std::pair<int64_t, int64_t>>{{8, 2}, {3, 1}, {1, 1}, {2, 4}, {24, 24}}) {
        const int64_t D = index % 3 == 0 ? 128 : index % 3 == 1 ? 64 : 256;
        Qk s{T, hq, hk, D, D, index % 2 == 0, false, index % 2 ? DType::f16 : DType::bf16, DType::f32,
             index % 2 ? DType::i64 : DType::i32};
        s.P = 300;
        ++index;
        out.push_back(qk_case(s, "rounded", "aten", CaseKind::odd));
      }
  }
  // Packed QKV projections with a gap after each token's V (V and the gap stay as they were).
  for (int64_t gap : {0, 8, 13})
    for (DType act : {DType::bf16, DType::f16}) {
      Qk s{33, 4, 2, 128, 64, true, false, act, DType::f32, DType::i64, true, gap};
      out.push_back(qk_case(s, "rounded", "aten", CaseKind::view));
    }
  // Full-width caches whose cos/sin differ on every channel (the pair's partners too).
  for (bool neox : {false, true})
    for (DType act : {DType::bf16, DType::f16})
      for (DType cache : {DType::f32, act})
        for (const char* rounding : {"rounded", "fp32"}) {
          Qk s{21, 3, 2, 128, neox ? 64 : 96, neox, true, act, cache};
          out.push_back(qk_case(s, rounding, "aten", CaseKind::odd));
        }
  // Heads wider than D, odd token strides; padded cache rows and strided positions.
  for (int64_t head_pad : {8, 24}) {
    Qk s{11, 3, 2, 64, 64};
    s.head_pad = head_pad;
    s.row_padding = 3;
    out.push_back(qk_case(s, "rounded", "aten", CaseKind::strided));
  }
  for (DType pos : {DType::i32, DType::i64}) {
    Qk s{40, 3, 2, 128, 128, false, pos == DType::i64, DType::bf16, DType::f32, pos};
    s.cache_pad = 37;
    s.pos_stride = 5;
    out.push_back(qk_case(s, "rounded", "aten", CaseKind::strided));
  }
  // Many rows (the reference's threads): 5000 tokens of 2 + 2 heads, packed, strided positions.
  for (const char* order : {"aten", "warp"}) {
    Qk s{5000, 2, 2, 256, 96};
    s.packed = true;
    s.P = 4096;
    s.pos_stride = 2;
    OpCase c = qk_case(s, "rounded", order, CaseKind::model);
    c.large = false;
    out.push_back(c);
  }
  // A full-width cache holding the compact cache's values twice gives the compact case's bytes.
  for (bool neox : {false, true})
    for (int64_t D : {64, 128, 256})
      for (DType cache : {DType::f32, DType::bf16})
        for (const char* rounding : {"rounded", "fp32"}) {
          Qk s{17, 3, 2, D, D == 64 ? 32 : 96, neox, false, DType::bf16, cache};
          const OpCase compact = qk_case(s, rounding, "aten", CaseKind::odd);
          s.full_width = true;
          OpCase full = qk_case(s, rounding, "aten", CaseKind::odd);
          full.name += "_holding_the_compact_values";
          const int64_t P = 2 * s.T + 8, R = s.R, half = R / 2;
          std::vector<uint64_t> bits;  // the compact cache's wave, per channel
          for (int64_t p = 0; p < P; ++p)
            for (int64_t c = 0; c < 2 * R; ++c) {
              const int64_t channel = c % R, j = neox ? channel % half : channel / 2;
              const int64_t at = p * R + (c < R ? j : half + j);
              uint64_t b = 0;
              ref::store_act(&b, 0, cache, static_cast<float>(std::sin(0.37 * static_cast<double>(at))));
              bits.push_back(b);
            }
          full.tensors[4].fill = Fill::bits(bits);
          full.same_as = {compact.name};
          out.push_back(compact);
          out.push_back(full);
        }
  // The orders: the same computation at D = 128 (the same bytes), others elsewhere (told apart).
  for (DType act : {DType::bf16, DType::f16})
    for (const char* rounding : {"rounded", "fp32"}) {
      const Qk s{256, 4, 4, 128, 128, false, false, act};
      const OpCase aten = qk_case(s, rounding, "aten", CaseKind::odd);
      OpCase warp = qk_case(s, rounding, "warp", CaseKind::odd);
      warp.same_as = {aten.name};
      out.push_back(aten);
      out.push_back(warp);
    }
  for (int64_t D : {64, 256}) {
    const Qk s{512, 4, 4, D, D / 2, false, false, DType::f16};
    const OpCase aten = qk_case(s, "fp32", "aten", CaseKind::odd);
    OpCase warp = qk_case(s, "fp32", "warp", CaseKind::odd);
    warp.differs_from = {aten.name};
    out.push_back(aten);
    out.push_back(warp);
  }
  // Partial rotary at D 64 and 256: pass-through channels, on rows where the orders differ.
  for (int64_t D : {64, 256})
    for (DType act : {DType::bf16, DType::f16}) {
      const Qk s{300, 2, 2, D, D == 64 ? 32 : 96, D == 64, false, act};
      const OpCase aten = qk_case(s, "rounded", "aten", CaseKind::odd);
      OpCase warp = qk_case(s, "rounded", "warp", CaseKind::odd);
      if (D == 256 || act == DType::f16) warp.differs_from = {aten.name};  // bf16 at D 64 rounds it away
      out.push_back(aten);
      out.push_back(warp);
    }
  // diffusers' modes across dtypes, head dims, pairings, rotary widths, cache layouts and dtypes:
  // aten_mean with the weight rounded twice or once, the other orders rounded twice.
  {
    int index = 0;
    const double amps[] = {1.0, 1e-3, 40.0};
    const char* epss[] = {"1e-06", "1e-05", "0.01"};
    for (DType act : {DType::bf16, DType::f16})
      for (int64_t D : {64, 128})
        for (bool neox : {false, true})
          for (int64_t R : {D, D / 2})
            for (bool full : {false, true})
              for (DType cache : {DType::f32, act})
                for (const auto& [order, weight_rounding] : std::vector<std::pair<const char*, const char*>>{
                         {"aten_mean", "twice"}, {"aten_mean", "once"}, {"aten", "twice"}, {"warp", "twice"}}) {
                  Qk s{9, 3, 2, D, R, neox, full, act, cache, index % 2 ? DType::i32 : DType::i64};
                  s.amplitude = amps[index % 3];
                  s.eps = epss[(index / 3) % 3];
                  s.packed = index % 4 == 1;
                  s.row_padding = index % 5 == 0 ? 0 : 8;
                  s.spread_weights = true;
                  ++index;
                  out.push_back(qk_case(s, "rounded", order, CaseKind::odd, weight_rounding));
                }
    for (const char* order : {"aten", "warp"}) {
      Qk s{9, 3, 2, 256, 256};
      s.spread_weights = true;
      s.eps = "1e-05";
      out.push_back(qk_case(s, "rounded", order, CaseKind::odd, "twice"));
    }
  }
  // diffusers' RMSNorm chain step by step: FLUX-style per-channel cos/sin or a compact NeoX cache.
  {
    int index = 0;
    for (DType act : {DType::bf16, DType::f16})
      for (int64_t D : {64, 128})
        for (bool neox : {false, true})
          for (double amp : {1.0, 1e-2, 30.0}) {
            Qk s{40, 3, 2, D, neox ? D : D / 2, neox, !neox, act};
            s.amplitude = amp;
            s.eps = index++ % 2 ? "1e-06" : "1e-05";
            s.spread_weights = true;
            out.push_back(qk_case(s, "rounded", "aten_mean", CaseKind::model, "twice"));
          }
  }
  // The weight rounding is not a no-op on random weights; with weights of 1 once and twice agree.
  for (DType act : {DType::bf16, DType::f16})
    for (int64_t D : {64, 128}) {
      Qk s{64, 4, 4, D, D, false, false, act};
      s.spread_weights = true;
      const OpCase once = qk_case(s, "rounded", "aten_mean", CaseKind::odd, "once");
      OpCase twice = qk_case(s, "rounded", "aten_mean", CaseKind::odd, "twice");
      twice.differs_from = {once.name};
      s.spread_weights = false;
      s.unit_weights = true;
      const OpCase unit_once = qk_case(s, "rounded", "aten_mean", CaseKind::odd, "once");
      OpCase unit_twice = qk_case(s, "rounded", "aten_mean", CaseKind::odd, "twice");
      unit_twice.same_as = {unit_once.name};
      for (const OpCase& c : {once, twice, unit_once, unit_twice}) out.push_back(c);
    }
  // aten_mean against aten: other groupings of the squares at D 64 (told apart), the same at 128.
  for (DType act : {DType::bf16, DType::f16})
    for (int64_t D : {64, 128}) {
      const Qk s{512, 4, 4, D, D, false, false, act};
      const OpCase aten = qk_case(s, "fp32", "aten", CaseKind::odd);
      OpCase mean = qk_case(s, "fp32", "aten_mean", CaseKind::odd);
      (D == 64 ? mean.differs_from : mean.same_as) = {aten.name};
      out.push_back(aten);
      out.push_back(mean);
    }

  // Aliased: q and k are both written, so any shared element is refused, naming both.
  {
    OpCase c = qk_case(Qk{4, 4, 4, 128, 128}, "rounded", "aten", CaseKind::aliased);
    c.name = "q_and_k_the_same_view";
    c.tensors[1].storage = "q";
    c.invalid = {"q and k must not alias"};
    out.push_back(c);
    c.name = "k_overlapping_q_by_one_head";
    c.tensors[1].offset = 128;
    c.invalid = {"q and k overlap in memory"};
    out.push_back(c);
  }
  // Invalid inputs: the message names the tensor, the dimension, the expected and actual value.
  {
    OpCase c = qk_case(Qk{4, 2, 2, 96, 96}, "rounded", "aten", CaseKind::invalid);
    c.name = "head_dim_96";
    c.invalid = {"q.shape[2] (head_dim) must be 64, 128 or 256 but is 96"};
    out.push_back(c);
    c = qk_case(Qk{4, 2, 2, 128, 128}, "rounded", "aten", CaseKind::invalid);
    c.name = "k_dtype_differs_from_q";
    c.tensors[1].dtype = DType::f16;
    c.invalid = {"k", "f16", "bf16"};
    out.push_back(c);
    c = qk_case(Qk{4, 2, 2, 128, 128}, "rounded", "aten", CaseKind::invalid);
    c.name = "cache_width_not_rope_dim";
    c.tensors[4].shape[1] = 96;
    c.invalid = {"cos_sin_cache.shape[1] must be 128", "but is 96"};
    out.push_back(c);
    c = qk_case(Qk{4, 2, 2, 128, 128}, "rounded", "aten", CaseKind::invalid);
    c.name = "positions_length_not_T";
    c.tensors[5].shape[0] = 3;
    c.invalid = {"positions", "4", "3"};
    out.push_back(c);
    c = qk_case(Qk{4, 2, 2, 256, 256}, "rounded", "aten_mean", CaseKind::invalid, "twice");
    c.name = "aten_mean_at_head_dim_256";
    c.invalid = {"norm_order=aten_mean needs head_dim 64 or 128", "head_dim is 256"};
    out.push_back(c);
    c = qk_case(Qk{4, 2, 2, 128, 128}, "fp32", "aten_mean", CaseKind::invalid, "twice");
    c.name = "twice_with_fp32_rounding";
    c.invalid = {"norm_weight_rounding=twice needs rounding=rounded"};
    out.push_back(c);
  }
  return out;
}

const CaseSet kCases("qknorm_rope", make);

using testing_oracle::round_dtype;
using testing_oracle::round_f32;

// One row's inputs: x (a head of q or k, as the values of its 16-bit elements), its weights, the
// token's cos and sin per channel (0 past the rotary width).
struct Row {
  std::vector<double> x, w, cos, sin;
};

struct QkCall {
  DType act, cache;
  int64_t T, Hq, Hk, D, R;
  bool neox, full;
  bool complex;  // rope_product=complex: aten's complex64 product, one FMA per component
  std::string rounding, order, weight_rounding;
  float eps;
  int q, k, qw, kw, table, positions;
};

QkCall qk_call(const OracleIo& io) {
  QkCall c;
  c.q = io.id("q");
  c.k = io.id("k");
  c.qw = io.id("q_weight");
  c.kw = io.id("k_weight");
  c.table = io.id("cos_sin_cache");
  c.positions = io.id("positions");
  c.act = io.dtype(c.q);
  c.cache = io.dtype(c.table);
  c.T = io.shape(c.q)[0];
  c.Hq = io.shape(c.q)[1];
  c.Hk = io.shape(c.k)[1];
  c.D = io.shape(c.q)[2];
  c.R = static_cast<int64_t>(io.number("rope_dim"));
  c.neox = io.flag("is_neox");
  c.full = io.flag("cache_full_width");
  c.rounding = io.option("rounding");
  c.order = io.option("norm_order");
  c.weight_rounding = io.option("norm_weight_rounding");
  c.complex = io.option("rope_product") == "complex";
  c.eps = std::stof(io.option("eps"));
  return c;
}

// Calls fn(tensor, first element, row) for every head of every token of q and k.
template <typename Fn>
void for_each_row(const OracleIo& io, const QkCall& c, Fn fn) {
  const int64_t half = c.R / 2;
  Row r;
  r.x.resize(c.D);
  r.w.resize(c.D);
  for (int64_t t = 0; t < c.T; ++t) {
    const int64_t pos = static_cast<int64_t>(io.in(c.positions, t));
    r.cos.assign(c.D, 0.0);
    r.sin.assign(c.D, 0.0);
    const int64_t width = c.full ? 2 * c.R : c.R;
    for (int64_t ch = 0; ch < c.R; ++ch) {
      const int64_t j = c.neox ? ch % half : ch / 2;
      r.cos[ch] = io.in(c.table, pos * width + (c.full ? ch : j));
      r.sin[ch] = io.in(c.table, pos * width + (c.full ? c.R + ch : half + j));
    }
    for (int tensor : {c.q, c.k}) {
      const int64_t heads = tensor == c.q ? c.Hq : c.Hk;
      const int weight = tensor == c.q ? c.qw : c.kw;
      for (int64_t i = 0; i < c.D; ++i) r.w[i] = io.in(weight, i);
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t first = (t * heads + h) * c.D;
        for (int64_t i = 0; i < c.D; ++i) r.x[i] = io.in(tensor, first + i);
        fn(tensor, first, r);
      }
    }
  }
}

double unit_roundoff(DType t) { return t == DType::f16 ? 0x1p-11 : 0x1p-8; }

// float64 within a bound from the contract's roundings: in rounded mode the norm is rounded to the
// dtype (<= u relative), a 16-bit cache rounds each product (<= u), the store rounds once more
// (<= u |y|), the fp32 ops add ~D 2^-24; so |err| <= 2u (|a c| + |b s|) + u |y| + O(2^-17) (|a c| +
// |b s|), which holds under cancellation; a weight rounded twice adds u. Allowed: 3u (...) + 2u |y|
// + 1e-5 (...) + a floor for f16 subnormals. A wrong pair, sign, index, position, eps or stride
// costs O(|a c| + |b s|), far above it.
void qk_float64(OracleIo& io) {
  const QkCall c = qk_call(io);
  const double u = unit_roundoff(c.act), floor = c.act == DType::f16 ? 3 * 0x1p-24 : 1e-30;
  const int64_t half = c.R / 2;
  for_each_row(io, c, [&](int tensor, int64_t first, const Row& r) {
    double ss = 0;
    for (double v : r.x) ss += v * v;
    const double rms = std::sqrt(ss / static_cast<double>(c.D) + static_cast<double>(c.eps));
    std::vector<double> n(c.D), want(c.D), magnitude(c.D);
    for (int64_t i = 0; i < c.D; ++i) {
      n[i] = r.x[i] / rms * r.w[i];
      want[i] = n[i];
      magnitude[i] = std::fabs(n[i]);
    }
    for (int64_t j = 0; j < half; ++j) {
      const int64_t i0 = c.neox ? j : 2 * j, i1 = c.neox ? j + half : 2 * j + 1;
      want[i0] = n[i0] * r.cos[i0] - n[i1] * r.sin[i0];
      want[i1] = n[i1] * r.cos[i1] + n[i0] * r.sin[i1];
      magnitude[i0] = std::fabs(n[i0] * r.cos[i0]) + std::fabs(n[i1] * r.sin[i0]);
      magnitude[i1] = std::fabs(n[i1] * r.cos[i1]) + std::fabs(n[i0] * r.sin[i1]);
    }
    for (int64_t i = 0; i < c.D; ++i)
      io.expect(tensor, first + i, want[i], 3 * u * magnitude[i] + 2 * u * std::fabs(want[i]) + 1e-5 * magnitude[i] + floor);
  });
}

// ---- the exact chain (docs/qknorm_rope.md), in double with every rounding explicit

float mul32(float a, float b) { return static_cast<float>(static_cast<double>(a) * b); }  // one rounding
float rne16(double v, DType t) { return static_cast<float>(round_dtype(v, t)); }

// shfl_down over 32 lanes (a lane reads its partner before the partner is overwritten); lane 0.
float shfl_down_tree(std::vector<float> s) {
  s.resize(32, 0.f);
  for (int offset = 16; offset > 0; offset >>= 1)
    for (int lane = 0; lane + offset < 32; ++lane) s[lane] = s[lane] + s[lane + offset];
  return s[0];
}

float fma_chain(const std::vector<float>& x, int64_t begin, int64_t count) {
  float p = 0.f;
  for (int64_t i = begin; i < begin + count; ++i) p = std::fma(x[i], x[i], p);
  return p;
}

// order=aten: D / 4 threads each fma four elements left to right; per warp of 32 a shfl_down tree;
// the second warp's total (0 when there is one) added last.
float aten_sum(const std::vector<float>& x) {
  const int64_t threads = static_cast<int64_t>(x.size()) / 4;
  std::vector<float> warp0, warp1;
  for (int64_t v = 0; v < threads; ++v) (v < 32 ? warp0 : warp1).push_back(fma_chain(x, 4 * v, 4));
  return shfl_down_tree(warp0) + shfl_down_tree(warp1);
}

// order=warp: 32 lanes of D / 32 consecutive elements each, then the XOR butterfly.
float warp_sum(const std::vector<float>& x) {
  const int64_t group = static_cast<int64_t>(x.size()) / 32;
  std::vector<float> s(32);
  for (int lane = 0; lane < 32; ++lane) s[lane] = fma_chain(x, lane * group, group);
  for (int mask = 16; mask > 0; mask >>= 1) {
    std::vector<float> next(32);
    for (int lane = 0; lane < 32; ++lane) next[lane] = s[lane] + s[lane ^ mask];
    s = next;
  }
  return s[0];
}

// order=aten_mean (x.float().pow(2).mean(-1)): squares rounded to fp32; 32 threads, at D = 128
// thread t adds 4t .. 4t + 3 left to right, at D = 64 elements t and t + 32; the shfl_down tree.
float aten_mean_sum(const std::vector<float>& x) {
  const int64_t D = static_cast<int64_t>(x.size());
  std::vector<float> sq(D), threads(32);
  for (int64_t i = 0; i < D; ++i) sq[i] = mul32(x[i], x[i]);
  for (int t = 0; t < 32; ++t)
    threads[t] = D == 64 ? sq[t] + sq[t + 32] : ((sq[4 * t] + sq[4 * t + 1]) + sq[4 * t + 2]) + sq[4 * t + 3];
  return shfl_down_tree(threads);
}

void qk_exact_chain(OracleIo& io) {
  const QkCall c = qk_call(io);
  const int64_t half = c.R / 2;
  const bool rounded = c.rounding == "rounded", twice = c.weight_rounding == "twice";
  std::vector<float> x(c.D), w(c.D), n(c.D), y(c.D);
  for_each_row(io, c, [&](int tensor, int64_t first, const Row& r) {
    for (int64_t i = 0; i < c.D; ++i) {
      x[i] = static_cast<float>(r.x[i]);
      w[i] = static_cast<float>(r.w[i]);
    }
    const float total = c.order == "aten" ? aten_sum(x) : c.order == "warp" ? warp_sum(x) : aten_mean_sum(x);
    const float ms = total / static_cast<float>(c.D);
    const float f = static_cast<float>(1.0 / std::sqrt(static_cast<double>(ms + c.eps)));  // correctly rounded
    for (int64_t i = 0; i < c.D; ++i) {
      if (rounded && twice) n[i] = rne16(mul32(rne16(mul32(x[i], f), c.act), w[i]), c.act);
      else n[i] = rounded ? rne16(mul32(w[i], mul32(f, x[i])), c.act) : mul32(x[i], mul32(f, w[i]));
      y[i] = rne16(n[i], c.act);
    }
    auto term = [&](float a, float cs, float b, float sn, bool minus) -> float {
      if (!rounded) {
        const float bs = mul32(b, sn);
        return rne16(std::fma(a, cs, minus ? -bs : bs), c.act);
      }
      if (c.cache == DType::f32) {
        const float ac = mul32(a, cs), bs = mul32(b, sn);
        return rne16(minus ? ac - bs : ac + bs, c.act);
      }
      const float p1 = rne16(mul32(a, cs), c.act), p2 = rne16(mul32(b, sn), c.act);
      return rne16(minus ? p1 - p2 : p1 + p2, c.act);
    };
    for (int64_t j = 0; j < half; ++j) {
      const int64_t i0 = c.neox ? j : 2 * j, i1 = c.neox ? j + half : 2 * j + 1;
      if (c.complex) {  // (a + ib)(cs + i sn): fma(a, cs, -(b sn)), fma(a, sn, b cs) (interleaved pairs)
        const float cs = static_cast<float>(r.cos[i0]), sn = static_cast<float>(r.sin[i0]);
        y[i0] = rne16(std::fma(n[i0], cs, -mul32(n[i1], sn)), c.act);
        y[i1] = rne16(std::fma(n[i0], sn, mul32(n[i1], cs)), c.act);
        continue;
      }
      y[i0] = term(n[i0], static_cast<float>(r.cos[i0]), n[i1], static_cast<float>(r.sin[i0]), true);
      y[i1] = term(n[i1], static_cast<float>(r.cos[i1]), n[i0], static_cast<float>(r.sin[i1]), false);
    }
    for (int64_t i = 0; i < c.D; ++i) io.expect(tensor, first + i, y[i]);
  });
}

// ---- diffusers' RMSNorm (normalization.py, RMSNorm.forward with a 16-bit weight) as torch runs it
// on CUDA, then eager's RoPE (fp32 cache), emulated op by op (docs/qknorm_rope.md §6):
//   variance = x.to(float32).pow(2).mean(-1, keepdim=True)
//   y = (x * torch.rsqrt(variance + eps)).to(weight.dtype) * weight
//   out = (y.float() * cos + rotate(y).float() * sin).to(x.dtype)

// Reduce.cuh over an fp32 row of D values: 32 threads; D >= 128 takes the vectorized reduction
// (aligned vectors of 4 at vector index t, t + 32, ..., one accumulator per component), D = 64 the
// plain one (four accumulators, element t + 32 i into accumulator i); the accumulators combine left
// to right, then block_x_reduce's shfl_down (offsets 16 .. 1, lanes past the warp read themselves).
double mean_of_squares(const std::vector<double>& x) {
  const int64_t D = static_cast<int64_t>(x.size());
  std::vector<double> square(D);
  for (int64_t i = 0; i < D; ++i) square[i] = round_f32(x[i] * x[i]);
  double lane[32];
  for (int t = 0; t < 32; ++t) {
    double acc[4] = {0.0, 0.0, 0.0, 0.0};
    if (D >= 128) {
      for (int64_t v = t; 4 * v + 3 < D; v += 32)
        for (int i = 0; i < 4; ++i) acc[i] = round_f32(acc[i] + square[4 * v + i]);
    } else {
      int64_t idx = t;
      for (int i = 0; i < 4 && idx < D; ++i, idx += 32) acc[i] = round_f32(acc[i] + square[idx]);
    }
    lane[t] = round_f32(round_f32(round_f32(acc[0] + acc[1]) + acc[2]) + acc[3]);
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    double next[32];
    for (int t = 0; t < 32; ++t) next[t] = round_f32(lane[t] + (t + offset < 32 ? lane[t + offset] : lane[t]));
    std::copy(next, next + 32, lane);
  }
  return round_f32(lane[0] * round_f32(1.0 / static_cast<double>(D)));  // MeanOps' factor in float
}

void qk_diffusers_chain(OracleIo& io) {
  const QkCall c = qk_call(io);
  std::vector<double> n(c.D);
  for_each_row(io, c, [&](int tensor, int64_t first, const Row& r) {
    const double variance = mean_of_squares(r.x);
    // rsqrt correctly rounded (the GPU's rsqrtf may differ by an ulp: docs/qknorm_rope.md §4).
    const double factor = round_f32(1.0 / std::sqrt(round_f32(variance + static_cast<double>(c.eps))));
    for (int64_t i = 0; i < c.D; ++i)
      n[i] = round_dtype(round_f32(round_dtype(round_f32(r.x[i] * factor), c.act) * r.w[i]), c.act);
    const int64_t half = c.R / 2;
    for (int64_t i = 0; i < c.D; ++i) {
      double y = n[i];
      if (i < c.R && c.complex) {
        // apply_rotary_emb_qwen(use_real=False): (a + ib)(cos + i sin) in c10::complex<float>, which
        // nvcc contracts to fma(a, cos, -(b sin)) and fma(a, sin, b cos); the fma rounds once.
        const int64_t i0 = i - i % 2;
        const float a = static_cast<float>(n[i0]), b = static_cast<float>(n[i0 + 1]);
        const float cs = static_cast<float>(r.cos[i0]), sn = static_cast<float>(r.sin[i0]);
        y = round_dtype(i % 2 == 0 ? std::fma(a, cs, -static_cast<float>(round_f32(b * sn)))
                                   : std::fma(a, sn, static_cast<float>(round_f32(b * cs))),
                        c.act);
      } else if (i < c.R) {
        const bool lead = c.neox ? i < half : i % 2 == 0;  // rotate(y)[i] = -partner or +partner
        const int64_t partner = c.neox ? (lead ? i + half : i - half) : (lead ? i + 1 : i - 1);
        const double rotated = lead ? -n[partner] : n[partner];
        y = round_dtype(round_f32(round_f32(n[i] * r.cos[i]) + round_f32(rotated * r.sin[i])), c.act);
      }
      io.expect(tensor, first + i, y);
    }
  });
}

bool diffusers_mode(const OpCase& c) {
  if (!c.invalid.empty() || c.large) return false;
  std::string order, weights, cache_dtype;
  for (const auto& [name, text] : c.options) {
    if (name == "norm_order") order = text;
    if (name == "norm_weight_rounding") weights = text;
  }
  for (const TensorCase& t : c.tensors)
    if (t.name == "cos_sin_cache" && t.dtype != DType::f32) return false;  // the chain's cache is fp32
  return order == "aten_mean" && weights == "twice";
}

const OracleSet kFloat64("qknorm_rope", {"float64 within the contract's rounding bound", qk_float64});
const OracleSet kExact("qknorm_rope", {"the exact chain of docs/qknorm_rope.md", qk_exact_chain});
const OracleSet kDiffusers("qknorm_rope", {.name = "diffusers' RMSNorm chain step by step",
                                           .expect = qk_diffusers_chain,
                                           .applies = diffusers_mode});

}  // namespace
}  // namespace ditops::optest
