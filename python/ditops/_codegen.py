"""Python source derived from the op table the core exports (ditops/op.h, `op_table`).

Each op is described once, in C++. From its description this module writes, as source text that
the package executes at import: the Python function (tensors, then the options as keywords with
the C++ defaults, outputs allocated when absent), its explain twin, and for PyTorch the
torch.library schema, implementation and fake. Generated functions are plain Python (no
per-call introspection), so they cost what hand-written ones did. `ditops.generated_source()`
shows the text.
"""
from __future__ import annotations

import json
import re

# ditops dtype names -> torch dtype attribute names.
TORCH_DTYPES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16", "f8e4m3fn": "float8_e4m3fn",
                "f8e5m2": "float8_e5m2", "u8": "uint8", "i32": "int32", "i64": "int64"}


def parse_table(text: str) -> list[dict]:
    return json.loads(text)


def _default_literal(option: dict) -> str:
    """The option's C++ default as a Python literal."""
    kind, text = option["kind"], option["default"]
    if kind in ("bool", "optional_bool"):
        return {"true": "True", "false": "False", "none": "None"}[text]
    if kind == "int":
        return str(int(text))
    if kind == "float":
        return repr(float(text))
    return repr(text)


_SCHEMA_TYPES = {"bool": "bool", "optional_bool": "bool?", "int": "int", "float": "float", "choice": "str"}


def positional_inputs(op: dict) -> list[dict]:
    return [t for t in op["tensors"] if not t["keyword"] and t["role"] != "out"]


def _positional_defaults(slots: list[dict]) -> set:
    """Names of positional optional tensors that get `=None`: only those after which every
    positional slot is optional too (Python and torch schemas both need that)."""
    out = set()
    for t in reversed(slots):
        if not t["optional"]:
            break
        out.add(t["name"])
    return out


def _shape_expr(rule: str) -> tuple[str, str]:
    """An `alloc` rule's extents as a Python tuple expression, and the tensor it is placed like."""
    names = re.findall(r"(?:rows|last|dim)\((\w+)", rule)
    expr = re.sub(r"last_or_0\((\w+)\)", r"(\1.shape[-1] if \1 is not None else 0)", rule)
    expr = re.sub(r"\bis\((\w+),\s*(\w+)\)", r"int(\1 == '\2')", expr)
    expr = re.sub(r"dim\((\w+),\s*(\d+)\)", r"\1.shape[\2]", expr)
    expr = re.sub(r"rows\((\w+)\)", r"_rows(\1)", expr)
    expr = re.sub(r"last\((\w+)\)", r"\1.shape[-1]", expr)
    expr = expr.replace("up128(", "_up128(").replace("/", "//")
    return "(" + expr + ",)", names[0]


def _present_expr(op: dict, slot: dict) -> str | None:
    """When an output is produced, as a Python expression of the call's arguments; None for
    outputs only a caller can ask for. A rule's name is a tensor (given: not None) or a boolean
    option (given: true), as the C++ output_present reads it."""
    rule = slot["present"]
    options = {o["name"] for o in op["options"]}

    def given(n):
        return f"bool({n})" if n in options else f"{n} is not None"

    if rule == "always":
        return "True"
    if rule == "caller":
        return None
    if rule.startswith("given:"):
        return "(" + " or ".join(given(n) for n in rule[6:].split(",")) + ")"
    m = re.fullmatch(r"flag:(\w+);absent:([\w,]+)", rule)
    if m:
        flag, absent = m.group(1), m.group(2).split(",")
        return f"({flag} if {flag} is not None else not (" + " or ".join(given(n) for n in absent) + "))"
    raise ValueError(f"ditops: output {slot['name']}: unknown presence rule {rule!r}")


def _alloc_call(op: dict, slot: dict, new: str) -> str:
    """An expression allocating `slot` with the function `new(op, name, like, shape, dtype,
    strided, like_name)`; shape is a function (called once `new` knows it can allocate for like's
    kind); like_name names the tensor it is allocated like (a message for a like that is none)."""
    rule, dtype = slot["alloc"], slot["alloc_dtype"]
    dt = repr(TORCH_DTYPES[dtype]) if dtype else "None"
    if rule.startswith("like:"):
        like = rule[5:]
        return f"{new}({op['name']!r}, {slot['name']!r}, {like}, lambda: tuple({like}.shape), {dt}, False, {like!r})"
    if rule.startswith("strided:"):
        like = rule[8:]
        return f"{new}({op['name']!r}, {slot['name']!r}, {like}, lambda: tuple({like}.shape), {dt}, True, {like!r})"
    shape, like = _shape_expr(rule)
    if slot.get("alloc_format"):  # dense in that tensor's dimension order
        fmt = slot["alloc_format"]
        return f"{new}({op['name']!r}, {slot['name']!r}, {fmt}, lambda: {shape}, {dt}, 'format', {fmt!r})"
    return f"{new}({op['name']!r}, {slot['name']!r}, {like}, lambda: {shape}, {dt}, False, {like!r})"


