// Fused in-place per-head QK RMSNorm + RoPE (diffusion attention prep).
//
//   q[t, h, :] = rope(rmsnorm(q[t, h, :]) * q_weight, positions[t])   for h < Hq
//   k[t, h, :] = rope(rmsnorm(k[t, h, :]) * k_weight, positions[t])   for h < Hk
//
// q: [T, Hq, D], k: [T, Hk, D] fp16/bf16, last stride 1, the same head stride for both, token
// strides free (views into one packed QKV projection work without a copy). Weights [D] in the
// activation dtype. cos_sin_cache: [P, rope_dim] ("compact": rope_dim/2 cos then rope_dim/2 sin
// per row) or [P, 2*rope_dim] with cache_full_width (one cos and one sin per rotated channel);
// fp32, or the activation dtype. positions: [T] int32/int64 rows of the cache (not bounds
// checked, like every peer). T == 0 is a no-op. The numerics are in docs/qknorm_rope.md.
#pragma once

#include <string>

#include "ditops/op_function.h"
#include "ditops/registry.h"
#include "ditops/tensor.h"

namespace ditops {

enum class QkRounding : uint8_t {
  // Norm and RoPE in fp32, one rounding at the store. Contract: close.
  fp32,
  // The norm is rounded to the activation dtype before RoPE, as the unfused chain stores it;
  // RoPE then follows the chain's op-by-op rounding. Contract: bit_exact.
  rounded,
};

enum class QkNormOrder : uint8_t {
  // The sum of squares in the order of aten's vectorized RMSNorm kernel (torch 2.11,
  // F.rms_norm on CUDA): matches the PyTorch eager chain.
  aten,
  // The order of SGLang's JIT per-head qknorm (D/32 elements per lane, XOR butterfly):
  // matches SGLang's split chain. Identical to aten at head_dim 128.
  warp,
  // x.float().pow(2).mean(-1) on CUDA (torch 2.11's generic reduction, MeanOps): the squares
  // rounded to fp32, then added in that kernel's order. diffusers' RMSNorm and MochiRMSNorm
  // compute their variance this way. head_dim 64 and 128 only.
  aten_mean,
};

// Where the weight multiply rounds (rounding=rounded only).
enum class QkNormWeightRounding : uint8_t {
  // rne16(w * (factor * x)): one rounding, as F.rms_norm (torch.nn.RMSNorm) computes it.
  once,
  // rne16(rne16(x * factor) * w): the normalized value is cast to the weight's dtype, then
  // multiplied by the weight in that dtype, as diffusers' RMSNorm does with a 16-bit weight.
  twice,
};

// The RoPE arithmetic of the rounded mode with interleaved pairs.
enum class QkRopeProduct : uint8_t {
  // The real form of diffusers' apply_rotary_emb (FLUX): x * cos + rotate(x) * sin, two
  // products rounded to fp32, then the sum (fp32 cache), as separate eager ops.
  real,
  // Qwen-Image's apply_rotary_emb_qwen(use_real=False): x as complex64 pairs (a + ib) times
  // complex64 frequencies (c + is) in aten's complex multiply, which nvcc contracts to
  // fma(a, c, -(b*s)) and fma(a, s, b*c). Interleaved pairs, a compact fp32 cache,
  // rounding=rounded.
  complex,
};

const char* qk_rounding_name(QkRounding rounding);
const char* qk_norm_order_name(QkNormOrder order);
const char* qk_norm_weight_rounding_name(QkNormWeightRounding rounding);

struct QkNormRopeOptions {
  bool is_neox = false;
  float eps = 1e-6f;
  int rope_dim = 0;  // 0: from the cache width (its width, or half of it when full width)
  bool cache_full_width = false;
  QkRounding rounding = QkRounding::rounded;
  QkNormOrder norm_order = QkNormOrder::aten;
  QkNormWeightRounding norm_weight_rounding = QkNormWeightRounding::once;
  QkRopeProduct rope_product = QkRopeProduct::real;
  bool use_pdl = true;  // programmatic dependent launch where the device has it
  DispatchOptions dispatch;
};

// The call as every implementation sees it: the tensors in call order, the options, and what
// matching derives from them.
struct QkNormRopeCall {
  TensorView q, k, q_weight, k_weight, cos_sin_cache, positions;
  QkNormRopeOptions options;
  int64_t num_tokens = 0;
  int num_q_heads = 0;
  int num_k_heads = 0;
  int head_dim = 0;
  int rope_dim = 0;
  int64_t head_stride = 0;  // shared by q and k (bound by whichever has more than one head)
  bool aligned16 = false;  // every pointer and stride allows 16-byte vector access
  Stream stream = nullptr;
};

// qknorm_rope(the tensors above, in order, options = {}, stream = nullptr): validates every
// argument (throws Error naming the tensor, dimension, expected and actual value, before anything
// is written), selects an implementation and runs it on `stream`. Returns the name of the
// implementation that ran.
extern const OpFunction<std::string, QkNormRopeCall> qknorm_rope;

// match_qknorm_rope(the same arguments): validation alone: the call every implementation would
// receive.
extern const OpFunction<QkNormRopeCall, QkNormRopeCall> match_qknorm_rope;

// The dispatch reasoning for one call, without running it.
DispatchReport explain_qknorm_rope(const QkNormRopeCall& call);

// The CPU reference (the portable oracle): runs on CPU views of a matched call.
void qknorm_rope_reference(const QkNormRopeCall& call);

}  // namespace ditops
