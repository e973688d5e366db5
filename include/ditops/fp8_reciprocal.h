// How an FP8 op forms inv = 1 / scale from its static (per-tensor) scale, read on the device.
// Every op with a static e4m3 output or input takes it: layernorm_modulate_fp8, token_cat_fp8,
// fp8_static_quant, fp8_linear (a 16-bit x) and norm_scale_shift (fp8 output).
#pragma once

#include <cstdint>

namespace ditops {

enum class Fp8Reciprocal : uint8_t {
  // IEEE division (div.rn): what eager `1.0 / input_scale` does (Tensor.__rtruediv__ ->
  // reciprocal, an IEEE division on CUDA). Oracle: the eager PyTorch chain.
  ieee,
  // PTX div.full.f32 (approximate, <= 2 ulp): what SGLang's Triton static_quant_fp8 does
  // (Triton lowers 1.0/scale to it). Oracle: SGLang's split chain.
  div_full,
};
const char* fp8_reciprocal_name(Fp8Reciprocal mode);

}  // namespace ditops
