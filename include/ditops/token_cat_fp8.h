// FLUX.2 single-block token concat + static FP8 quantization (SGLang's try_flux2_token_cat_fp8):
//
//   out = e4m3fn(clamp(cat([attn, mlp], -1).float() * inv, -448, 448)),  inv = 1 / input_scale
//
// computed in one pass, without writing the 16-bit concatenation.
//
//   attn         [B, S, Da] bf16 or f16, contiguous
//   mlp          [B, S, Dm] attn's dtype, contiguous, same B and S as attn
//   input_scale  fp32 with exactly one element, on attn's device; read on the device (no host
//                sync). inv per Fp8Reciprocal: ieee (eager `1.0 / scale`) or div_full (SGLang's
//                Triton div.full.f32).
//   out          [B, S, Da + Dm] float8_e4m3fn, contiguous, overlapping no input.
// Da, Dm >= 0 (any value; Da % 16 == 0, Dm % 16 == 0 and 16-byte aligned pointers take the
// 16-byte path). B*S*(Da+Dm) == 0 is a no-op.
//
// The scale must be finite and > 0. On CPU tensors the facade checks it (an Error, nothing
// written; match_token_cat_fp8 and explain read no tensor memory).
// On CUDA it is not (reading it would synchronize): the kernel then computes the same formula as
// eager for any scale, e.g. scale 0 -> inv = inf, every nonzero element saturates to +-448 and
// zeros become NaN (0x7F); docs/token_cat_fp8.md. A NaN product (NaN input or scale) is 0x7F.
#pragma once

#include <string>

#include "ditops/fp8_reciprocal.h"
#include "ditops/op_function.h"
#include "ditops/registry.h"
#include "ditops/tensor.h"

namespace ditops {

struct TokenCatFp8Options {
  Fp8Reciprocal fp8_reciprocal = Fp8Reciprocal::ieee;
  bool use_pdl = true;  // programmatic dependent launch where the device has it
  DispatchOptions dispatch;
};

// The call as every implementation sees it: the tensors in call order, the options, and what
// matching derives from them.
struct TokenCatFp8Call {
  TensorView attn, mlp, input_scale, out;
  TokenCatFp8Options options;
  int64_t rows = 0;        // B * S
  int64_t attn_width = 0;  // Da
  int64_t mlp_width = 0;   // Dm
  int64_t width = 0;       // Da + Dm
  // Da and Dm multiples of 16 and attn, mlp, out 16-byte aligned: the 16-byte path applies.
  bool aligned16 = false;
  Stream stream = nullptr;
};

// token_cat_fp8(attn, mlp, input_scale, out, options = {}, stream = nullptr): validates every
// argument (throws Error naming the tensor, dimension, expected and actual value, before anything
// is written), selects an implementation and runs it on `stream`. Returns the name of the
// implementation that ran.
extern const OpFunction<std::string, TokenCatFp8Call> token_cat_fp8;

// match_token_cat_fp8(attn, mlp, input_scale, out, options = {}, stream = nullptr): validation
// alone (shapes, dtypes, devices, overlap; not the scale's value): the call every implementation
// would receive.
extern const OpFunction<TokenCatFp8Call, TokenCatFp8Call> match_token_cat_fp8;

// The dispatch reasoning for one call, without running it.
DispatchReport explain_token_cat_fp8(const TokenCatFp8Call& call);

// The CPU reference (the portable oracle): runs on CPU views of a matched call, with
// inv = 1.0f / input_scale (IEEE) in both modes.
void token_cat_fp8_reference(const TokenCatFp8Call& call);
// The same with a given reciprocal (input_scale is not read): the div_full oracle once the
// device's div.full.f32 value of 1 / input_scale is known (tests/test_token_cat_fp8.cpp).
void token_cat_fp8_reference_with_inverse(const TokenCatFp8Call& call, float inv);

}  // namespace ditops
