"""The rowwise dynamic FP8 recipe (torchao 0.18's float8 dynamic rowwise activation quantization, its
torch path, with our zero-row rule) and fp8_rowwise_quant's eager chain: the oracle of every FP8
producer (each producer's chain is the model's bf16 chain followed by fp8_rowwise_eager) and what the
Python FP8 path quantizes a bf16 activation with."""
from __future__ import annotations

import torch

from ._registry import oracle
from .gelu_tanh import gelu_tanh
from .swiglu import swiglu


def fp8_rowwise_eager(y):
    """(q, s): y's rows (the last dim) as e4m3 with per-row fp32 scales, s of shape [..., 1].
    amax = |y|.amax(-1) in y's dtype (NaN propagates); s = (amax / 448.0) in y's dtype (ATen: the
    product with fp32(1/448) rounded to the dtype), then fp32; where s is 0 (a zero row, or amax / 448
    rounding to 0) s = 1 (torchao has no such rule: its zero rows give NaN bytes); q =
    (y.float() / s).clamp(-448, 448).to(float8_e4m3fn)."""
    amax = y.abs().amax(dim=-1, keepdim=True)
    s = (amax / 448.0).to(torch.float32)
    s = s.masked_fill(s == 0, 1.0)
    q = (y.to(torch.float32) / s).clamp(-448, 448).to(torch.float8_e4m3fn)
    return q, s


def fp8_rowwise_quant_eager(x, prefix=None, act="none"):
    """fp8_rowwise_quant's chain: fp8_rowwise_eager of cat([prefix, act(x)], -1) as [M, Kp + N] rows
    (act "gelu_tanh": gelu_tanh(x), F.gelu(x, approximate="tanh"), N = K; "swiglu": swiglu(x), N = K / 2).
    Returns (out [M, Kp + N], out_scale [M, 1])."""
    if act == "swiglu":
        y = swiglu(x)
    else:
        y = gelu_tanh(x) if act == "gelu_tanh" else x
    if prefix is not None:
        y = torch.cat([prefix, y], -1)
    return fp8_rowwise_eager(y.reshape(-1, y.shape[-1]))


@oracle("fp8_rowwise_quant")
def _oracle(x, o):
    out, out_scale = fp8_rowwise_quant_eager(x["x"], x.get("prefix"), o["act"])
    return {"out": out, "out_scale": out_scale}
