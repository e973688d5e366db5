"""Shared by the bench/*_torch.py scripts (imported from the script's own folder)."""
import torch


def allow_recompiles(limit=256):
    """One torch.compile'd function is called at every benchmark shape (dynamic=False, so it is
    recompiled per shape). Dynamo stops recompiling after its limit (8 by default) and then runs
    the function eagerly, which would report eager times as torch.compile: raise the limits."""
    cfg = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(cfg, name):
            setattr(cfg, name, limit)
    for name in ("accumulated_recompile_limit", "accumulated_cache_size_limit"):
        if hasattr(cfg, name):
            setattr(cfg, name, 16 * limit)
