// Per-stream QK RMSNorm + RoPE of a dual-stream attention, written as the joint Q/K/V (the
// dual-stream QKV epilogue of FLUX.1 / FLUX.2 double blocks):
//
//   q[b, j] = rope(rmsnorm(q1[b, j]) * q1_weight, positions[j])           j < S1
//   q[b, j] = rope(rmsnorm(q2[b, j - S1]) * q2_weight, positions[j])      S1 <= j < S1 + S2
//   k likewise with k1, k2 and their weights;  v[b, j] = v1[b, j] or v2[b, j - S1], copied
//
// per head, as qknorm_rope computes each head (every option is qknorm_rope's, with its numerics:
// docs/qknorm_rope.md); the joint [stream 1; stream 2] rows come out in fresh buffers, so the
// model's torch.cat of q, k and v disappears. FLUX writes stream 1 = text, stream 2 = image.
//
//   q1, k1, v1   [B, S1, H, D] fp16/bf16, last stride 1, batch and token strides free (each its
//                own: views of a packed QKV projection work without a copy)
//   q2, k2, v2   [B, S2, H, D] q1's dtype, likewise; one head stride for all six
//   *_weight     [D] q1's dtype, contiguous: the norms' weights of each stream's q and k
//   cos_sin_cache, [P, rope_dim] or [P, 2 rope_dim] (cache_full_width), as qknorm_rope;
//   positions    [S1 + S2] int32/int64: the cache row of each joint token, shared by the batch
//                (FLUX: 0, 1, ...; not bounds checked, like qknorm_rope's)
//   q, k, v      [B, S1 + S2, H, D] q1's dtype, contiguous: written, overlapping no input
// D in {64, 128, 256}; B * (S1 + S2) == 0 is a no-op.
//
// Contract: rounding=rounded is bit_exact against the model's chain: each stream's norm (F.rms_norm
// with norm_order=aten; diffusers' RMSNorm with aten_mean + twice), torch.cat([stream 1, stream
// 2], dim=1) of q, k and v, then the model's RoPE over the joint rows (elementwise, so the same
// values as rotating each stream with its rows of the table).
#pragma once

#include <string>

#include "ditops/op_function.h"
#include "ditops/qknorm_rope.h"  // QkNormRopeOptions
#include "ditops/registry.h"
#include "ditops/tensor.h"

namespace ditops {

// qknorm_rope's options (eps: every norm's; the model's four norms must agree).
using JointQkNormRopeOptions = QkNormRopeOptions;

// The call as every implementation sees it: the tensors in call order, the options, and what
// matching derives from them.
struct JointQkNormRopeCall {
  TensorView q1, k1, v1, q2, k2, v2;
  TensorView q1_weight, k1_weight, q2_weight, k2_weight, cos_sin_cache, positions;
  TensorView q, k, v;
  JointQkNormRopeOptions options;
  int64_t batch = 0, tokens1 = 0, tokens2 = 0;  // B, S1, S2
  int heads = 0, head_dim = 0, rope_dim = 0;
  int64_t head_stride = 0;  // of the six inputs
  bool aligned16 = false;   // every pointer and stride allows 16-byte vector access
  Stream stream = nullptr;
};

// joint_qknorm_rope(the 15 tensors above, in order, options = {}, stream = nullptr): validates every
// argument (throws Error naming the tensor, dimension, expected and actual value, before anything
// is written), selects an implementation and runs it on `stream`. Returns the name of the
// implementation that ran.
extern const OpFunction<std::string, JointQkNormRopeCall> joint_qknorm_rope;

// match_joint_qknorm_rope(the same arguments): validation alone: the call every implementation
// would receive.
extern const OpFunction<JointQkNormRopeCall, JointQkNormRopeCall> match_joint_qknorm_rope;

// The dispatch reasoning for one call, without running it.
DispatchReport explain_joint_qknorm_rope(const JointQkNormRopeCall& call);

// The CPU reference: the inputs copied into the joint rows, then qknorm_rope_reference in place on
// each (batch, stream) block with that stream's weights and positions.
void joint_qknorm_rope_reference(const JointQkNormRopeCall& call);

}  // namespace ditops
