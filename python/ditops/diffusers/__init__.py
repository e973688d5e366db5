"""ditops in a Hugging Face diffusers transformer: one call installs the fused ops at every site
of a supported model, and one call restores it.

    import ditops.diffusers
    report = ditops.diffusers.enable(pipe)        # a pipeline or its transformer, on CUDA
    print(report)                                 # each site class, its places, the op that runs there
    ...
    ditops.diffusers.disable(pipe)                # the same processor objects and forwards as before

    ditops.diffusers.enable(pipe, cuda_graph=True)  # also one CUDA graph per input signature (_graphs.py)
    ditops.diffusers.enable(pipe, fp8=True)         # also the block linears as FP8 GEMMs (fp8.py)

Supported (diffusers >=0.42.1,<0.43, the release range whose model code was read and tested):
FluxTransformer2DModel (FLUX.1), Flux2Transformer2DModel (FLUX.2), QwenImageTransformer2DModel, WanTransformer3DModel,
HunyuanVideoTransformer3DModel, LTX2VideoTransformer3DModel (LTX-2). Each site keeps a first-sight check against the model's own chain
(ditops.diffusers._sites) and falls back with a warning; docs/diffusers.md lists the sites per
model with the chain each reproduces.

Without a GPU: plan(model) returns the report without changing anything, and
enable(model, allow_cpu=True) patches a CPU model so the ops run their CPU reference (tests).
"""
from __future__ import annotations

import re
import weakref

import torch

import ditops
from ditops import Error
import ditops.torch  # noqa: F401  (registers torch.ops.ditops.*)

from . import _graphs, _sites
from . import fp8 as _fp8
from ._graphs import CaptureReport, CapturedForward, capture, captured, release
from .fp8 import Fp8Config
from ._patching import Plan, invalidate_registry_caches

__all__ = ["enable", "disable", "plan", "enabled", "Report", "UnsupportedError", "SUPPORTED_MODELS",
           "TESTED_DIFFUSERS", "SITE_CLASSES", "capture", "release", "captured", "CaptureReport",
           "CapturedForward", "Fp8Config"]

# The diffusers releases whose model code the patched processors and forwards follow.
TESTED_DIFFUSERS = ">=0.42.1,<0.43"
_TESTED_LOW, _TESTED_HIGH = (0, 42, 1, 0), (0, 43, 0, -1)  # <0.43 excludes 0.43 pre-releases

# Model class name -> the module that plans its sites.
SUPPORTED_MODELS = {
    "FluxTransformer2DModel": "flux",
    "Flux2Transformer2DModel": "flux2",
    "QwenImageTransformer2DModel": "qwenimage",
    "WanTransformer3DModel": "wan",
    "HunyuanVideoTransformer3DModel": "hunyuan_video",
    "LTX2VideoTransformer3DModel": "ltx2",
}

# The site classes enable(sites=...) selects from.
SITE_CLASSES = ("qk_norm_rope", "adaln_modulate", "gated_residual", "swiglu", "gelu_tanh", "rope_tables",
                "conv_layout")


class UnsupportedError(Error):
    """enable/plan refused the model (class, device, diffusers version, state); nothing was changed.
    A ditops.Error, so a RuntimeError and a ValueError too."""


