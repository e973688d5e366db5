// residual_gate_add's cases: SGLang's test GATE_CASES, per-token, per-batch and per-frame gates,
// transposed residual/out ([B, T, H] stored as [B, H, T]), odd widths, pointers off 16 bytes,
// fp16/bf16/fp32; Wan's promoted chain (an f32 gate beside bf16/f16 data) and row-strided gates
// (chunks of [B, 6, D] and of [B, S, 6, D]); empty, in-place (refused) and invalid calls.
// Bit-exact: bytes equal. The float64 oracle below transcribes eager's chain independently of the
// reference: p = T(fp32(u * g)) (fp32(u * g) for an f32 gate), out = T(fp32(r + p)).
#include <cmath>
#include <optional>

#include "op_test_driver.h"
#include "reference/half.h"
#include "rounding_oracle.h"

namespace ditops::optest {
namespace {

struct Rga {
  std::vector<int64_t> shape, gate;
  DType dtype = DType::bf16;
  bool transposed = false;    // residual/out [B, T, H] with strides (T*H, 1, T)
  int64_t misalign = 0;       // elements every pointer is moved off 16-byte alignment
  int64_t residual_misalign = 0;  // elements residual and out alone are moved (after misalign)
  std::optional<DType> gate_dtype;  // absent: dtype; f32 beside 16-bit data: the promoted chain
  // A chunk of an adaLN projection: the gate's strides (empty: contiguous) and its first element's
  // offset in its buffer (added to misalign), e.g. chunk 2 of [B, 6, D]: {6D, D, 1} at 2D.
  std::vector<int64_t> gate_strides;
  int64_t gate_chunk_offset = 0;
};

std::string dims(const std::vector<int64_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "x" : "") + std::to_string(v[i]);
  return s;
}

OpCase rga_case(const Rga& s, CaseKind kind, uint32_t seed) {
  OpCase c{.op = "residual_gate_add", .kind = kind, .seed = seed};
  const DType gate_dtype = s.gate_dtype.value_or(s.dtype);
  c.name = std::string(dtype_name(s.dtype)) + "_" + dims(s.shape) + "_gate_" + dims(s.gate) +
           (gate_dtype != s.dtype ? std::string("_") + dtype_name(gate_dtype) : "") +
           (s.gate_strides.empty() ? "" : "_strides_" + dims(s.gate_strides)) +
           (s.transposed ? "_transposed" : "") + (s.misalign ? "_off" + std::to_string(s.misalign) : "") +
           (s.residual_misalign ? "_residual_off" + std::to_string(s.residual_misalign) : "");
  TensorCase residual{"residual", s.dtype, s.shape}, update{"update", s.dtype, s.shape}, gate{"gate", gate_dtype, s.gate};
  if (s.transposed) residual.strides = {s.shape[1] * s.shape[2], 1, s.shape[1]};
  gate.strides = s.gate_strides;
  residual.fill = Fill::normal(4.0);
  gate.fill = Fill::normal(0.5);
  residual.offset = s.misalign + s.residual_misalign;
  update.offset = s.misalign;
  gate.offset = s.misalign + s.gate_chunk_offset;
  TensorCase out{"out", s.dtype, s.shape, residual.strides};
  out.offset = residual.offset;
  c.tensors = {residual, update, gate, out};
  int64_t n = 1;
  for (int64_t e : s.shape) n *= e;
  c.large = n > (1 << 22);
  return c;
}

// The raw patterns of `values` in `dtype` (explicit inputs: rounding points, signed zeros).
std::vector<uint64_t> bits_of(DType dtype, const std::vector<float>& values) {
  std::vector<uint64_t> out;
  for (float v : values) {
    uint64_t b = 0;
    ref::store_act(&b, 0, dtype, v);
    out.push_back(b);
  }
  return out;
}

std::vector<OpCase> make() {
  std::vector<OpCase> out;
  uint32_t seed = 1;
  auto add = [&](const Rga& s, CaseKind kind) { out.push_back(rga_case(s, kind, seed++)); };
  // A call the lists below may already hold (the same name: the same call) is not added twice.
  auto add_once = [&](const Rga& s, CaseKind kind) {
    OpCase c = rga_case(s, kind, seed++);
    for (const OpCase& o : out)
      if (o.name == c.name) return;
    out.push_back(c);
  };
  // SGLang's test GATE_CASES (model shapes: FLUX, Qwen-Image, SANA).
  for (const auto& [shape, gate] : std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>>{
           {{1, 1024, 4096}, {1, 1, 4096}}, {{1, 512, 4096}, {1, 512, 4096}}, {{1, 17, 65}, {1, 1, 65}},
           {{1, 17, 65}, {1, 17, 65}}, {{1, 4096, 3072}, {1, 1, 3072}}, {{1, 512, 3072}, {1, 1, 3072}},
           {{1, 4608, 3072}, {1, 1, 3072}}, {{1, 4608, 6144}, {1, 1, 6144}}, {{1, 4216, 4096}, {1, 1, 4096}}})
    add({shape, gate}, CaseKind::model);
  // Per-token, per-batch and per-frame gates over the dtypes.
  add({{1, 17, 65}, {1, 17, 1}}, CaseKind::odd);
  add({{2, 33, 128}, {2, 33, 1}}, CaseKind::odd);
  for (DType dt : {DType::f16, DType::bf16, DType::f32}) {
    add({{1, 2560, 512}, {1, 2560, 1}, dt}, CaseKind::model);
    add({{1, 9, 64}, {1, 1, 64}, dt}, CaseKind::odd);
    add({{1, 9, 64}, {1, 9, 64}, dt}, CaseKind::odd);
    add({{2, 33, 65}, {2, 1, 65}, dt}, CaseKind::odd);       // batch broadcast, scalar path
    add({{2, 1031, 128}, {2, 1, 128}, dt}, CaseKind::odd);   // batch broadcast, vector path
    add({{2, 3, 5, 64}, {2, 3, 1, 64}, dt}, CaseKind::odd);  // per-frame gate
    add({{3, 1031, 72}, {1, 1, 72}, dt}, CaseKind::odd);     // 72: vector for 16-bit, fp32 too
    add({{5, 7}, {1, 7}, dt}, CaseKind::odd);                // rank 2, tiny
  }
  // Transposed residual/out: every tile schedule and gate mode.
  for (DType dt : {DType::f16, DType::bf16, DType::f32}) {
    for (const auto& [shape, gate] : std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>>{
             {{1, 17, 65}, {1, 1, 65}}, {{1, 7800, 2240}, {1, 1, 2240}}, {{2, 33, 128}, {1, 1, 128}},
             {{2, 513, 256}, {1, 1, 256}}, {{2, 33, 128}, {2, 1, 128}}, {{2, 33, 128}, {2, 33, 1}},
             {{2, 130, 72}, {2, 130, 72}}, {{1, 7801, 2240}, {1, 1, 2240}}, {{2, 515, 256}, {2, 515, 1}},
             {{2, 2049, 640}, {2, 2049, 640}}, {{2, 2048, 576}, {2, 2048, 576}}, {{2, 2056, 512}, {2, 2056, 1}},
             {{3, 1544, 456}, {3, 1, 456}}})
      add({shape, gate, dt, true}, CaseKind::strided);
    add({{2, 64, 64}, {1, 1, 64}, dt, true, 0, 1}, CaseKind::misaligned);        // residual lines off 16 bytes
    add({{1, 4999, 1024}, {1, 1, 1024}, dt, true, 0, 5}, CaseKind::misaligned);  // chunks, residual off
  }
  add({{1, 32760, 2240}, {1, 1, 2240}, DType::bf16, true}, CaseKind::strided);  // SANA-Video 480p
  // Pointers off 16 bytes take the scalar path.
  for (DType dt : {DType::bf16, DType::f32}) {
    add({{1, 1024, 4096}, {1, 1, 4096}, dt, false, 1}, CaseKind::misaligned);
    add({{1, 512, 256}, {1, 512, 256}, dt, false, 1}, CaseKind::misaligned);
    add({{2, 33, 128}, {2, 33, 1}, dt, false, 1}, CaseKind::misaligned);
    add({{2, 33, 128}, {2, 1, 128}, dt, false, 3}, CaseKind::misaligned);
    add({{2, 513, 256}, {1, 1, 256}, dt, true, 1}, CaseKind::misaligned);
  }
  // Wan's gated residuals: `(x.float() + attn_output * gate).type_as(x)` with bf16 x and an f32
  // gate [B, 1, D] (a chunk of the [B, 6, D] modulation: chunk 2, gate_msa) or per token (Wan 2.2
  // TI2V: a chunk of [B, S, 6, D] squeezed). 14B D = 5120, 1.3B D = 1536, 81 frames 720p S = 32760.
  const DType f32 = DType::f32;
  const auto chunk_of_b6d = [&](int64_t B, int64_t S, int64_t D, DType dt, CaseKind kind) {
    add({{B, S, D}, {B, 1, D}, dt, false, 0, 0, f32, {6 * D, D, 1}, 2 * D}, kind);
  };
  const auto chunk_of_bs6d = [&](int64_t B, int64_t S, int64_t D, DType dt, CaseKind kind) {
    add({{B, S, D}, {B, S, D}, dt, false, 0, 0, f32, {S * 6 * D, 6 * D, 1}, 5 * D}, kind);
  };
  for (int64_t D : {5120, 1536})
    for (int64_t B : {1, 2}) chunk_of_b6d(B, 32760, D, DType::bf16, CaseKind::model);
  chunk_of_bs6d(1, 4096, 3072, DType::bf16, CaseKind::model);  // TI2V 5B width, per token
  chunk_of_bs6d(2, 257, 1536, DType::bf16, CaseKind::model);
  // The same forms small enough for the CPU, every gate mode with an f32 gate, both 16-bit dtypes.
  chunk_of_b6d(2, 257, 1536, DType::bf16, CaseKind::strided);
  chunk_of_b6d(1, 65, 5120, DType::bf16, CaseKind::strided);
  chunk_of_b6d(2, 1031, 128, DType::f16, CaseKind::strided);
  chunk_of_b6d(2, 33, 65, DType::bf16, CaseKind::strided);  // odd width: the scalar path
  chunk_of_bs6d(2, 33, 128, DType::bf16, CaseKind::strided);
  chunk_of_bs6d(1, 17, 65, DType::f16, CaseKind::strided);
  for (DType dt : {DType::bf16, DType::f16}) {
    add({{3, 1031, 72}, {1, 1, 72}, dt, false, 0, 0, f32}, CaseKind::odd);     // row
    add({{1, 9, 64}, {1, 9, 64}, dt, false, 0, 0, f32}, CaseKind::odd);        // full
    add({{2, 33, 128}, {2, 33, 1}, dt, false, 0, 0, f32}, CaseKind::odd);      // per token [..., 1]
    add({{2, 1031, 128}, {2, 1, 128}, dt, false, 0, 0, f32}, CaseKind::odd);   // batch
    add({{2, 3, 5, 64}, {2, 3, 1, 64}, dt, false, 0, 0, f32}, CaseKind::odd);  // per frame
    add({{2, 33, 65}, {2, 1, 65}, dt, false, 0, 0, f32}, CaseKind::odd);       // batch, scalar path
    add({{5, 7}, {1, 7}, dt, false, 0, 0, f32}, CaseKind::odd);                // rank 2, tiny
  }
  // Row-strided gates of residual's own dtype (the same indexing without promotion).
  add({{2, 1031, 128}, {2, 1, 128}, DType::bf16, false, 0, 0, std::nullopt, {6 * 128, 128, 1}, 128}, CaseKind::strided);
  add({{2, 33, 65}, {2, 1, 65}, DType::f32, false, 0, 0, std::nullopt, {6 * 65, 65, 1}, 3 * 65}, CaseKind::strided);
  add({{2, 9, 64}, {2, 9, 64}, DType::f32, false, 0, 0, std::nullopt, {9 * 6 * 64, 6 * 64, 1}, 64}, CaseKind::strided);
  // f32 gates off 16 bytes: the pointers, and gate rows 8 bytes off (a row stride of 6 D + 2).
  add({{1, 1024, 4096}, {1, 1, 4096}, DType::bf16, false, 1, 0, f32}, CaseKind::misaligned);
  add({{2, 64, 128}, {2, 1, 128}, DType::bf16, false, 0, 0, f32, {6 * 128 + 2, 128, 1}, 2 * 128}, CaseKind::misaligned);
  add({{2, 33, 128}, {2, 33, 1}, DType::f16, false, 3, 0, f32}, CaseKind::misaligned);

  // Every gate mode and dtype at small sizes (the float64 oracle checks each), the per-frame gate
  // over frames of 5 rows and a rank-2 call among them.
  for (DType dt : {DType::bf16, DType::f16, DType::f32})
    for (const auto& [shape, gate] : std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>>{
             {{1, 17, 65}, {1, 17, 65}}, {{1, 17, 65}, {1, 1, 65}}, {{1, 17, 65}, {1, 17, 1}}, {{2, 33, 128}, {2, 33, 1}},
             {{2, 3, 5, 8}, {2, 3, 1, 8}}, {{2, 3, 5, 8}, {2, 1, 1, 8}}, {{7, 3}, {1, 3}}, {{3, 700, 520}, {1, 1, 520}}})
      add_once({shape, gate, dt}, CaseKind::odd);
  // Wan's promoted chain at one width, every form of its f32 gate: chunks of [B, 6, D] and of
  // [B, S, 6, D], per row, per token, per batch.
  for (DType dt : {DType::bf16, DType::f16}) {
    const int64_t B = 2, S = 33, D = 72;
    add_once({{B, S, D}, {B, 1, D}, dt, false, 0, 0, f32, {6 * D, D, 1}, 2 * D}, CaseKind::strided);
    add_once({{B, S, D}, {B, S, D}, dt, false, 0, 0, f32, {S * 6 * D, 6 * D, 1}, 5 * D}, CaseKind::strided);
    for (const std::vector<int64_t>& gate : {std::vector<int64_t>{1, 1, D}, {B, S, 1}, {B, 1, D}})
      add_once({{B, S, D}, gate, dt, false, 0, 0, f32}, CaseKind::odd);
  }
  // Transposed against contiguous on the same values, per-token and full gates.
  for (DType dt : {DType::bf16, DType::f16, DType::f32})
    for (const std::vector<int64_t>& gate : {std::vector<int64_t>{2, 9, 1}, {2, 9, 16}}) {
      OpCase contiguous = rga_case({{2, 9, 16}, gate, dt}, CaseKind::odd, seed++);
      OpCase transposed = rga_case({{2, 9, 16}, gate, dt, true}, CaseKind::strided, seed++);
      transposed.same_as = {contiguous.name};
      out.push_back(contiguous);
      out.push_back(transposed);
    }
  // A gate of padded rows (a row-strided gate of residual's dtype).
  add_once({{1, 17, 65}, {1, 17, 65}, DType::bf16, false, 0, 0, std::nullopt, {17 * 130, 130, 1}}, CaseKind::strided);
  // Eager's rounding points: u * g = 2^-8 + 2^-16 - 2^-23 rounds to 2^-8, so 1 + p is a tie to
  // even (1.0), where one fused multiply-add would give 1 + 2^-7; and -0 + (-0 * 3) = -0.
  {
    OpCase c = rga_case({{1, 2}, {1, 2}}, CaseKind::odd, seed++);
    c.name = "bf16_rounding_points";
    c.tensors[0].fill = Fill::bits({0x3F80, 0x8000});
    c.tensors[1].fill = Fill::bits({0x3F81, 0x8000});
    c.tensors[2].fill = Fill::bits({0x3B7F, 0x4040});
    out.push_back(c);
  }
  // Signed zeros and subnormals of every dtype, then every dtype's special values (NaN, +-Inf,
  // +-0, subnormals, the largest finite) among normal values in every operand.
  for (DType dt : {DType::f16, DType::bf16, DType::f32}) {
    OpCase c = rga_case({{1, 7}, {1, 7}, dt}, CaseKind::odd, seed++);
    c.name = std::string(dtype_name(dt)) + "_signed_zeros_subnormals";
    c.tensors[0].fill = Fill::bits(bits_of(dt, {0.0f, -0.0f, 0.0f, -0.0f, 1e-7f, -6e-8f, 1.0f}));
    c.tensors[1].fill = Fill::bits(bits_of(dt, {-0.0f, -0.0f, 0.0f, 2.0f, 1e-4f, 3e-5f, -1.0f}));
    c.tensors[2].fill = Fill::bits(bits_of(dt, {1.0f, 5.0f, -0.0f, -0.0f, 1e-3f, 7e-4f, 1.0f}));
    out.push_back(c);
    for (const std::vector<int64_t>& gate : {std::vector<int64_t>{3, 5, 64}, {1, 1, 64}}) {
      OpCase sp = rga_case({{3, 5, 64}, gate, dt}, CaseKind::odd, seed++);
      sp.name += "_special";
      for (int t = 0; t < 3; ++t) sp.tensors[t].fill = Fill::special(t == 0 ? 4.0 : 1.0);
      out.push_back(sp);
    }
  }

  // Empty: no tokens.
  add({{1, 0, 64}, {1, 1, 64}}, CaseKind::empty);
  // torch gives the empty [2, 0, 64] strides (64, 64, 1): no element, so any strides are contiguous.
  add({{2, 0, 64}, {2, 1, 64}}, CaseKind::empty);
  add({{1, 0, 128}, {1, 0, 1}, DType::f32}, CaseKind::empty);

  // In place: out is written while residual is read by other threads, so it is refused.
  OpCase in_place = rga_case({{4, 64}, {1, 64}}, CaseKind::aliased, seed++);
  in_place.name = "out_is_residual";
  in_place.tensors[3].storage = "residual";
  in_place.invalid = {"out must not overlap residual"};
  out.push_back(in_place);
  OpCase over_update = rga_case({{4, 64}, {1, 64}}, CaseKind::aliased, seed++);
  over_update.name = "out_overlaps_update";
  over_update.tensors[3].storage = "update";
  over_update.tensors[3].offset = 32;
  over_update.invalid = {"out must not overlap update"};
  out.push_back(over_update);
  // Out over residual's last row, and out right after residual in one buffer (no overlap: valid).
  OpCase partial = rga_case({{4, 64}, {1, 64}}, CaseKind::aliased, seed++);
  partial.name = "out_over_residuals_last_row";
  partial.tensors[3].storage = "residual";
  partial.tensors[3].offset = 3 * 64;
  partial.invalid = {"out must not overlap residual"};
  out.push_back(partial);
  OpCase adjacent = partial;
  adjacent.name = "out_right_after_residual";
  adjacent.tensors[3].offset = 4 * 64;
  adjacent.invalid.clear();
  out.push_back(adjacent);
  // The gate inside out's buffer.
  OpCase gate_in_out = rga_case({{4, 64}, {1, 64}}, CaseKind::aliased, seed++);
  gate_in_out.name = "gate_inside_out";
  std::swap(gate_in_out.tensors[2], gate_in_out.tensors[3]);  // out first: it owns the buffer
  gate_in_out.tensors[3].storage = "out";
  gate_in_out.tensors[3].offset = 64;
  gate_in_out.invalid = {"out must not overlap gate"};
  out.push_back(gate_in_out);
  // Invalid inputs.
  auto invalid = [&](const Rga& s, const char* name, auto edit, std::vector<std::string> fragments) {
    OpCase c = rga_case(s, CaseKind::invalid, seed++);
    c.name = name;
    edit(c);
    c.invalid = std::move(fragments);
    out.push_back(c);
  };
  const Rga odd{{1, 17, 65}, {1, 1, 65}};
  invalid(odd, "update_tokens_16_of_17", [](OpCase& c) { c.tensors[1].shape = {1, 16, 65}; },
          {"residual_gate_add: update.shape[1] must be 17 (as residual.shape[1]) but is 16"});
  invalid(odd, "update_f16_beside_bf16", [](OpCase& c) { c.tensors[1].dtype = DType::f16; },
          {"residual_gate_add: update.dtype must be bf16 (as residual) but is f16"});
  invalid(odd, "gate_width_64_of_65", [](OpCase& c) { c.tensors[2].shape = {1, 1, 64}; },
          {"gate.shape[2] must be 65 (as residual.shape[2]) or 1 (per-token) but is 64"});
  invalid(odd, "gate_rank_1", [](OpCase& c) { c.tensors[2].shape = {65}; },
          {"gate must have rank 3 (as residual) but has rank 1"});
  invalid({{2, 17, 65}, {2, 3, 65}}, "gate_middle_dim_3_of_17", [](OpCase&) {}, {"gate.shape[1] must be 1 or 17"});
  invalid(odd, "per_token_gate_16_of_17", [](OpCase& c) { c.tensors[2].shape = {1, 16, 1}; },
          {"gate.shape[1] must be 17"});
  invalid(odd, "update_column_slice", [](OpCase& c) { c.tensors[1].strides = {17 * 130, 130, 1}; },
          {"update.stride(1) must be 65 (contiguous) but is 130"});
  invalid(odd, "out_transposed_beside_contiguous_residual", [](OpCase& c) { c.tensors[3].strides = {17 * 65, 1, 17}; },
          {"out.stride(1) must be 65 (as residual.stride(1)"});
  invalid(odd, "residual_padded_rows",
          [](OpCase& c) { c.tensors[0].strides = c.tensors[3].strides = {17 * 66, 66, 1}; },
          {"residual.stride(1) must be 65 (contiguous"});
  invalid({{2, 4}, {1, 4}}, "i32_tensors",
          [](OpCase& c) {
            for (TensorCase& t : c.tensors) t.dtype = DType::i32;
          },
          {"residual.dtype must be bf16, f16 or f32 but is i32"});
  OpCase c = rga_case({{2, 8, 64}, {1, 1, 32}}, CaseKind::invalid, seed++);
  c.name = "gate_width_differs";
  c.invalid = {"gate.shape[2] must be 64", "32"};
  out.push_back(c);
  c = rga_case({{2, 8, 64}, {2, 8, 64}}, CaseKind::invalid, seed++);
  c.name = "update_shape_differs";
  c.tensors[1].shape = {2, 9, 64};
  c.invalid = {"update.shape[1] must be 8", "9"};
  out.push_back(c);
  c = rga_case({{2, 8, 64}, {1, 1, 64}}, CaseKind::invalid, seed++);
  c.name = "rank_1_residual";
  c.tensors = {{"residual", DType::bf16, {64}}, {"update", DType::bf16, {64}}, {"gate", DType::bf16, {64}},
               {"out", DType::bf16, {64}}};
  c.invalid = {"residual must have rank >= 2 but has rank 1"};
  out.push_back(c);
  // Dtypes the promoted chain does not take, each named with what is expected.
  c = rga_case({{2, 8, 64}, {1, 1, 64}, DType::bf16, false, 0, 0, DType::f16}, CaseKind::invalid, seed++);
  c.name = "gate_f16_beside_bf16";
  c.invalid = {"gate.dtype must be bf16 (as residual) or f32", "but is f16"};
  out.push_back(c);
  c = rga_case({{2, 8, 64}, {1, 1, 64}, DType::f32, false, 0, 0, DType::bf16}, CaseKind::invalid, seed++);
  c.name = "gate_bf16_beside_f32";
  c.invalid = {"gate.dtype must be f32 (as residual) but is bf16"};
  out.push_back(c);
  c = rga_case({{2, 8, 64}, {1, 1, 64}, DType::bf16, false, 0, 0, DType::f32}, CaseKind::invalid, seed++);
  c.name = "update_f32_beside_bf16";
  c.tensors[1].dtype = DType::f32;
  c.invalid = {"update.dtype must be bf16 (as residual) but is f32"};
  out.push_back(c);
  c = rga_case({{2, 33, 128}, {1, 1, 128}, DType::bf16, true, 0, 0, DType::f32}, CaseKind::invalid, seed++);
  c.name = "gate_f32_transposed";
  c.invalid = {"an f32 gate takes the contiguous layout", "but is f32"};
  out.push_back(c);
  // Gate rows that are not one stride apart, and a gate row that is not contiguous.
  c = rga_case({{2, 4, 64}, {2, 4, 64}, DType::bf16, false, 0, 0, DType::f32, {1024, 128, 1}}, CaseKind::invalid, seed++);
  c.name = "gate_rows_two_strides";
  c.invalid = {"gate.stride(0) must be 512", "but is 1024"};
  out.push_back(c);
  c = rga_case({{2, 4, 64}, {2, 1, 64}, DType::bf16, false, 0, 0, DType::f32, {256, 128, 2}}, CaseKind::invalid, seed++);
  c.name = "gate_row_not_contiguous";
  c.invalid = {"gate.stride(2) must be 1", "but is 2"};
  out.push_back(c);
  // Every model case again with each pointer an element off its alignment (the scalar path).
  add_variants(out, {{"residual", "update", "gate", "out"}});
  return out;
}

const CaseSet kCases("residual_gate_add", make);

using testing_oracle::round_dtype;
using testing_oracle::round_f32;
using testing_oracle::round_f32_sum;

void rga_oracle(OracleIo& io) {
  const int r = io.id("residual"), u = io.id("update"), g = io.id("gate"), out = io.id("out");
  const DType t = io.dtype(r);
  const bool promoted = io.dtype(g) != t;  // an f32 gate beside 16-bit data: one rounding to T
  const std::vector<int64_t>& shape = io.shape(r);
  const std::vector<int64_t>& gshape = io.shape(g);
  const int rank = static_cast<int>(shape.size());
  std::vector<int64_t> idx(rank);
  for (int64_t i = 0; i < io.numel(r); ++i) {
    int64_t rest = i, gi = 0;
    for (int d = rank - 1; d >= 0; --d) {
      idx[d] = rest % shape[d];
      rest /= shape[d];
    }
    for (int d = 0; d < rank; ++d) gi = gi * gshape[d] + (gshape[d] == 1 ? 0 : idx[d]);
    double p = round_f32(io.in(u, i) * io.in(g, gi));  // exact in double, rounded once
    if (!promoted) p = round_dtype(p, t);
    io.expect(out, i, round_dtype(round_f32_sum(io.in(r, i), p), t));
  }
}

const OracleSet kOracle("residual_gate_add", {"float64 transcription of eager's chain", rga_oracle});

}  // namespace
}  // namespace ditops::optest
