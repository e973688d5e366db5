// Cross-head QK RMSNorm + RoPE, in place (Wan, LTX-2: `qk_norm="rms_norm_across_heads"`):
//
//   q[b, s, :] = rope(rmsnorm(q[b, s, :]) (* q_weight), q_cos, q_sin)     norm over all N = Hq * D
//   k[b, s, :] = rope(rmsnorm(k[b, s, :]) (* k_weight), k_cos, k_sin)
//
// The norm spans the whole projected row (torch.nn.RMSNorm(N) on the [B, S, N] projection), then
// the row splits into heads of head_dim D and RoPE rotates each head:
//   interleaved  pairs (2j, 2j+1) of a head: Wan's WanAttnProcessor, LTX-2's interleaved form
//   split        halves (j, j + D/2) of a head: LTX-2's apply_split_rotary_emb
//   none         no rotation (cross-attention QK norms with text keys)
// with a = x[first], c = x[second], C = cos[b, s, h, j], S = sin[b, s, h, j] (fp32):
//   first = a*C - c*S,  second = c*C + a*S   (each product and the sum rounded to fp32, then one
//                                             rounding to the activation dtype)
//
//   q          [B, S, Nq] bf16|f16, last stride 1, batch and token strides free (a chunk of a fused
//              QKV projection works without a copy). Written in place.
//   k          [B, Sk, Nk] q's dtype; Sk and Nk may differ from q's (LTX-2's audio/video cross
//              attention). Written in place; q and k must not share an element.
//   q_weight   [Nq] q's dtype, contiguous, or absent (norm_elementwise_affine=False: no weight);
//   k_weight   [Nk] likewise.
//   q_cos,     [Bq, S, Hq', D/2] fp32 with Bq in {1, B} and Hq' in {1, Hq}, any strides: the
//   q_sin      model's own views (Wan: freqs_cos[..., 0::2] and freqs_sin[..., 1::2] of [1, S, 1, D];
//              LTX-2 split: its [B, H, T, D/2] tables transposed to [B, T, H, D/2]). Required
//              unless rope = none.
//   k_cos,     [Bk, Sk, Hk', D/2] likewise for k; absent: q_cos/q_sin (then k's Sk must equal S),
//   k_sin      as LTX-2 uses the query's table when no key table is given.
//   head_dim   D: even, D % 8 == 0, D <= 512; Nq and Nk multiples of D, each <= 8192.
// B * S == 0 (and B * Sk == 0) is a no-op for that tensor.
//
// Numerics (docs/cross_head_qknorm_rope.md): rounding = rounded is bit_exact against the eager
// chain `torch.nn.RMSNorm(N)(x)` (its fused row kernel: 8-byte-aligned rows, N % 4 == 0, a weight
// in x's dtype or none) followed by the model's RoPE; rounding = fp32 keeps the norm in fp32
// through RoPE (one rounding at the store, as SGLang's kernel does): close.
#pragma once

#include <string>

#include "ditops/qknorm_rope.h"  // QkRounding
#include "ditops/op_function.h"
#include "ditops/registry.h"
#include "ditops/tensor.h"

namespace ditops {

enum class CrossHeadRope : uint8_t { none, interleaved, split };
const char* cross_head_rope_name(CrossHeadRope rope);

struct CrossHeadQkNormRopeOptions {
  int head_dim = 128;
  float eps = 1e-6f;
  CrossHeadRope rope = CrossHeadRope::interleaved;
  QkRounding rounding = QkRounding::rounded;
  bool use_pdl = true;  // programmatic dependent launch where the device has it
  DispatchOptions dispatch;
};

// One of q, k after matching: element (b, s, n) at data + b*batch_stride + s*token_stride + n;
// cos/sin element (b, s, h, j) at cos + b*cos_strides[0] + s*cos_strides[1] + h*cos_strides[2] +
// j*cos_strides[3] (a broadcast dim has stride 0).
struct CrossHeadRows {
  int64_t batch = 0, tokens = 0, width = 0, heads = 0;  // B, S, N, H
  int64_t batch_stride = 0, token_stride = 0;
  int64_t cos_strides[4] = {0, 0, 0, 0};
  int64_t sin_strides[4] = {0, 0, 0, 0};
  const float* cos = nullptr;
  const float* sin = nullptr;
  int64_t rows() const { return batch * tokens; }
};

// The call as every implementation sees it: the tensors in call order, the options, and what
// matching derives from them.
struct CrossHeadQkNormRopeCall {
  TensorView q, k, q_weight, k_weight, q_cos, q_sin, k_cos, k_sin;
  CrossHeadQkNormRopeOptions options;
  CrossHeadRows q_rows, k_rows;
  // Every row start, row stride and weight 8-byte aligned: the kernels' 4-element loads apply
  // (the alignment PyTorch's fused RMSNorm row kernel needs as well).
  bool aligned8 = false;
  Stream stream = nullptr;
};

// cross_head_qknorm_rope(the tensors above, in order, options = {}, stream = nullptr): validates
// every argument (throws Error naming the tensor, dimension, expected and actual value, before
// anything is written), selects an implementation and runs it on `stream`. Returns the name of the
// implementation that ran. Absent optional tensors are default TensorViews.
extern const OpFunction<std::string, CrossHeadQkNormRopeCall> cross_head_qknorm_rope;

// match_cross_head_qknorm_rope(the same arguments): validation alone: the call every implementation
// would receive.
extern const OpFunction<CrossHeadQkNormRopeCall, CrossHeadQkNormRopeCall> match_cross_head_qknorm_rope;

// The dispatch reasoning for one call, without running it.
DispatchReport explain_cross_head_qknorm_rope(const CrossHeadQkNormRopeCall& call);

// The CPU reference (the portable oracle): runs on CPU views of a matched call.
void cross_head_qknorm_rope_reference(const CrossHeadQkNormRopeCall& call);

}  // namespace ditops