class Report:
    """What enable installed in a model (or plan would install): one row per site class with its
    places and the op that runs there, or why the model's code does. The rows are the live sites:
    counters and first-sight results update as the model runs."""

    def __init__(self, model_class: str, diffusers_version: str, quality, device: str, sites,
                 skipped, patched: bool):
        self.model_class = model_class
        self.diffusers_version = diffusers_version
        self.quality = quality
        self.device = device
        self.sites = list(sites)
        self.skipped = list(skipped)
        self.patched = patched
        self.graphs = None  # the CaptureReport of enable(..., cuda_graph=True)
        self.fp8 = None     # the fp8.Fp8Summary of enable(..., fp8=...)

    def __getitem__(self, name: str):
        for site in self.sites:
            if site.name == name:
                return site
        raise KeyError(name)

    def places(self, name: str) -> int:
        return len(self[name].places)

    def as_dict(self) -> dict:
        return {"model": self.model_class, "diffusers": self.diffusers_version, "quality": self.quality,
                "device": self.device, "patched": self.patched,
                "sites": [s.as_dict() for s in self.sites], "skipped": [list(s) for s in self.skipped],
                "graphs": self.graphs.as_dict() if self.graphs is not None else None,
                "fp8": self.fp8.as_dict() if self.fp8 is not None else None}

    def __str__(self):
        head = (f"ditops.diffusers: {self.model_class} (diffusers {self.diffusers_version}) on {self.device}, "
                f"quality {self.quality}, {'patched' if self.patched else 'plan only'}")
        rows = [head, f"  {'site':<34} {'places':>6}  runs"]
        for s in self.sites:
            with s._lock:  # other threads' first sights add signatures
                self._site_rows(s, rows)
        for path, why in self.skipped:
            rows.append(f"  not patched: {path}: {why}")
        if self.fp8 is not None:
            rows.append(str(self.fp8))
        if self.graphs is not None:
            rows.append(str(self.graphs))
        return "\n".join(rows)

    @staticmethod
    def _site_rows(s, rows):
        """One site's rows (its lock held)."""
        rows.append(f"  {s.name:<34} {len(s.places):>6}  {s.runs()}")
        if s.op is None and s.why:
            rows.append(f"  {'':<34} {'':>6}  why: {s.why}")
        if s.note:
            rows.append(f"  {'':<34} {'':>6}  note: {s.note}")
        for path, why in s.skipped[:3]:
            rows.append(f"  {'':<34} {'':>6}  model's code at {path}: {why}")
        if len(s.skipped) > 3:
            rows.append(f"  {'':<34} {'':>6}  ... and {len(s.skipped) - 3} more places")
        if s.fused_calls or s.model_calls or s.states:
            verified = sum(1 for v in s.states.values() if v == _sites.VERIFIED)
            rows.append(f"  {'':<34} {'':>6}  calls: {s.fused_calls} fused, {s.model_calls} model; "
                        f"signatures: {verified} verified, {len(s.reasons)} disabled, {len(s.unfit)} unfit")
        chosen = sorted(set(s.implementations.values()))
        if chosen:
            rows.append(f"  {'':<34} {'':>6}  implementations: {', '.join(chosen)}")
        for sig, why in s.reasons.items():
            rows.append(f"  {'':<34} {'':>6}  disabled {sig}: {why}")
        for sig, (n, largest) in s.differences.items():
            if n:
                rows.append(f"  {'':<34} {'':>6}  first sight {sig}: {n} differ, max |d| {largest:.3g}")
        for why, n in s.fallbacks.most_common(3):
            rows.append(f"  {'':<34} {'':>6}  {n} call(s) on the model's code: {why}")

    def __repr__(self):
        return (f"Report({self.model_class}, " + ", ".join(f"{s.name}={len(s.places)}:{s.op if s.active else None}"
                                                         for s in self.sites) + ")")


class _Enabled:
    def __init__(self, plans, report):
        self.plans, self.report = plans, report


# Models with ditops installed -> what was changed (weak: a dropped model drops its record).
# Changed under _graphs.INSTALL_LOCK only.
_ENABLED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _version_tuple(text: str) -> tuple:
    """(major, minor, patch) of a release; a pre-release (0.43.0.dev0, 0.42.1rc1) ranks below its
    release; unparsable text ranks below everything."""
    m = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?(.*)$", text.strip())
    if not m:
        return (-1, 0, 0, 0)
    release = (int(m.group(1)), int(m.group(2)), int(m.group(3) or 0))
    rest = m.group(4)
    pre = bool(rest) and not rest.startswith(("+", ".post", "post"))
    return release + ((-1,) if pre else (0,))


def diffusers_version() -> str:
    try:
        import diffusers
    except ImportError as e:
        raise UnsupportedError("ditops.diffusers needs diffusers (pip install 'ditops[diffusers]' or "
                               f"pip install 'diffusers{TESTED_DIFFUSERS}')") from e
    return str(diffusers.__version__)


def _check_version() -> str:
    version = diffusers_version()
    v = _version_tuple(version)
    if not (_TESTED_LOW <= v < _TESTED_HIGH):
        raise UnsupportedError(
            f"ditops.diffusers: diffusers {version} is outside the tested range {TESTED_DIFFUSERS}; the "
            "patched processors and block forwards follow that release's model code, so nothing was "
            f"changed (install diffusers{TESTED_DIFFUSERS})")
    return version


def _transformers(model_or_pipeline):
    """[(prefix, model)]: the model itself, or a pipeline's transformer (and transformer_2)."""
    target = getattr(model_or_pipeline, "_orig_mod", model_or_pipeline)  # torch.compile's wrapper
    if isinstance(target, torch.nn.Module):
        return [("", target)]
    found = []
    for name in ("transformer", "transformer_2"):
        part = getattr(model_or_pipeline, name, None)
        if part is not None:
            found.append((name + ".", getattr(part, "_orig_mod", part)))
    if not found:
        raise UnsupportedError(f"ditops.diffusers: {type(model_or_pipeline).__name__} is neither a model nor a "
                               "pipeline with a transformer; nothing was changed")
    return found


def _device(model) -> str:
    devices = {p.device for p in model.parameters()} | {b.device for b in model.buffers()}
    return ", ".join(sorted(str(d) for d in devices)) or "no parameters"


