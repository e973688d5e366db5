// The RoPE cos/sin tables of fractional positions: LTX-2's LTX2AudioVideoRotaryPosEmbed (video,
// audio and the cross-modal attentions' tables), in one launch where eager PyTorch runs about 20
// kernels (midpoints, a division per axis, the stack, the outer product, its transpose, cos, sin,
// the padding's cats):
//
//   pos[b, a, p] = (coords[b, a, p, 0] + coords[b, a, p, 1]) * 0.5      (coords [B, A, P]: itself)
//   v            = (pos / max_pos_a) * 2 - 1                            max_pos_a: the module's base sizes
//   cos[b, p, pad + c(k, a)] = cos(v * freqs[k]), sin likewise; the first pad columns 1 and 0
//   c(k, a) = k * A + a (split), 2 (k * A + a) and + 1 (interleaved: each value twice)
//
// every step one fp32 operation rounded as ATen's CUDA kernels round it (docs/fractional_rope_tables.md
// derives each). The module's float64 frequencies (theta ** linspace(0, 1, F) * pi / 2, as fp32) are
// the caller's `freqs` (computed once per module by its own torch operations).
//
//   coords  [B, A, P, 2] or [B, A, P] f32, any strides; A <= 3
//   freqs   [F] f32 contiguous
//   cos     [B, P, W] or [B * P, W] f32 contiguous (the caller's, written in place): W >= A F (split)
//           or 2 A F (interleaved), pad = W - that
//   sin     like cos
// max_pos0..2 (integer options: the module's base_num_frames, base_height, base_width) > 0 for each
// axis of coords. Errors (ditops::Error naming the tensor or option, the dimension, the expected and
// the actual value, before anything is written): coords not of rank 3 or 4 or a bound dim != 2,
// A > 3, a max_pos <= 0 for an axis, freqs not [F] contiguous, cos / sin not [B, P, W] with W wide
// enough, a dtype not f32, tensors on different devices, cos and sin sharing memory, either
// overlapping coords or freqs. B * P == 0 is a no-op.
#pragma once

#include <cstdint>
#include <string>

#include "ditops/op_function.h"
#include "ditops/registry.h"
#include "ditops/tensor.h"

namespace ditops {

// The tables' column order: split (LTX-2's "split" rope_type: each pair once) or interleaved (each
// pair's value twice).
enum class FractionalRopeLayout : uint8_t { split, interleaved };

struct FractionalRopeTablesOptions {
  int64_t max_pos0 = 20;    // axis 0's base size (LTX-2: base_num_frames)
  int64_t max_pos1 = 2048;  // axis 1's (base_height)
  int64_t max_pos2 = 2048;  // axis 2's (base_width)
  FractionalRopeLayout layout = FractionalRopeLayout::split;
  bool use_pdl = true;  // programmatic dependent launch where the device has it
  DispatchOptions dispatch;
};

// The call as every implementation sees it: the tensors in call order, the options, and what
// matching derives from them.
struct FractionalRopeTablesCall {
  TensorView coords, freqs, cos, sin;
  FractionalRopeTablesOptions options;
  int64_t batch = 0, axes = 0, positions = 0;  // B, A, P
  int64_t frequencies = 0;                     // F
  int64_t width = 0, pad = 0;                  // W and its leading constant columns
  bool bounds = false;                         // coords [B, A, P, 2]
  int64_t stride_b = 0, stride_a = 0, stride_p = 0, stride_e = 0;  // coords' (elements)
  bool aligned16 = false;                      // W % 4 == 0 and cos, sin 16-byte aligned
  Stream stream = nullptr;
};

// fractional_rope_tables(coords, freqs, cos, sin, options = {}, stream = nullptr): validates every
// argument (throws Error before anything is written), selects an implementation and runs it on
// `stream`. Returns the name of the implementation that ran.
extern const OpFunction<std::string, FractionalRopeTablesCall> fractional_rope_tables;

// match_fractional_rope_tables(the same arguments): validation alone: the call every implementation receives.
extern const OpFunction<FractionalRopeTablesCall, FractionalRopeTablesCall> match_fractional_rope_tables;

// The dispatch reasoning for one call, without running it.
DispatchReport explain_fractional_rope_tables(const FractionalRopeTablesCall& call);

// The CPU reference: the same fp32 steps with the C library's cos and sin taken in double and
// rounded (CUDA's cosf and sinf are within 2 ulp of that, so a value may be a couple of ulps away).
void fractional_rope_tables_reference(const FractionalRopeTablesCall& call);

}  // namespace ditops
