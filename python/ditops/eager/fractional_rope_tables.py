"""fractional_rope_tables' eager chain: LTX-2's LTX2AudioVideoRotaryPosEmbed.forward after its
frequencies (diffusers 0.42.1), written here with torch ops in the same order: the bounds'
midpoint, the per-axis division by the base sizes, the outer product with the frequencies, its
transpose, cos and sin in float32, the padding in front."""
from __future__ import annotations

import torch

from ._registry import eager


def module_freqs(theta: float, frequencies: int, double_precision: bool, device):
    """The module's frequencies: theta ** linspace(0, 1, F) * pi / 2 (float64 with double_precision),
    as float32: the op's `freqs`."""
    dtype = torch.float64 if double_precision else torch.float32
    pow_indices = torch.pow(theta, torch.linspace(start=0.0, end=1.0, steps=frequencies, dtype=dtype, device=device))
    return (pow_indices * torch.pi / 2.0).to(dtype=torch.float32)


def fractional_rope_tables(coords, freqs, max_positions, width: int, layout: str = "split"):
    """(cos, sin) [B, P, width] float32 of coords [B, A, P, 2] (bounds) or [B, A, P] (positions)."""
    axes = coords.shape[1]
    if coords.ndim == 4:
        coords_start, coords_end = coords.chunk(2, dim=-1)
        coords = ((coords_start + coords_end) / 2.0).squeeze(-1)
    grid = torch.stack([coords[:, i] / max_positions[i] for i in range(axes)], dim=-1)
    angles = ((grid.unsqueeze(-1) * 2 - 1) * freqs).transpose(-1, -2).flatten(2)
    cos, sin = angles.cos(), angles.sin()
    if layout == "interleaved":
        cos, sin = cos.repeat_interleave(2, dim=-1), sin.repeat_interleave(2, dim=-1)
    pad = width - cos.shape[-1]
    if pad:
        cos = torch.cat([torch.ones_like(cos[:, :, :pad]), cos], dim=-1)
        sin = torch.cat([torch.zeros_like(sin[:, :, :pad]), sin], dim=-1)
    return cos, sin


@eager("fractional_rope_tables")
def fractional_rope_tables_eager(coords, freqs, cos, sin, max_pos0=20, max_pos1=2048, max_pos2=2048, layout="split"):
    """The op's chain: fractional_rope_tables at the width of the caller's tables -> (cos, sin)."""
    return fractional_rope_tables(coords, freqs, (max_pos0, max_pos1, max_pos2), cos.shape[-1], str(layout))
