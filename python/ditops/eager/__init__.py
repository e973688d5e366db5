"""The unfused PyTorch chains the fused ops replace: the oracle of their bit_exact contracts (on
CUDA), the fallback of the torch ops and the model-layer helpers (ditops.torch), and the reference
of the self-check. One module per op, named after it (ditops/eager/<op>.py), holds its chain and
registers its oracle (ditops/eager/_registry.py); this package finds them, so a new op adds its
module and edits nothing here. The benchmarks load this package by path
(bench/torch_bench_common.load_eager) and use the chains by name: every chain is an attribute of
the package.

Needs only torch (no compiled ditops module). Where the ditops package is loaded, options a caller
leaves out take the op table's defaults; loaded by path, a caller passes every option it reads.
"""
from __future__ import annotations

import importlib
import pkgutil
import sys

from ._registry import FALLBACKS, ORACLES

_OP_MODULES = []
for _info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
    if _info.name.startswith("_"):
        continue
    _module = importlib.import_module(f"{__name__}.{_info.name}")
    _OP_MODULES.append(_module)
    for _name, _value in vars(_module).items():  # the chains, by name
        if not _name.startswith("_") and callable(_value) and getattr(_value, "__module__", None) == _module.__name__:
            globals()[_name] = _value


class _Options(dict):
    """A call's options, each one the caller left out taken from the op table."""

    def __init__(self, op, given):
        super().__init__(given)
        self.op = op

    def __missing__(self, name):
        defaults = _defaults(self.op)
        if name not in defaults:
            raise KeyError(f"ditops.eager: {self.op} has no option {name!r} in the op table (or the ditops "
                           "package is not loaded: pass every option)")
        return defaults[name]


_DEFAULTS: dict = {}


def _defaults(op) -> dict:
    if op not in _DEFAULTS:
        ditops = sys.modules.get(__name__.rpartition(".")[0]) if "." in __name__ else None
        table = getattr(ditops, "op_table", None)
        if table is None:
            return {}
        for entry in table():
            _DEFAULTS[entry["name"]] = {o["name"]: o["default"] for o in entry["options"]}
    return _DEFAULTS.get(op, {})


def oracle_outputs(op, x, o):
    """The tensors the eager chain writes for a call of `op` (x: tensors by slot name, o: options
    as the op table's text), or None where no eager chain is that call's oracle (or `op` has no
    module here). tests/python/test_ops_eager.py checks every case against it."""
    fn = ORACLES.get(op)
    return fn(x, _Options(op, o)) if fn else None


def fallback_outputs(op, x, o):
    """What the torch ops write when they fall back (ditops.torch): the call's oracle outputs, or
    what the op's module registers instead (the eager chain a `close` mode's contract is stated
    against: the oracle itself is within any bound stated against it). None where no eager chain
    may stand in for the call: the caller raises then."""
    fn = FALLBACKS.get(op)
    return fn(x, _Options(op, o)) if fn else oracle_outputs(op, x, o)
