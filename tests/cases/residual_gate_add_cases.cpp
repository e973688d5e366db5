// residual_gate_add's cases: SGLang's test GATE_CASES, per-token, per-batch and per-frame gates,
// transposed residual/out ([B, T, H] stored as [B, H, T]), odd widths, pointers off 16 bytes,
// fp16/bf16/fp32; empty, in-place (refused) and invalid calls. Bit-exact: bytes equal.
#include "op_test_driver.h"

namespace ditops::optest {
namespace {

struct Rga {
  std::vector<int64_t> shape, gate;
  DType dtype = DType::bf16;
  bool transposed = false;    // residual/out [B, T, H] with strides (T*H, 1, T)
  int64_t misalign = 0;       // elements every pointer is moved off 16-byte alignment
  int64_t residual_misalign = 0;  // elements residual and out alone are moved (after misalign)
};

std::string dims(const std::vector<int64_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "x" : "") + std::to_string(v[i]);
  return s;
}

OpCase rga_case(const Rga& s, CaseKind kind, uint32_t seed) {
  OpCase c;
  c.op = "residual_gate_add";
  c.kind = kind;
  c.seed = seed;
  c.name = std::string(dtype_name(s.dtype)) + "_" + dims(s.shape) + "_gate_" + dims(s.gate) +
           (s.transposed ? "_transposed" : "") + (s.misalign ? "_off" + std::to_string(s.misalign) : "") +
           (s.residual_misalign ? "_residual_off" + std::to_string(s.residual_misalign) : "");
  TensorCase residual{"residual", s.dtype, s.shape}, update{"update", s.dtype, s.shape}, gate{"gate", s.dtype, s.gate};
  if (s.transposed) residual.strides = {s.shape[1] * s.shape[2], 1, s.shape[1]};
  residual.fill = Fill::normal(4.0);
  gate.fill = Fill::normal(0.5);
  residual.offset = s.misalign + s.residual_misalign;
  update.offset = gate.offset = s.misalign;
  TensorCase out{"out", s.dtype, s.shape, residual.strides};
  out.offset = residual.offset;
  c.tensors = {residual, update, gate, out};
  int64_t n = 1;
  for (int64_t e : s.shape) n *= e;
  c.large = n > (1 << 22);
  return c;
}

std::vector<OpCase> make() {
  std::vector<OpCase> out;
  uint32_t seed = 1;
  auto add = [&](const Rga& s, CaseKind kind) { out.push_back(rga_case(s, kind, seed++)); };
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
  // Invalid inputs.
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
  return out;
}

const CaseSet kCases("residual_gate_add", make);

}  // namespace
}  // namespace ditops::optest