def _model_module(model):
    """The module that plans the model's sites; UnsupportedError for any other class (subclasses
    included: their forward may differ from the code the patches follow)."""
    name = type(model).__name__
    if name not in SUPPORTED_MODELS:
        raise UnsupportedError(
            f"ditops.diffusers: {name} is not supported (supported: {', '.join(SUPPORTED_MODELS)}); "
            "nothing was changed")
    import importlib
    module = importlib.import_module(f"{__name__}.{SUPPORTED_MODELS[name]}")
    if type(model).__module__ != module.DIFFUSERS_MODULE:
        raise UnsupportedError(f"ditops.diffusers: {type(model).__module__}.{name} is not diffusers' "
                               f"{name}; nothing was changed")
    return module


def _leaf_offload_refusal(model) -> str:
    """Why diffusers' leaf-level group offloading on model rules the sites out, or ''. A leaf
    group is brought to the device by its module's own forward; the fused sites read norm and
    modulation weights without calling those modules, so they would read offloaded weights
    (block-level groups are brought in by the block's forward, which ditops's forward is)."""
    for name, module in model.named_modules():
        registry = module.__dict__.get("_diffusers_hook")
        hook = None if registry is None else registry.hooks.get("group_offloading")
        kind = getattr(getattr(hook, "config", None), "offload_type", None)
        if kind is not None and getattr(kind, "value", kind) == "leaf_level":
            return (f"has diffusers' leaf-level group offloading (at {name or 'the model'}): the fused sites read "
                    "weights of modules whose forward they do not call, which that offloading brings to the "
                    "device only in their forward (use offload_type='block_level')")
    return ""


def _plan_model(prefix, model, probe) -> Plan:
    plan = Plan(prefix)
    _model_module(model).plan(model, plan, probe=probe)
    return plan


def _build(model_or_pipeline, quality, sites, probe, check_device, allow_cpu, fp8=None):
    version = _check_version()
    fp8_config = _fp8.config_of(fp8)
    tier = _sites.effective_quality(quality)
    chosen = set(SITE_CLASSES if sites is None else sites)
    unknown = chosen - set(SITE_CLASSES)
    if unknown:
        raise UnsupportedError(f"ditops.diffusers: unknown site classes {sorted(unknown)} "
                               f"(known: {', '.join(SITE_CLASSES)}); nothing was changed")
    parts = _transformers(model_or_pipeline)
    for _, model in parts:
        _model_module(model)
    plans, devices = [], []
    for prefix, model in parts:
        if model in _ENABLED:
            raise UnsupportedError(f"ditops.diffusers: ditops is already enabled on {prefix or 'the model'}; "
                                   "disable it first")
        device = _device(model)
        if check_device:
            types_ = {p.device.type for p in model.parameters()}
            if "meta" in types_:
                raise UnsupportedError(f"ditops.diffusers: {prefix or 'the model'} has parameters on the meta "
                                       "device (not loaded); nothing was changed")
            if "cpu" in types_ and not allow_cpu:
                raise UnsupportedError(
                    f"ditops.diffusers: {prefix or 'the model'} is on the CPU ({device}); ditops's fused ops "
                    "serve CUDA tensors, so nothing was changed. Move it first (model.to('cuda')); "
                    "tests pass allow_cpu=True to run the ops' CPU reference")
        why = _leaf_offload_refusal(model)
        if why:
            raise UnsupportedError(f"ditops.diffusers: {prefix or 'the model'} {why}; nothing was changed")
        plans.append(_plan_model(prefix, model, probe))
        devices.append(device)
    all_sites = [s for p in plans for s in p.sites]
    for site in all_sites:
        site.quality = tier
        site.exact = tier == _sites.strict_tier()
        site.selected = set(site.classes) <= chosen
        if site.parts and not site.active:  # a fused site that does not run: its parts serve its places
            site.hand_back()
    fp8_summary = None
    if fp8_config is not None:  # issue 43: the FP8 block linears (fp8.py), layered over the sites
        fp8_summary = _fp8.Fp8Summary(fp8_config)
        for (prefix, model), plan_ in zip(parts, plans):
            _fp8.plan(prefix, model, plan_, fp8_config, fp8_summary, cpu_stand_in=allow_cpu)
        all_sites = [s for p in plans for s in p.sites]
    classes = " + ".join(type(m).__name__ for _, m in parts)
    report = Report(classes, version, tier, "; ".join(devices), all_sites,
                    [s for p in plans for s in p.skipped], patched=False)
    report.fp8 = fp8_summary
    return parts, plans, report


def plan(model_or_pipeline, quality=None, *, sites=None, probe: bool = False, fp8=None) -> Report:
    """The report enable would return, without changing anything and on any device (the CPU
    included: the test-only way to see the sites without CUDA). Raises UnsupportedError for an
    unsupported model or diffusers version."""
    _, _, report = _build(model_or_pipeline, quality, sites, probe, check_device=False, allow_cpu=True, fp8=fp8)
    return report


