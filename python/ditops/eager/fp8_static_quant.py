"""fp8_static_quant's eager chain: static e4m3 quantization with eager's IEEE reciprocal, which the
other FP8 ops' chains end with."""
from __future__ import annotations

import torch

from ._registry import eager


def static_quant_fp8_eager(y, input_scale):
    """Static e4m3 quantization with eager's IEEE reciprocal (layernorm_modulate_fp8's
    fp8_reciprocal="ieee")."""
    return (y.float() * (1.0 / input_scale)).clamp(-448, 448).to(torch.float8_e4m3fn)


@eager("fp8_static_quant", fp8_reciprocal="ieee")
def fp8_static_quant_eager(x, scale):
    """fp8_static_quant with fp8_reciprocal="ieee": eager's static e4m3 quantization of x [M, K]."""
    return static_quant_fp8_eager(x, scale)

