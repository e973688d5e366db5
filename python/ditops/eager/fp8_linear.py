"""fp8_linear's chains: PyTorch's own FP8 linear (torch._scaled_mm, the oracle of the cuBLASLt
implementation) and an fp32 chain for the benchmarks and the fallback."""
from __future__ import annotations

import torch

from ._registry import oracle
from .fp8_static_quant import static_quant_fp8_eager


def fp8_linear_eager(x, x_scale, w, w_scale, bias=None):
    """fp8_linear as an eager chain: x quantized as fp8_static_quant does (when 16-bit), the
    dequantized product in fp32, the bias, one rounding to bf16. Not the oracle of any contract
    (fp8_linear's are `close` to the fp64 product; torch's fp32 matmul order is its own): the
    benchmarks' reference value and a fallback."""
    xq = x if x.dtype == torch.float8_e4m3fn else static_quant_fp8_eager(x, x_scale)
    y = (xq.float() @ w.float().t()) * (x_scale.float() * w_scale.float()).reshape(())
    if bias is not None:
        y = y + bias.float()
    return y.to(torch.bfloat16)


def fp8_linear_scaled_mm(x, x_scale, w, w_scale, bias=None):
    """fp8_linear as PyTorch's own FP8 linear runs it on CUDA: x quantized as fp8_static_quant does
    (when 16-bit, IEEE reciprocal), then torch._scaled_mm (cuBLASLt). fp8_linear.cublaslt's
    contract: byte-equal to this on the same device and cuBLASLt library."""
    xq = x if x.dtype == torch.float8_e4m3fn else static_quant_fp8_eager(x, x_scale)
    return torch._scaled_mm(xq, w.t(), scale_a=x_scale.reshape(1).float(), scale_b=w_scale.reshape(1).float(),
                            bias=bias, out_dtype=torch.bfloat16)


@oracle("fp8_linear")
def _oracle(x, o):
    # torch._scaled_mm is the chain fp8_linear.cublaslt is byte-equal to, on CUDA only; on the
    # CPU every implementation is `close` to the fp64 product and no chain is an oracle.
    if not x["x"].is_cuda or o["fp8_reciprocal"] != "ieee" or x["w"].shape[0] % 16 != 0:
        return None  # torch._scaled_mm takes N % 16 == 0 only (as cuBLASLt's FP8 layouts)
    return {"out": fp8_linear_scaled_mm(x["x"], x["x_scale"], x["w"], x["w_scale"], x.get("bias"))}