def returned_outputs(op: dict) -> list[dict]:
    """The outputs a functional binding returns (all but caller-only ones)."""
    return [t for t in op["tensors"] if t["role"] == "out" and t["present"] != "caller"]


def _signature(op: dict, with_stream: bool) -> str:
    pos = positional_inputs(op)
    defaults = _positional_defaults(pos)
    params = [t["name"] + ("=None" if t["name"] in defaults else "") for t in pos]
    kw = [t["name"] + "=None" for t in op["tensors"] if t["keyword"] or t["role"] == "out"]
    kw += [o["name"] + "=" + _default_literal(o) for o in op["options"]]
    kw += ["backend=None", "quality=None"] + (["stream=None"] if with_stream else [])
    return ", ".join(params + ["*"] + kw)


def _call_args(op: dict) -> str:
    tensors = []
    for t in op["tensors"]:
        tensors.append(t["name"] if t["role"] != "in" else f"_readable({t['name']})")
    options = [o["name"] for o in op["options"]]
    return ", ".join(tensors + options + ["backend", "quality"])


def call_arguments(op: dict, tensors: dict, options: dict | None = None, backend=None, quality=None) -> tuple:
    """The arguments of the FFI entry `call(op_index, explain, stream, *arguments)` for one call, in
    the order the generated functions pass them: every tensor slot (None when absent), every option
    (None: the C++ default), backend, quality. For raw calls (the host-overhead benchmark): built
    from the table, they follow every option the op gains. Unknown names raise ValueError."""
    options = options or {}
    slots = [t["name"] for t in op["tensors"]]
    names = [o["name"] for o in op["options"]]
    for given, known, what in ((tensors, slots, "tensor"), (options, names, "option")):
        unknown = sorted(set(given) - set(known))
        if unknown:
            raise ValueError(f"{op['name']}: no {what} named {', '.join(unknown)} (its {what}s: {', '.join(known)})")
    return tuple(tensors.get(n) for n in slots) + tuple(options.get(n) for n in names) + (backend, quality)


def _docstring(op: dict) -> str:
    lines = [op["summary"] + ".", "", op["doc"], ""]
    for t in op["tensors"]:
        shape = f" [{t['shape']}]" if t["shape"] else ""
        extra = []
        if t["optional"]:
            extra.append("optional")
        if t["role"] == "out":
            extra.append("allocated when None" if t["present"] != "caller" else "written when given")
        lines.append(f"{t['name']} ({t['role']}, {t['dtypes']}{shape}{', ' + ', '.join(extra) if extra else ''})"
                     + (f": {t['doc']}" if t["doc"] else ""))
    for o in op["options"]:
        choices = f" ({'/'.join(o['choices'])})" if o["choices"] else ""
        lines.append(f"{o['name']}={_default_literal(o)}{choices}: {o['doc']}")
    lines.append("backend: kda/aot/jit/vendor/reference (strict); quality: exact (default)/lossless/high.")
    return "\n    ".join(lines).replace('"""', "'''")


def outputs_class_name(op: dict) -> str:
    return "".join(part.capitalize() for part in op["name"].split("_")) + "Outputs"


def python_source(ops: list[dict]) -> str:
    """The package's op functions and explain entries."""
    src = []
    for index, op in enumerate(ops):
        name = op["name"]
        outs = returned_outputs(op)
        body = []
        for t in op["tensors"]:
            if t["role"] == "inout":
                body.append(f"_check_writable({name!r}, {t['name']!r}, {t['name']})")
            elif t["role"] == "out":
                present = _present_expr(op, t)
                body.append(f"if {t['name']} is not None:")
                body.append(f"    _check_writable({name!r}, {t['name']!r}, {t['name']})")
                if present is not None:
                    body.append(f"elif {present}:")
                    body.append(f"    {t['name']} = {_alloc_call(op, t, '_new_output')}")
        if len(outs) > 1:
            fields = ", ".join(repr(t["name"]) for t in outs)
            src.append(f"{outputs_class_name(op)} = _namedtuple({outputs_class_name(op)!r}, [{fields}])\n")
        if not outs:
            result = "ran"
        elif len(outs) == 1:
            result = outs[0]["name"]
        else:
            result = f"{outputs_class_name(op)}(" + ", ".join(t["name"] for t in outs) + ")"
        prep = "\n    ".join(body) if body else "pass"
        src.append(f'''
def {name}({_signature(op, True)}):
    """{_docstring(op)}"""
    {prep}
    ran = str(_call({index}, False, _stream_handle(stream), {_call_args(op)}))
    return {result}


def _explain_{name}({_signature(op, False)}):
    {prep}
    return _call({index}, True, _ENV_STREAM, {_call_args(op)})

''')
    src.append("_OPS = {" + ", ".join(f"{op['name']!r}: {op['name']}" for op in ops) + "}\n")
    src.append("_EXPLAIN = {" + ", ".join(f"{op['name']!r}: _explain_{op['name']}" for op in ops) + "}\n")
    return "\n".join(src)


