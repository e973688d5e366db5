// Causal Conv3D cat + pad (Cosmos3 and other causal-conv video VAEs): the cached past frames
// prepended along time, then zero padding, in one pass:
//
//   out = F.pad(torch.cat([cache, x], 2), (wl, wr, ht, hb, dl - ct, dr))
//
// with ct = cache.shape[2] (0 without a cache) and F.pad's `padding` tuple (wl, wr, ht, hb, dl,
// dr) given as the options pad_w_left, pad_w_right, pad_h_top, pad_h_bottom, pad_t_left,
// pad_t_right (dl is the conv's whole left time padding, of which the cache supplies ct frames).
// A pure copy plus zero fill: bit-exact, -0 and NaN payloads included (docs/causal_conv3d_cat_pad.md).
//
// x [B, C, T, H, W], cache [B, C, ct, H, W] (or an empty TensorView: no cache), out [B, C,
// ct + T + (dl - ct) + dr, H + ht + hb, W + wl + wr]; one dtype (f16, bf16 or f32), one device,
// one layout: NCTHW contiguous, or channels-last-3d (torch.channels_last_3d: the strides of a
// dense [B, T, H, W, C] tensor). out is allocated by the caller and must not overlap x or cache.
// Refused with an Error (nothing written): a dtype, device or layout mismatch, a tensor that is
// not 5-D, cache's B, C, H or W unlike x's, a negative padding, dl < ct, out of another shape.
// An empty out is a no-op.
#pragma once

#include <cstdint>
#include <string>

#include "ditops/op_function.h"
#include "ditops/registry.h"
#include "ditops/tensor.h"

namespace ditops {

struct CausalConv3dCatPadOptions {
  // F.pad's padding (wl, wr, ht, hb, dl, dr), every one >= 0, pad_t_left >= the cache's frames.
  int64_t pad_w_left = 0;
  int64_t pad_w_right = 0;
  int64_t pad_h_top = 0;
  int64_t pad_h_bottom = 0;
  int64_t pad_t_left = 0;
  int64_t pad_t_right = 0;
  bool use_pdl = true;  // programmatic dependent launch where the device has it
  DispatchOptions dispatch;
};

// The call as every implementation sees it: the tensors in call order, the options, and what
// matching derives from them.
struct CausalConv3dCatPadCall {
  TensorView x, cache, out;  // cache: an empty TensorView when absent
  CausalConv3dCatPadOptions options;
  bool has_cache = false;
  bool channels_last = false;  // every tensor channels-last-3d (else NCTHW contiguous)
  int64_t batch = 0, channels = 0, frames = 0, height = 0, width = 0;  // x's B, C, T, H, W
  int64_t cache_frames = 0;                                            // ct (0 without a cache)
  int64_t out_frames = 0, out_height = 0, out_width = 0;               // out's T, H, W
  int64_t out_numel = 0;
  Stream stream = nullptr;
};

// causal_conv3d_cat_pad(the tensors above, in order, options = {}, stream = nullptr): validates
// every argument (throws Error naming the tensor, dimension, expected and actual value, before
// anything is written), selects an implementation and runs it on `stream`. Returns the name of the
// implementation that ran.
extern const OpFunction<std::string, CausalConv3dCatPadCall> causal_conv3d_cat_pad;

// match_causal_conv3d_cat_pad(the same arguments): validation alone: the call every implementation
// would receive.
extern const OpFunction<CausalConv3dCatPadCall, CausalConv3dCatPadCall> match_causal_conv3d_cat_pad;

// The dispatch reasoning for one call, without running it.
DispatchReport explain_causal_conv3d_cat_pad(const CausalConv3dCatPadCall& call);

// The CPU reference (the portable oracle): runs on CPU views of a matched call.
void causal_conv3d_cat_pad_reference(const CausalConv3dCatPadCall& call);

}  // namespace ditops
