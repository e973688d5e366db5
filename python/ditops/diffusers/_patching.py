"""What enable changes in a model, recorded so that disable restores exactly that.

Two kinds of change, both on module instances (never on classes, so other models of the same
class are untouched):
  * an attention processor replaced through the module's own set_processor;
  * a module's forward overridden by an instance attribute (the class's forward is untouched:
    removing the attribute restores it).
A plan is built completely (and every refusal raised) before the first change is applied.
"""
from __future__ import annotations

import types
import warnings


class _ForwardPatch:
    def __init__(self, path, module, forward):
        self.path, self.module, self.forward = path, module, forward
        self.bound = None
        self.had_own = False
        self.own = None

    def apply(self):
        self.had_own = "forward" in self.module.__dict__
        self.own = self.module.__dict__.get("forward")
        self.bound = types.MethodType(self.forward, self.module)
        self.module.forward = self.bound

    def restore(self) -> str:
        if self.module.__dict__.get("forward") is not self.bound:
            return f"{self.path}.forward was replaced after enable; left as it is"
        if self.had_own:
            self.module.forward = self.own
        else:
            del self.module.forward
        return ""


class _ProcessorPatch:
    def __init__(self, path, attn, processor):
        self.path, self.attn, self.processor = path, attn, processor
        self.original = None

    def apply(self):
        self.original = self.attn.processor
        self.attn.set_processor(self.processor)

    def restore(self) -> str:
        if self.attn.processor is not self.processor:
            return f"{self.path}.processor was replaced after enable; left as it is"
        self.attn.set_processor(self.original)
        return ""


class Plan:
    """The sites of one model and the changes that install them."""

    def __init__(self, prefix: str = ""):
        self.prefix = prefix
        self.sites = []
        self.patches = []
        self.skipped: list[tuple[str, str]] = []   # whole modules left as they are, and why

    def add_site(self, site):
        self.sites.append(site)
        return site

    def patch_forward(self, path, module, forward):
        self.patches.append(_ForwardPatch(self.prefix + path, module, forward))

    def patch_processor(self, path, attn, processor):
        self.patches.append(_ProcessorPatch(self.prefix + path, attn, processor))

    def skip(self, path, why):
        self.skipped.append((self.prefix + path, why))

    def apply(self):
        done = []
        try:
            for patch in self.patches:
                patch.apply()
                done.append(patch)
        except BaseException:
            for patch in reversed(done):
                patch.restore()
            raise

    def restore(self):
        for patch in reversed(self.patches):
            why = patch.restore()
            if why:
                warnings.warn(f"ditops.diffusers.disable: {why}", RuntimeWarning, stacklevel=3)