def torch_schema(op: dict) -> str:
    pos = positional_inputs(op)
    defaults = _positional_defaults(pos)
    alias = iter("abcdefghijklmnop")
    args = []

    def tensor_arg(t):
        kind = "Tensor?" if t["optional"] else "Tensor"
        if t["role"] == "inout":
            kind = f"Tensor({next(alias)}!)"
        return f"{kind} {t['name']}"

    for t in pos:
        args.append(tensor_arg(t) + ("=None" if t["name"] in defaults else ""))
    args.append("*")
    for t in op["tensors"]:
        if t["keyword"] and t["role"] != "out":
            args.append(tensor_arg(t) + ("=None" if t["optional"] else ""))
    for o in op["options"]:
        args.append(f"{_SCHEMA_TYPES[o['kind']]} {o['name']}={_default_literal(o)}")
    args += ["str? backend=None", "str? quality=None"]
    outs = returned_outputs(op)
    if not outs:
        ret = "()"
    elif len(outs) == 1:
        ret = "Tensor"
    else:
        ret = "(" + ", ".join(f"Tensor {t['name']}" for t in outs) + ")"
    return f"{op['name']}({', '.join(args)}) -> {ret}"


def torch_source(ops: list[dict]) -> str:
    """torch.library implementations and fakes: functional outputs (absent ones are empty [0]
    tensors of their dtype, since a schema returns a fixed number of tensors), in-place ops
    return nothing. Implementations call `_run_or_fallback` (ditops.torch), which runs the op's
    eager chain where no implementation takes a valid call."""
    src = []
    for index, op in enumerate(ops):
        name = op["name"]
        pos = positional_inputs(op)
        defaults = _positional_defaults(pos)
        params = [t["name"] + ("=None" if t["name"] in defaults else "") for t in pos]
        kw = [t["name"] + "=None" for t in op["tensors"] if t["keyword"] and t["role"] != "out"]
        kw += [o["name"] + "=" + _default_literal(o) for o in op["options"]] + ["backend=None", "quality=None"]
        sig = ", ".join(params + ["*"] + kw)
        outs = returned_outputs(op)
        # outputs a presence rule names before they are allocated (none is passed here) read as absent
        alloc = [" = ".join([t["name"] for t in outs] + ["None"])] if outs else []
        for t in outs:
            alloc.append(f"{t['name']} = {_alloc_call(op, t, '_new')} if {_present_expr(op, t)} else None")
        alloc_src = "\n    ".join(alloc) if alloc else "pass"
        passed = [t["name"] if t["role"] != "out" or t["present"] != "caller" else "None" for t in op["tensors"]]
        call_args = ", ".join(passed + [o["name"] for o in op["options"]] + ["backend", "quality"])
        # The call's tensors and options by name, built only when the eager fallback runs.
        slots = ", ".join(f"{t['name']!r}: {p}" for t, p in zip(op["tensors"], passed))
        opts = ", ".join(f"{o['name']!r}: {o['name']}" for o in op["options"])
        if not outs:
            ret, fake_ret = "None", "None"
        else:
            items = ", ".join(f"_or_empty({t['name']}, {t['name']}_like)" for t in outs)
            ret = f"({items},)" if len(outs) > 1 else f"_or_empty({outs[0]['name']}, {outs[0]['name']}_like)"
            fake_ret = ret
        likes = []
        for t in outs:
            dt = repr(TORCH_DTYPES[t["alloc_dtype"]]) if t["alloc_dtype"] else "None"
            like = re.findall(r"(?:like:|strided:|rows\(|last\(|dim\()(\w+)", t["alloc"])[0]
            likes.append(f"{t['name']}_like = ({like}, {dt})")
        likes_src = "\n    ".join(likes) if likes else "pass"
        src.append(f'''
def _impl_{name}({sig}):
    {alloc_src}
    {likes_src}
    _run_or_fallback({index}, {name!r}, backend, ({call_args},), lambda: ({{{slots}}}, {{{opts}}}))
    return {ret}


def _fake_{name}({sig}):
    {alloc_src}
    {likes_src}
    return {fake_ret}


_define({torch_schema(op)!r}, _impl_{name}, _fake_{name})
{name} = torch.ops.ditops.{name}
''')
    return "\n".join(src)
