// CPU reference of residual_gate_add: the portable oracle every CUDA implementation is compared with.
//
// Contract (docs/residual_gate_add.md): per element, p = rne_T(float(u) * float(g)) and
// out = rne_T(float(r) + p); for fp32, rne_T is the identity (two fp32 roundings). With an f32
// gate beside 16-bit data (the promoted chain) p = float(u) * g is not rounded. Each fp32
// operation below is one IEEE binary32 operation: this file is compiled with -ffp-contract=off, so
// `u * g` and `r + p` are never fused into an FMA. The 16-bit roundings are half.h's exact RNE.
//
// The addressing is deliberately independent of the gate-mode classification the facade and the
// kernels use: every tensor is walked through its own strides, and the gate through broadcast
// strides (0 on each dimension where the gate has extent 1 and the residual does not). A wrong
// mode formula in a kernel therefore shows up as a mismatch against this file.
#include <algorithm>
#include <cstdint>
#include <thread>
#include <vector>

#include "ditops/residual_gate_add.h"
#include "reference/half.h"

namespace ditops {
namespace {

struct Walk {
  int rank = 0;
  int64_t shape[kMaxRank] = {};
  int64_t residual[kMaxRank] = {}, update[kMaxRank] = {}, gate[kMaxRank] = {}, out[kMaxRank] = {};
};

// Rows [first, last) of the flattened leading dimensions.
void run_rows(const ResidualGateAddCall& c, const Walk& w, int64_t first, int64_t last) {
  const DType dtype = c.residual.dtype;
  const int inner = w.rank - 1;
  const int64_t width = w.shape[inner];
  for (int64_t row = first; row < last; ++row) {
    // The row's multi-index, then each tensor's element offset of its first column.
    int64_t rest = row, r0 = 0, u0 = 0, g0 = 0, o0 = 0;
    for (int d = inner - 1; d >= 0; --d) {
      const int64_t i = rest % w.shape[d];
      rest /= w.shape[d];
      r0 += i * w.residual[d];
      u0 += i * w.update[d];
      g0 += i * w.gate[d];
      o0 += i * w.out[d];
    }
    for (int64_t col = 0; col < width; ++col) {
      const float r = ref::load_act(c.residual.data, r0 + col * w.residual[inner], dtype);
      const float u = ref::load_act(c.update.data, u0 + col * w.update[inner], dtype);
      const float g = ref::load_act(c.gate.data, g0 + col * w.gate[inner], c.gate.dtype);
      const float product = c.gate_f32 ? u * g : ref::round_to(dtype, u * g);
      ref::store_act(c.out.data, o0 + col * w.out[inner], dtype, r + product);
    }
  }
}

}  // namespace

void residual_gate_add_reference(const ResidualGateAddCall& c) {
  if (c.residual.device.kind != DeviceKind::cpu)
    throw Error("residual_gate_add.reference: the tensors must be on the cpu but are on " +
                device_name(c.residual.device));
  const DType dtype = c.residual.dtype;
  if (dtype != DType::f32 && dtype != DType::f16 && dtype != DType::bf16)
    throw Error(std::string("residual_gate_add.reference: dtype must be f32, f16 or bf16 but is ") +
                dtype_name(dtype));
  const int rank = c.residual.rank;
  if (rank < 1 || c.update.rank != rank || c.gate.rank != rank || c.out.rank != rank)
    throw Error("residual_gate_add.reference: residual, update, gate and out must share one rank");
  Walk w;
  w.rank = rank;
  int64_t rows = 1;
  for (int d = 0; d < rank; ++d) {
    w.shape[d] = c.residual.shape[d];
    w.residual[d] = c.residual.strides[d];
    w.update[d] = c.update.strides[d];
    w.out[d] = c.out.strides[d];
    // Broadcast: a gate extent of 1 reads the same element along that dimension.
    w.gate[d] = c.gate.shape[d] == 1 ? 0 : c.gate.strides[d];
    if (c.gate.shape[d] != 1 && c.gate.shape[d] != w.shape[d])
      throw Error("residual_gate_add.reference: gate.shape[" + std::to_string(d) + "] must be 1 or " +
                  std::to_string(w.shape[d]) + " but is " + std::to_string(c.gate.shape[d]));
    if (d < rank - 1) rows *= w.shape[d];
  }
  if (rows == 0 || w.shape[rank - 1] == 0) return;

  // Rows in parallel for large calls (elements are independent: the split cannot change a bit).
  const int64_t elements = rows * w.shape[rank - 1];
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  const int64_t workers = std::min<int64_t>({static_cast<int64_t>(hw), rows, std::max<int64_t>(1, elements >> 18)});
  if (workers <= 1) {
    run_rows(c, w, 0, rows);
    return;
  }
  std::vector<std::thread> pool;
  const int64_t per = (rows + workers - 1) / workers;
  for (int64_t i = 0; i < workers; ++i) {
    const int64_t first = i * per, last = std::min(rows, first + per);
    if (first < last) pool.emplace_back(run_rows, std::cref(c), std::cref(w), first, last);
  }
  for (auto& t : pool) t.join();
}

}  // namespace ditops
