// LayerNorm (no affine) + adaLN modulate, bit-identical to the eager PyTorch 2.11 chain on CUDA:
//
//   layernorm_modulate:     out = bf16 chain of  F.layer_norm(x, (D,), eps=eps) * (1 + scale[:, None])
//                                                 (+ shift[:, None])
//   layernorm_modulate_fp8: out = e4m3( clamp( float(that bf16 result) * (1 / input_scale), ±448 ) )
//   layernorm_modulate_fp8_rowwise: out, out_scale = the per-token dynamic e4m3 of that bf16 result
//                           (fp8_rowwise_quant's recipe: s = bf16(amax * fp32(1/448)), 1 where 0;
//                           out = e4m3(clamp(y / s, ±448)); out_scale fp32 [B, S, 1]), the bf16
//                           result never written to memory
//   qk_head_layernorm:      q_out, k_out = F.layer_norm(q, (Dh,), eps=eps), same for k
//
// Shapes and layouts (every stride counts elements; the last stride must be 1 everywhere):
//   x, out       [B, S, D] bf16 (out: bf16, or fp8 e4m3fn for the fp8 op); batch and token
//                strides free (views work); out must not overlap x unless it IS x (same data
//                pointer and strides: in place is allowed, each row is read fully before it is
//                written).
//   scale        [B, D] bf16, row stride free: a chunk of the adaLN projection
//                (`emb.chunk(6, dim=1)[i]`) is used without a copy.
//   shift        [B, D] bf16 with its own free row stride, or an empty TensorView (data ==
//                nullptr, rank 0): no add, so signed zeros of the product survive as in the chain
//                without a `+ shift`.
//   input_scale  fp32 with exactly one element (fp8 op), on the device of x; read on the device
//                (no host sync): inv = 1/input_scale computed per the Fp8Reciprocal option.
//   out_scale    fp32 [B, S, 1] contiguous (fp8_rowwise op): the rows' scales.
//   D: 0 < D <= 8192, D % 4 == 0 (aten's vectorized kernel; other D take aten's other kernel,
//   whose order we do not replicate). B*S == 0 is a no-op.
//   q, k, q_out, k_out  [B, S, H, Dh] bf16 (k may have its own H), Dh % 4 == 0, 0 < Dh <= 128;
//                (b, s) must collapse into one token stride (stride(0) == S * stride(1)), head
//                stride free. In place (q_out is q, k_out is k) is allowed; partial overlap is not.
// The numerics (operation by operation) are in docs/layernorm_modulate.md.
#pragma once

#include <string>

#include "ditops/fp8_reciprocal.h"
#include "ditops/op_function.h"
#include "ditops/registry.h"
#include "ditops/tensor.h"

namespace ditops {

// Which GPU mapping of aten's 128 virtual threads computes a row. Both give identical bits.
enum class LnRowMapping : uint8_t {
  automatic,  // the CTA mapping (measured faster everywhere; docs/layernorm_modulate.md)
  warp,       // one warp per row, the row in registers, 4 Welford states per lane
  cta,        // a 128-thread CTA per row as aten launches it, persistent over rows (shared-memory combine)
};
const char* ln_row_mapping_name(LnRowMapping mapping);

struct LayerNormModulateOptions {
  float eps = 1e-6f;
  Fp8Reciprocal fp8_reciprocal = Fp8Reciprocal::ieee;  // fp8 op only
  LnRowMapping mapping = LnRowMapping::automatic;
  // Optional fp32 [B, S, 2] (contiguous): (mean, rstd) of every row, as aten's native_layer_norm
  // returns them. Empty (data == nullptr): not written.
  TensorView stats_out;
  bool use_pdl = true;  // programmatic dependent launch where the device has it
  DispatchOptions dispatch;
};

enum class LnModulateKind : uint8_t { bf16_out, fp8_out, qk_head, fp8_rowwise };

// The call as every implementation sees it: the tensors in call order, the options, and what
// matching derives from them.
struct LayerNormModulateCall {
  LnModulateKind kind = LnModulateKind::bf16_out;
  // bf16_out / fp8_out / fp8_rowwise: x, scale, shift, out (+ input_scale, or out_scale). qk_head:
  // x = q, out = q_out, x2 = k, out2 = k_out.
  TensorView x, scale, shift, out, input_scale, x2, out2, out_scale;
  LayerNormModulateOptions options;
  int64_t batch = 0;    // B
  int64_t seq = 0;      // S
  int64_t rows = 0;     // B*S (modulate) or B*S*H (qk: rows of q)
  int64_t rows2 = 0;    // qk: rows of k (B*S*Hk)
  int heads = 0;        // qk: H of q
  int heads2 = 0;       // qk: H of k
  int dim = 0;          // D, or Dh
  bool has_shift = false;
  bool write_stats = false;
  bool aligned = false;  // every pointer and row stride allows the vector accesses
  bool aligned16 = false;  // qk: ... 16-byte accesses (the 8-lanes-per-head kernel for Dh = 128)
  Stream stream = nullptr;
};

// What callers pass to each op: its tensors in call order, then the options (the four share the
// call their implementations see, LayerNormModulateCall).
struct LayerNormModulateArgs {
  TensorView x, scale, shift, out;
  LayerNormModulateOptions options;
};
struct LayerNormModulateFp8Args {
  TensorView x, scale, shift, input_scale, out;
  LayerNormModulateOptions options;
};
struct LayerNormModulateFp8RowwiseArgs {
  TensorView x, scale, shift, out, out_scale;
  LayerNormModulateOptions options;
};
struct QkHeadLayerNormArgs {
  TensorView q, k, q_out, k_out;
  LayerNormModulateOptions options;
};

// <op>(the tensors of its Args, in order, options = {}, stream = nullptr): validates every argument
// (throws Error naming the tensor, dimension, expected and actual value, before anything is
// written), selects an implementation and runs it on `stream`. Returns the name of the
// implementation that ran.
extern const OpFunction<std::string, LayerNormModulateArgs> layernorm_modulate;
extern const OpFunction<std::string, LayerNormModulateFp8Args> layernorm_modulate_fp8;
extern const OpFunction<std::string, LayerNormModulateFp8RowwiseArgs> layernorm_modulate_fp8_rowwise;
extern const OpFunction<std::string, QkHeadLayerNormArgs> qk_head_layernorm;

// match_<op>(the same arguments): validation alone: the call every implementation would receive.
extern const OpFunction<LayerNormModulateCall, LayerNormModulateArgs> match_layernorm_modulate;
extern const OpFunction<LayerNormModulateCall, LayerNormModulateFp8Args> match_layernorm_modulate_fp8;
extern const OpFunction<LayerNormModulateCall, LayerNormModulateFp8RowwiseArgs> match_layernorm_modulate_fp8_rowwise;
extern const OpFunction<LayerNormModulateCall, QkHeadLayerNormArgs> match_qk_head_layernorm;

// The dispatch reasoning for one matched call (any of the four kinds), without running it.
DispatchReport explain_layernorm_modulate(const LayerNormModulateCall& call);

// The CPU reference (the portable oracle) for CPU views of a matched call of any kind.
void layernorm_modulate_reference(const LayerNormModulateCall& call);

// Exact fp32 -> fp8 e4m3fn, round to nearest even, with the conversion eager `.to(float8_e4m3fn)`
// applies (c10's): |v| >= 480 (and NaN) -> NaN 0x7F with the sign. The ops clamp to ±448 first,
// so they never reach the NaN branch for finite v. Exposed for tests and tools.
uint8_t float_to_e4m3fn(float value);
float e4m3fn_to_float(uint8_t bits);

}  // namespace ditops
