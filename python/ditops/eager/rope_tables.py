"""rope_tables' eager chain: the RoPE cos/sin tables FLUX.1's FluxPosEmbed and FLUX.2's
Flux2PosEmbed build from position ids with diffusers' get_1d_rotary_pos_embed (float64
frequencies, use_real, repeat_interleave_real), written here with torch ops in the same order."""
from __future__ import annotations

import torch

from ._registry import eager


def axis_tables(pos, dim: int, theta: float):
    """One axis: pos [S] float32, its rotary width dim. Every step in float64 until the cast: the
    frequencies theta ** -(2k / dim) as 1.0 / theta ** (arange / dim), their outer product with the
    positions, cos and sin of it, each pair's value twice, then float32."""
    exponents = torch.arange(0, dim, 2, dtype=torch.float64, device=pos.device) / dim
    freqs = 1.0 / (theta ** exponents)
    angles = torch.outer(pos, freqs)
    cos = angles.cos().repeat_interleave(2, dim=1).float()
    sin = angles.sin().repeat_interleave(2, dim=1).float()
    return cos, sin


def rope_tables(ids, axes_dim, theta: float):
    """(cos, sin) [S, sum(axes_dim)] float32 of ids [S, >= len(axes_dim)]: axis a from column a."""
    pos = ids.float()
    tables = [axis_tables(pos[:, a], d, theta) for a, d in enumerate(axes_dim)]
    return torch.cat([c for c, _ in tables], dim=-1), torch.cat([s for _, s in tables], dim=-1)


def axes_of(*dims) -> list:
    """The widths of the op's options axes_dim0..axes_dim3, up to the first 0."""
    out = []
    for d in dims:
        if not d:
            break
        out.append(int(d))
    return out


@eager("rope_tables")
def rope_tables_eager(ids, cos=None, sin=None, axes_dim0=32, axes_dim1=32, axes_dim2=32, axes_dim3=32,
                      theta=2000.0):
    """The op's chain: rope_tables(ids, the options' axes, theta) -> (cos, sin)."""
    return rope_tables(ids, axes_of(axes_dim0, axes_dim1, axes_dim2, axes_dim3), theta)
