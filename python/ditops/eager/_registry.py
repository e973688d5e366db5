"""The table every op's module fills when it is imported: the op's oracle (the tensors its eager
chain writes for a call) and, where it differs, its fallback."""

ORACLES: dict = {}
FALLBACKS: dict = {}


def oracle(*ops):
    """Registers `fn(x, o)` as the oracle of `ops`: x the tensors by slot name (absent ones left
    out), o the options as the op table's text, every option present. It returns the written
    tensors by slot name, or None where no eager chain is that call's oracle."""
    def register(fn):
        for op in ops:
            ORACLES[op] = fn
        return fn
    return register


def fallback(*ops):
    """Registers what the torch ops of `ops` write when they fall back (ditops.torch), where that is
    not the oracle alone: e.g. the eager chain a `close` mode's contract is stated against."""
    def register(fn):
        for op in ops:
            FALLBACKS[op] = fn
        return fn
    return register
