"""The first-sight gate: per-signature states of a fused path checked against the chain it
replaces. One mechanism for ditops.torch's apply_qk_norm_rope and ditops.diffusers' sites.

A signature is the tuple of everything that selects a different kernel. States: unverified (not
seen yet) -> verified (the check passed), disabled (it failed: warned once) or unfit (nothing may
run it here). Several threads may check one signature at once: disabled wins (a signature one
thread found unequal never becomes verified, nor unfit)."""
from __future__ import annotations

import threading
import warnings

VERIFIED, DISABLED, UNFIT, UNVERIFIED = "verified", "disabled", "unfit", "unverified"


class Gate:
    """One path's states by signature; the owner runs the check and words the warning."""

    def __init__(self):
        self.states: dict = {}    # signature -> VERIFIED / DISABLED / UNFIT
        self.reasons: dict = {}   # disabled signature -> why
        self.unfit: dict = {}     # unfit signature -> why
        # the dicts above; a site's counters share it and it resets the gate holding it: reentrant
        self.lock = threading.RLock()

    def state(self, sig) -> str:
        return self.states.get(sig, UNVERIFIED)

    def verify(self, sig) -> bool:
        """Marks sig verified unless it is disabled; whether it now is verified."""
        with self.lock:
            if self.states.get(sig) == DISABLED:
                return False
            self.states[sig] = VERIFIED
            return True

    def mark_unfit(self, sig, why: str) -> None:
        with self.lock:
            if self.states.get(sig) != DISABLED:
                self.states[sig] = UNFIT
                self.unfit[sig] = why

    def disable(self, sig, why: str, warning: str, stacklevel: int = 1) -> bool:
        """Disables sig for good; warns `warning` the first time (stacklevel 1: where disable is
        called, as warnings.warn's). Whether this was the first time."""
        with self.lock:
            first = self.states.get(sig) != DISABLED
            if first:
                self.states[sig] = DISABLED
                self.reasons[sig] = why
        if first:
            warnings.warn(warning, RuntimeWarning, stacklevel=stacklevel + 1)
        return first

    def reset(self) -> None:
        with self.lock:
            self.states.clear()
            self.reasons.clear()
            self.unfit.clear()
