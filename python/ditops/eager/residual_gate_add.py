"""residual_gate_add's eager chains: `residual + update * gate`, and Wan's promoted chain beside an
f32 gate."""
from __future__ import annotations

import torch

from ._registry import oracle


def residual_gate_add_eager(residual, update, gate):
    """The gated residual as models write it: the product rounded to the dtype, then the sum."""
    return residual + update * gate


def residual_gate_add_float32_eager(residual, update, gate):
    """Wan's gated residuals (diffusers WanTransformerBlock): an f32 gate beside bf16/f16 residual
    and update, `(x.float() + attn_output * gate).type_as(x)` (the FFN's `ff_output.float() * gate`
    is the same product): product and sum in fp32, one rounding."""
    return (residual.float() + update * gate).type_as(residual)


@oracle("residual_gate_add")
def _oracle(x, o):
    promoted = x["gate"].dtype == torch.float32 and x["residual"].dtype != torch.float32
    chain = residual_gate_add_float32_eager if promoted else residual_gate_add_eager
    return {"out": chain(x["residual"], x["update"], x["gate"])}
