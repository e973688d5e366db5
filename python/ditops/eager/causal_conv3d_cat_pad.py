"""causal_conv3d_cat_pad's eager chain: a video VAE's cache concatenation and padding."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ._registry import oracle


def causal_conv3d_cat_pad_eager(x, cache=None, padding=(0, 0, 0, 0, 0, 0)):
    """The input of a video VAE's causal Conv3D: the cached past frames prepended along time, then
    zero padding, F.pad(torch.cat([cache, x], 2), (wl, wr, ht, hb, dl - ct, dr)). padding is
    F.pad's tuple (wl, wr, ht, hb, dl, dr) with dl the conv's whole left time padding, of which the
    cache supplies ct = cache.shape[2] frames (the op's pad_w_left ... pad_t_right options)."""
    wl, wr, ht, hb, dl, dr = padding
    if cache is not None:
        x = torch.cat([cache, x], 2)
        dl = dl - cache.shape[2]
    return F.pad(x, (wl, wr, ht, hb, dl, dr))


@oracle("causal_conv3d_cat_pad")
def _oracle(x, o):
    pads = [int(o[n]) for n in ("pad_w_left", "pad_w_right", "pad_h_top", "pad_h_bottom", "pad_t_left",
                                "pad_t_right")]
    return {"out": causal_conv3d_cat_pad_eager(x["x"], x.get("cache"), pads)}
