// cross_head_qknorm_rope's cases: Wan (interleaved, its cos/sin as the model slices them), LTX-2
// (split halves with per-head tables, its interleaved full-width tables, video/audio widths, a
// cross-modal k of other width and token count), the cross-attention norm without RoPE, no
// weights, fp16, batch 2 with per-batch tables, a packed QKV view, strided rows, both roundings,
// plus empty, misaligned, aliased and invalid calls. The float64 oracle below: the RMSNorm over the
// whole row and each head's rotation in double, within a bound of the contract's roundings.
#include <array>
#include <cmath>
#include <string>
#include <vector>

#include "op_test_driver.h"

namespace ditops::optest {
namespace {

enum class Table : uint8_t {
  wan,          // [1, S, 1, D/2] views of a [1, S, 1, D] table: cos[..., 0::2], sin[..., 1::2]
  per_head,     // LTX-2 split: [B, H, S, D/2] tables viewed as [B, S, H, D/2]
  full_width,   // LTX-2 interleaved: [B, S, N] tables viewed as [B, S, H, D/2] (every other element)
  per_batch,    // [B, S, 1, D/2] contiguous
};

struct Ch {
  int64_t B = 1, S = 33, Nq = 5120, Sk = 33, Nk = 5120, D = 128;
  const char* rope = "interleaved";
  const char* rounding = "rounded";
  Table table = Table::wan;
  bool own_k_table = false;  // k_cos / k_sin of k's own (cross-modal)
  bool weights = true;
  DType act = DType::bf16;
  bool packed = false;       // q and k: the first two thirds of each row of one [B, S, 3N] projection
  int64_t row_padding = 0;   // elements after each row
  int64_t misalign = 0;      // elements q's buffer is moved off 8-byte alignment
};

std::vector<TensorCase> tables(const Ch& s, const char* cos_name, const char* sin_name, int64_t S, int64_t N) {
  const int64_t H = N / s.D, R = s.D / 2;
  TensorCase cos{cos_name, DType::f32, {}}, sin{sin_name, DType::f32, {}};
  switch (s.table) {
    case Table::wan:
      cos.shape = sin.shape = {1, S, 1, R};
      cos.strides = sin.strides = {S * s.D, s.D, s.D, 2};
      sin.offset = 1;
      break;
    case Table::per_head:
      cos.shape = sin.shape = {s.B, S, H, R};
      cos.strides = sin.strides = {H * S * R, R, S * R, 1};
      break;
    case Table::full_width:
      cos.shape = sin.shape = {s.B, S, H, R};
      cos.strides = sin.strides = {S * N, N, s.D, 2};
      break;
    case Table::per_batch:
      cos.shape = sin.shape = {s.B, S, 1, R};
      break;
  }
  cos.fill = sin.fill = Fill::wave();
  return {cos, sin};
}

OpCase ch_case(const Ch& s, CaseKind kind, const std::string& label) {
  OpCase c{.op = "cross_head_qknorm_rope", .kind = kind};
  const char* table_names[] = {"wan", "per_head", "full_width", "per_batch"};
  c.name = label + "_B" + std::to_string(s.B) + "_S" + std::to_string(s.S) + "_N" + std::to_string(s.Nq) + "_Sk" +
           std::to_string(s.Sk) + "_Nk" + std::to_string(s.Nk) + "_D" + std::to_string(s.D) + "_" + s.rope + "_" +
           s.rounding + "_" + dtype_name(s.act) +
           (std::string(s.rope) == "none" ? "" : std::string("_") + table_names[static_cast<int>(s.table)]) +
           (s.own_k_table ? "_ktable" : "") + (s.weights ? "" : "_noweight") + (s.packed ? "_packed" : "") +
           (s.row_padding ? "_padded" : "") + (s.misalign ? "_misaligned" : "");
  c.seed = static_cast<uint32_t>(s.S * 131 + s.Nq + 7 * s.Nk + s.D);
  TensorCase q{"q", s.act, {s.B, s.S, s.Nq}}, k{"k", s.act, {s.B, s.Sk, s.Nk}};
  if (s.packed) {
    const int64_t row = s.Nq + 2 * s.Nk;
    q.strides = {s.S * row, row, 1};
    k.strides = {s.S * row, row, 1};
    k.storage = "q";
    k.offset = s.Nq;
  } else if (s.row_padding) {
    q.strides = {s.S * (s.Nq + s.row_padding), s.Nq + s.row_padding, 1};
    k.strides = {s.Sk * (s.Nk + s.row_padding), s.Nk + s.row_padding, 1};
  }
  q.offset += s.misalign;
  q.fill = k.fill = Fill::normal(1.5, 0.1);
  c.tensors = {q, k};
  if (s.weights) {
    TensorCase wq{"q_weight", s.act, {s.Nq}}, wk{"k_weight", s.act, {s.Nk}};
    wq.fill = wk.fill = Fill::normal(0.25, 4.0);  // around 1 (a weight of exactly 1 hides its multiply)
    c.tensors.push_back(wq);
    c.tensors.push_back(wk);
  }
  if (std::string(s.rope) != "none") {
    for (const TensorCase& t : tables(s, "q_cos", "q_sin", s.S, s.Nq)) c.tensors.push_back(t);
    if (s.own_k_table)
      for (const TensorCase& t : tables(s, "k_cos", "k_sin", s.Sk, s.Nk)) c.tensors.push_back(t);
  }
  c.options = {{"head_dim", std::to_string(s.D)}, {"rope", s.rope}, {"rounding", s.rounding}};
  // The reference's rsqrt is correctly rounded, the GPU's is rsqrtf (as aten's): where they differ
  // in the last bit a normalized value may move by one ulp, and the rotation carries it into both
  // outputs of its pair (one ulp at the inputs' scale; more near cancellation: the 4.0 floor).
  c.tolerance = {2, 4.0, 0.1, 64};
  c.large = s.B * (s.S * s.Nq + s.Sk * s.Nk) > (int64_t{1} << 21);
  return c;
}

std::vector<OpCase> make() {
  std::vector<OpCase> out;
  auto both = [&](Ch s, CaseKind kind, const std::string& label) {
    for (const char* rounding : {"rounded", "fp32"}) {
      s.rounding = rounding;
      out.push_back(ch_case(s, kind, label));
    }
  };
  // Wan 14B and 1.3B self-attention (interleaved, the model's strided half tables), at a CPU size
  // and at the model's 81-frame 720p token count.
  both(Ch{}, CaseKind::model, "wan14b");
  both(Ch{.S = 19, .Nq = 1536, .Sk = 19, .Nk = 1536}, CaseKind::model, "wan1.3b");
  {
    Ch s{.S = 32760, .Sk = 32760};
    OpCase c = ch_case(s, CaseKind::model, "wan14b");
    c.large = true;
    out.push_back(c);
  }
  // Wan's cross-attention: q over the video tokens, k over 512 text tokens (here 7), no RoPE.
  both(Ch{.S = 33, .Sk = 7, .rope = "none"}, CaseKind::model, "wan_cross");
  // LTX-2: video (32 x 128) and audio (32 x 64) self-attention with split halves and per-head
  // tables, its interleaved form with full-width tables, norm without weights (its default).
  both(Ch{.S = 24, .Nq = 4096, .Sk = 24, .Nk = 4096, .rope = "split", .table = Table::per_head, .weights = false},
       CaseKind::model, "ltx2_video");
  both(Ch{.S = 10, .Nq = 2048, .Sk = 10, .Nk = 2048, .D = 64, .rope = "split", .table = Table::per_head,
          .weights = false},
       CaseKind::model, "ltx2_audio");
  both(Ch{.S = 12, .Nq = 4096, .Sk = 12, .Nk = 4096, .table = Table::full_width, .weights = false}, CaseKind::model,
       "ltx2_interleaved");
  {
    Ch s{.S = 6144, .Nq = 4096, .Sk = 6144, .Nk = 4096, .rope = "split", .table = Table::per_head, .weights = false};
    OpCase c = ch_case(s, CaseKind::model, "ltx2_video");
    c.large = true;
    out.push_back(c);
  }
  // LTX-2's a2v cross attention: k from the other modality (other width and token count), its own
  // tables.
  both(Ch{.S = 24, .Nq = 2048, .Sk = 10, .Nk = 2048, .D = 64, .rope = "split", .table = Table::per_head,
          .own_k_table = true, .weights = false},
       CaseKind::model, "ltx2_a2v");
  both(Ch{.S = 9, .Nq = 4096, .Sk = 13, .Nk = 2048, .rope = "none"}, CaseKind::odd, "widths_differ");
  // fp16; batch 2 with per-batch tables; a packed QKV projection (Wan's fused to_qkv); strided
  // rows; one head; the widest row.
  both(Ch{.S = 17, .Nq = 1024, .Sk = 17, .Nk = 1024, .act = DType::f16}, CaseKind::odd, "f16");
  both(Ch{.B = 2, .S = 11, .Nq = 3072, .Sk = 11, .Nk = 3072, .rope = "split", .table = Table::per_batch},
       CaseKind::odd, "batch2");
  both(Ch{.B = 2, .S = 9, .Nq = 1536, .Sk = 9, .Nk = 1536, .packed = true}, CaseKind::view, "packed_qkv");
  both(Ch{.B = 2, .S = 7, .Nq = 2048, .Sk = 5, .Nk = 1024, .rope = "none", .row_padding = 12}, CaseKind::strided,
       "padded");
  both(Ch{.S = 5, .Nq = 64, .Sk = 5, .Nk = 64, .D = 64, .rope = "split", .table = Table::per_batch}, CaseKind::odd,
       "one_head");
  both(Ch{.S = 3, .Nq = 8192, .Sk = 3, .Nk = 8192, .D = 256, .rope = "split", .table = Table::per_batch},
       CaseKind::odd, "widest");
  // A row off 8-byte alignment: PyTorch's row kernel is not vectorized there, nor is ours.
  {
    OpCase c = ch_case(Ch{.S = 5, .Nq = 512, .Sk = 5, .Nk = 512, .misalign = 1}, CaseKind::misaligned, "misaligned");
    c.unsupported = {{"cross_head_qknorm_rope.jit", "8-byte aligned"}};
    out.push_back(c);
  }
  out.push_back(ch_case(Ch{.S = 0, .Sk = 0}, CaseKind::empty, "empty"));

  // q and k sharing elements.
  {
    OpCase c = ch_case(Ch{.S = 4, .Nq = 256, .Sk = 4, .Nk = 256, .rope = "none"}, CaseKind::aliased, "q_k_overlap");
    c.tensors[1].shape = {1, 3, 256};
    c.tensors[1].storage = "q";
    c.tensors[1].offset = 128;
    c.tensors[1].strides = {4 * 256, 256, 1};
    c.invalid = {"q and k overlap in memory"};
    out.push_back(c);
  }
  // Invalid inputs: each names the tensor or option, the expected and the actual value.
  const Ch small{.S = 3, .Nq = 256, .Sk = 3, .Nk = 256};
  auto invalid = [&](const char* name, auto edit, std::vector<std::string> fragments) {
    OpCase c = ch_case(small, CaseKind::invalid, name);
    edit(c);
    c.invalid = std::move(fragments);
    out.push_back(c);
  };
  auto option = [](OpCase& c, const char* name, const char* value) {
    for (auto& [n, v] : c.options)
      if (n == name) v = value;
  };
  invalid("head_dim_100", [&](OpCase& c) { option(c, "head_dim", "100"); }, {"head_dim must be a multiple of 8", "100"});
  invalid("width_not_heads", [&](OpCase& c) { c.tensor("k").shape = {1, 3, 200}; c.tensor("k_weight").shape = {200}; },
          {"k.shape[2] (heads * head_dim) must be a positive multiple of head_dim=128", "200"});
  invalid("width_16384", [&](OpCase& c) { c.tensor("q").shape = {1, 3, 16384}; c.tensor("q_weight").shape = {16384}; },
          {"up to 8192", "16384"});
  invalid("weight_f32", [&](OpCase& c) { c.tensor("q_weight").dtype = DType::f32; }, {"q_weight.dtype", "f32"});
  invalid("weight_length", [&](OpCase& c) { c.tensor("k_weight").shape = {128}; }, {"k_weight.shape[0] must equal Nk=256", "128"});
  invalid("cos_bf16", [&](OpCase& c) { c.tensor("q_cos").dtype = DType::bf16; }, {"q_cos.dtype must be f32", "bf16"});
  invalid("cos_tokens", [&](OpCase& c) { c.tensor("q_sin").shape = {1, 2, 1, 64}; },
          {"q_sin.shape[1] must be 3 (the tokens (S))", "2"});
  invalid("cos_heads", [&](OpCase& c) { c.tensor("q_cos").shape = {1, 3, 3, 64}; c.tensor("q_cos").strides.clear(); },
          {"q_cos.shape[2] must be 2 or 1 (the heads (1 or H))", "3"});
  invalid("rope_none_with_tables", [&](OpCase& c) { option(c, "rope", "none"); }, {"rope=none takes no cos/sin tables"});
  invalid("k_cos_alone",
          [&](OpCase& c) {
            TensorCase t = c.tensor("q_cos");
            t.name = "k_cos";
            c.tensors.push_back(t);
          },
          {"k_cos and k_sin are given together"});
  invalid("k_tokens_without_tables",
          [&](OpCase& c) { c.tensor("k").shape = {1, 5, 256}; }, {"without k_cos/k_sin k takes q's tables", "5"});
  invalid("eps_negative", [&](OpCase& c) { c.options.push_back({"eps", "-1"}); }, {"eps must be >= 0"});
  invalid("k_f16", [&](OpCase& c) { c.tensor("k").dtype = DType::f16; c.tensor("k_weight").dtype = DType::f16; },
          {"k.dtype", "f16"});
  return out;
}

const CaseSet kCases("cross_head_qknorm_rope", make);

// rms = sqrt(mean(x^2) + eps) over the row, n = x / rms (* w), per head (a, c) -> (a C - c S,
// c C + a S) in double. Bound as qknorm_rope's: the norm rounded to the dtype (<= u), the store
// (<= u |y|), fp32 products and sums (2^-17 of the terms): 3u (|a C| + |c S|) + 2u |y| + 1e-5 (...)
// + a floor for f16 subnormals.
void ch_float64(OracleIo& io) {
  const int64_t D = static_cast<int64_t>(io.number("head_dim"));
  const std::string rope = io.option("rope");
  const double eps = std::stof(io.option("eps"));
  const int q = io.id("q");
  const double u = io.dtype(q) == DType::f16 ? 0x1p-11 : 0x1p-8, floor = io.dtype(q) == DType::f16 ? 3 * 0x1p-24 : 1e-30;
  for (const auto& [name, weight_name, cos_name, sin_name] :
       {std::array<const char*, 4>{"q", "q_weight", "q_cos", "q_sin"}, {"k", "k_weight", "k_cos", "k_sin"}}) {
    const int t = io.id(name), w = io.id(weight_name);
    int cs = io.id(cos_name), sn = io.id(sin_name);
    if (cs < 0) cs = io.id("q_cos"), sn = io.id("q_sin");  // k takes q's tables when it has none
    const int64_t B = io.shape(t)[0], S = io.shape(t)[1], N = io.shape(t)[2], half = D / 2;
    std::vector<double> n(N);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t s = 0; s < S; ++s) {
        const int64_t row = (b * S + s) * N;
        double ss = 0;
        for (int64_t i = 0; i < N; ++i) ss += io.in(t, row + i) * io.in(t, row + i);
        const double rms = std::sqrt(ss / static_cast<double>(N) + eps);
        for (int64_t i = 0; i < N; ++i) n[i] = io.in(t, row + i) / rms * (w >= 0 ? io.in(w, i) : 1.0);
        for (int64_t h = 0; h < N / D; ++h)
          for (int64_t j = 0; j < half; ++j) {
            const int64_t first = h * D + (rope == "split" ? j : 2 * j), second = first + (rope == "split" ? half : 1);
            if (rope == "none") {
              for (int64_t i : {first, second})
                io.expect(t, row + i, n[i], 3 * u * std::fabs(n[i]) + 1e-5 * std::fabs(n[i]) + floor);
              continue;
            }
            const std::vector<int64_t>& ts = io.shape(cs);  // [Bq, S, Hq', D/2]
            const int64_t at = (((ts[0] == 1 ? 0 : b) * ts[1] + s) * ts[2] + (ts[2] == 1 ? 0 : h)) * ts[3] + j;
            const double C = io.in(cs, at), Sn = io.in(sn, at), a = n[first], c = n[second];
            const double magnitude_a = std::fabs(a * C) + std::fabs(c * Sn), magnitude_c = std::fabs(c * C) + std::fabs(a * Sn);
            const double ya = a * C - c * Sn, yc = c * C + a * Sn;
            io.expect(t, row + first, ya, 3 * u * magnitude_a + 2 * u * std::fabs(ya) + 1e-5 * magnitude_a + floor);
            io.expect(t, row + second, yc, 3 * u * magnitude_c + 2 * u * std::fabs(yc) + 1e-5 * magnitude_c + floor);
          }
      }
  }
}

const OracleSet kOracle("cross_head_qknorm_rope", {"float64 within the contract's rounding bound", ch_float64});

}  // namespace
}  // namespace ditops::optest
