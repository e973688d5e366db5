// Gated residual add (the adaLN gate after attention or MLP in a DiT block):
//
//   out = residual + update * gate
//
// with eager PyTorch's rounding: in fp16/bf16 the product is rounded to the dtype, then the sum
// (docs/residual_gate_add.md states the contract). residual, update and out share one dtype (f16,
// bf16 or f32) and one device; the gate has that dtype too, or is f32 beside a 16-bit residual
// (promoted, Wan's `(x.float() + update * gate).type_as(x)`: the product and the sum in fp32,
// one rounding to residual's dtype). update has residual's shape; out is allocated by the caller
// with residual's shape AND strides and must not overlap any input (in place is refused: an
// Error, before anything is written). numel == 0 is a no-op.
//
// Gate shapes (D = residual.shape[-1]; the gate contiguous except in the strided mode):
//   full    gate.shape == residual.shape                       gate index = element index
//   row     [1, ..., 1, D]                                     gate index = col
//   token   residual.shape[:-1] + [1]                          gate index = row
//   batch   residual.shape[:k] + [1, ..., 1, D], 0 < k < rank-1 gate index = (row / rpb) * D + col
//           (rpb = rows per gate row = prod(residual.shape[k:-1])): [B, 1, D] for B > 1 batched
//           modulation, and Cosmos-style per-frame gates [B, T, 1, 1, D] over [B, T, H, W, D].
//   strided a full or batch gate whose leading dims are one row stride apart (gate_row_stride)
//           but not contiguous: chunks of an adaLN projection, [B, 6, D].chunk(6, 1)[i] or
//           [B, S, 6, D].chunk(6, 2)[i].squeeze(2)     gate index = (row / rpb) * gate_row_stride + col
//           (rpb = 1 for a full-shaped gate). Contiguous layout only.
// where row = element index / D and col = element index % D.
//
// Layouts (rank >= 2):
//   contiguous  residual, update and out contiguous;
//   transposed  SANA-Video's residual stream: residual/out rank 3 [B, T, H] with strides
//               (T*H, 1, T) (physically [B, H, T]); update contiguous [B, T, H]; any gate mode
//               but strided, the gate of residual's dtype.
// Anything else is refused with an Error naming the tensor and dimension.
#pragma once

#include <string>

#include "ditops/op_function.h"
#include "ditops/registry.h"
#include "ditops/tensor.h"

namespace ditops {

enum class GateMode : uint8_t { full, row, token, batch, strided };
const char* gate_mode_name(GateMode mode);

struct ResidualGateAddOptions {
  bool use_pdl = true;  // programmatic dependent launch where the device has it
  DispatchOptions dispatch;
};

// The call as every implementation sees it: the tensors in call order, the options, and what
// matching derives from them.
struct ResidualGateAddCall {
  TensorView residual, update, gate, out;
  ResidualGateAddOptions options;
  GateMode gate_mode = GateMode::full;
  bool transposed = false;     // residual/out in the [B, H, T]-strided layout
  int64_t numel = 0;
  int64_t width = 0;           // D = residual.shape[-1] (H when transposed)
  int64_t rows = 0;            // numel / D
  int64_t rows_per_batch = 0;  // batch and strided modes: rows sharing one gate row; else 0
  int64_t gate_row_stride = 0;  // strided mode: elements between consecutive gate rows
  bool gate_f32 = false;        // an f32 gate beside a 16-bit residual: the promoted chain
  int64_t batch = 0, tokens = 0, hidden = 0;  // transposed: B, T, H
  // Every pointer 16-byte aligned and the vector-contiguous extent (D; T and H when transposed)
  // a multiple of 16 bytes: the 128-bit path applies.
  bool aligned16 = false;
  // Transposed: update (and a vector gate) allow 16-byte accesses along H, whatever residual/out
  // allow along T (an odd T leaves the residual side scalar).
  bool update_aligned16 = false;
  // Transposed, update side 16-byte, residual side not: out and residual share their offset within
  // 16 bytes, so both are walked by the aligned 16-byte chunks covering each line (any T).
  bool residual_chunks16 = false;
  Stream stream = nullptr;
};

// residual_gate_add(the tensors above, in order, options = {}, stream = nullptr): validates every
// argument (throws Error naming the tensor, dimension, expected and actual value, before anything
// is written), selects an implementation and runs it on `stream`. Returns the name of the
// implementation that ran.
extern const OpFunction<std::string, ResidualGateAddCall> residual_gate_add;

// match_residual_gate_add(the same arguments): validation alone: the call every implementation
// would receive.
extern const OpFunction<ResidualGateAddCall, ResidualGateAddCall> match_residual_gate_add;

// The dispatch reasoning for one call, without running it.
DispatchReport explain_residual_gate_add(const ResidualGateAddCall& call);

// The CPU reference (the portable oracle): runs on CPU views of a matched call.
void residual_gate_add_reference(const ResidualGateAddCall& call);

}  // namespace ditops
