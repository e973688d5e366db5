"""The table every op's module fills when it is imported: the op's oracle (the tensors its eager
chain writes for a call) and, where it differs, its fallback."""
import inspect
import sys

ORACLES: dict = {}
FALLBACKS: dict = {}
CHAINS: dict = {}  # op -> the eager chain @eager registered (bench/op_table_torch.py times it)


def oracle(*ops):
    """Registers `fn(x, o)` as the oracle of `ops`: x the tensors by slot name (absent ones left
    out), o the options as the op table's text, every option present. It returns the written
    tensors by slot name, or None where no eager chain is that call's oracle."""
    def register(fn):
        for op in ops:
            ORACLES[op] = fn
        return fn
    return register


def eager(op, **when):
    """Registers the decorated eager chain itself as the oracle of `op`, so that its parameter list is
    the one place the op's inputs are named in Python: each parameter takes the call's tensor or option
    of its name (an absent optional tensor is None; an option is converted from the op table's text by
    its kind), and what the chain returns is the op's written tensors in the table's order (one tensor,
    or a tuple). `when` gives option values (the table's text) outside which no eager chain is the
    oracle: @eager("token_cat_fp8", fp8_reciprocal="ieee")."""
    def register(chain):
        params = list(inspect.signature(chain).parameters.values())

        def chain_oracle(x, o):
            if any(o[name] != value for name, value in when.items()):
                return None
            kinds = _option_kinds(op)
            args = {}
            for p in params:
                if p.name in x:
                    args[p.name] = x[p.name]
                elif _is_tensor_slot(op, p.name):
                    args[p.name] = None  # an absent optional tensor
                else:
                    args[p.name] = _option_value(o[p.name], kinds.get(p.name), p.default)
            result = chain(**args)
            written = _written(op)
            outputs = result if isinstance(result, tuple) else (result,)
            return dict(zip(written, outputs))

        ORACLES[op] = chain_oracle
        CHAINS[op] = chain
        return chain
    return register


def fallback(*ops):
    """Registers what the torch ops of `ops` write when they fall back (ditops.torch), where that is
    not the oracle alone: e.g. the eager chain a `close` mode's contract is stated against."""
    def register(fn):
        for op in ops:
            FALLBACKS[op] = fn
        return fn
    return register


def _table(op):
    """The op's entry of the op table, or None where the ditops package is not loaded (ditops.eager
    loaded by path: its chains are called by name then, never as oracles)."""
    package = sys.modules.get(__name__.split(".")[0])
    table = getattr(package, "_TABLE", None)
    for entry in table or ():
        if entry["name"] == op:
            return entry
    return None


def _option_kinds(op):
    entry = _table(op)
    return {o["name"]: o["kind"] for o in entry["options"]} if entry else {}


def _is_tensor_slot(op, name):
    entry = _table(op)
    return bool(entry) and any(t["name"] == name for t in entry["tensors"])


def _written(op):
    entry = _table(op)
    if entry is None:
        raise RuntimeError(f"ditops.eager: {op}'s oracle needs the op table (import ditops)")
    return [t["name"] for t in entry["tensors"] if t["role"] != "in"]


def _option_value(text, kind, default):
    """An option's value from the op table's text: by its kind, else as the chain's default's type."""
    kind = kind or {bool: "bool", int: "int", float: "float"}.get(type(default), "choice")
    if kind in ("bool", "optional_bool"):
        return None if text in ("none", "") else text in ("true", "1")
    if kind == "int":
        return int(text)
    if kind == "float":
        return float(text)
    return text