def enable(model_or_pipeline, quality=None, *, sites=None, probe: bool = False,
           allow_cpu: bool = False, cuda_graph: bool = False,
           max_graphs: int = _graphs.DEFAULT_MAX_GRAPHS, fp8=None) -> Report:
    """Install ditops at every site of a supported diffusers transformer (a model, or a pipeline's
    transformer and transformer_2). Returns the Report (live: it counts calls as the model runs).

    quality: the dispatch tier (None: DITOPS_QUALITY, else "exact", the core's bit-exact default;
      "lossless" and "high" admit close implementations, docs/quality.md). In the bit-exact tier
      a site runs its op only for signatures whose first call was torch.equal to the model's
      chain; in the others the first call records the
      difference (the report shows it) and the op's values are kept.
    sites: the site classes to serve (default all of SITE_CLASSES); the others run the model's code.
    probe: also map sites where the op's documented chain does not cover a part of the model's
      chain (the report's note names it); the first-sight check decides there.
    allow_cpu: patch a model on the CPU, where the ops run their CPU reference (for tests: the
      reference is not bit-exact to CPU PyTorch, so in the exact tier most sites fall back).
    cuda_graph: also capture(model_or_pipeline, max_graphs=max_graphs): one CUDA graph per input
      signature, the first call of each eager (the sites' checks run there); report.graphs.
    fp8: True or an Fp8Config: every linear of the transformer blocks as an FP8 GEMM (e4m3 weights
      quantized once per output channel, activations per token, bf16 out; torchao's rowwise
      recipe, fp8.py), fed by the fused producer ops where this build has them; report.fp8.
      disable restores the bf16 weights exactly (they wait on the CPU meanwhile). A model with
      LoRA layers loaded is refused (fuse and unload them first).

    Raises UnsupportedError, with nothing changed, for an unsupported model class, a model on the
    CPU (unless allow_cpu) or the meta device, a diffusers version outside TESTED_DIFFUSERS, or a
    model already enabled. Run one eager forward before torch.compile or CUDA-graph capture: the
    first-sight checks never run while tracing or capturing.

    enable, disable, capture and release may be called from several threads (one at a time
    changes models); an enabled model may be called from several threads (docs/diffusers.md)."""
    with _graphs.INSTALL_LOCK:
        return _enable(model_or_pipeline, quality, sites, probe, allow_cpu, cuda_graph, max_graphs, fp8)


def _enable(model_or_pipeline, quality, sites, probe, allow_cpu, cuda_graph, max_graphs, fp8) -> Report:
    if cuda_graph:
        _graphs.check_max_graphs(max_graphs)
    parts, plans, report = _build(model_or_pipeline, quality, sites, probe, check_device=True,
                                  allow_cpu=allow_cpu, fp8=fp8)
    for _, model in parts:
        _graphs.forget(model)  # a capture's regions leave the blocks' forwards before the plan changes them
    # A capture made before steps aside while the plan patches (a model's own forward, Wan's, goes
    # through ditops's hook) and then wraps the forward as it is.
    lifted = [state for state in (_graphs.captured(model) for _, model in parts) if state is not None]
    for state in lifted:
        state.lift()
    done = []
    try:
        for plan_ in plans:
            plan_.apply()
            done.append(plan_)
    except BaseException:
        for plan_ in reversed(done):
            plan_.restore()
        raise
    finally:
        for state in lifted:
            state.reseat()
    report.patched = True
    for (_, model), plan_ in zip(parts, plans):
        invalidate_registry_caches(model)
        _ENABLED[model] = _Enabled([plan_], report)
        _graphs.forget(model)  # graphs captured before ran the model's code at the sites
    if cuda_graph:
        report.graphs = _graphs._install(model_or_pipeline, max_graphs, reuse=True)
    return report


def disable(model_or_pipeline) -> Report | None:
    """Restore every processor and forward enable changed (the same objects), and free the graphs
    of a capture (enable(..., cuda_graph=True) or capture()). Returns the report of what had been
    enabled, or None when ditops was not enabled on it."""
    report = None
    with _graphs.INSTALL_LOCK:
        _graphs.release(model_or_pipeline)
        for _, model in _transformers(model_or_pipeline):
            record = _ENABLED.pop(model, None)
            if record is None:
                continue
            for plan_ in reversed(record.plans):
                plan_.restore()
            invalidate_registry_caches(model)
            record.report.patched = False
            report = record.report
    return report


def enabled(model_or_pipeline) -> Report | None:
    """The live report of an enabled model, or None."""
    with _graphs.INSTALL_LOCK:
        for _, model in _transformers(model_or_pipeline):
            record = _ENABLED.get(model)
            if record is not None:
                return record.report
    return None
