"""ditops.diffusers with diffusers' own hooks (diffusers.hooks) on the CPU: the first-block cache
(apply_first_block_cache, enable_cache/disable_cache) and block-level group offloading, in every
order with enable/disable. The oracle is the model with the same hooks and no ditops: outputs
torch.equal (enable(allow_cpu=True) runs the sites' first-sight checks, which fall back to the
model's values wherever the CPU reference differs), the same feed-forward calls (a cached call
skips the blocks after the first), the same group onloads; disable restores the hooked model's
modules and hook chains object for object. Leaf-level offloading is refused (the fused sites read
weights of leaves whose forward they do not call), and a capture of a model whose blocks carry a
cache hook runs eagerly with one warning (a graph would bake one call's cache decision in)."""
import collections
import itertools
import warnings

import pytest

from conftest import diffusers_or_skip

torch, diffusers = diffusers_or_skip()
import ditops.diffusers as dd  # noqa: E402
from ditops.diffusers import _graphs, _patching  # noqa: E402


from diffusers.hooks import FirstBlockCacheConfig, apply_first_block_cache  # noqa: E402
from diffusers.hooks import group_offloading  # noqa: E402
from test_diffusers import assert_same, run, snapshot, tiny_flux, tiny_wan  # noqa: E402
from test_diffusers_capture import StandIn, capture_warnings  # noqa: E402

CPU = torch.device("cpu")
CALLS = 3  # forwards of one input: the first computes every block, the cache serves the others
# cpu_only: CPU models and a capture stand-in whatever the machine (328 of the device verify's 3060
# pytest test-seconds on the H100 at 19999c5): CI runs it, the device verify leaves it out.
pytestmark = [pytest.mark.filterwarnings("ignore:ditops.diffusers:RuntimeWarning",
                                         "ignore:There are modules in:UserWarning"), pytest.mark.cpu_only]


@pytest.fixture(autouse=True)
def nothing_left_enabled():
    yield
    for model in list(dd._ENABLED):
        dd.disable(model)


STEPS = {
    "cache": lambda m: apply_first_block_cache(m, FirstBlockCacheConfig(threshold=0.9)),
    "enable_cache": lambda m: m.enable_cache(FirstBlockCacheConfig(threshold=0.9)),
    "disable_cache": lambda m: m.disable_cache(),
    "offload": lambda m: m.enable_group_offload(onload_device=CPU, offload_device=CPU, offload_type="block_level",
                                                num_blocks_per_group=1),
    "ditops": lambda m: dd.enable(m, allow_cpu=True),
    "disable": lambda m: dd.disable(m),
}


def build(steps):
    if "offload" in steps:  # diffusers' group offloading moves tensors with accelerate's send_to_device
        pytest.importorskip("accelerate", reason="accelerate is not installed (diffusers' group offloading needs it)")
    model, inputs, _ = tiny_flux()
    for step in steps:
        STEPS[step](model)
    return model, inputs


def observe(model, inputs, count=True):
    """(outputs of CALLS forwards, calls of the last double block's and the first block's
    feed-forward, group onloads): what the hooks decide, call by call. count=False: no forward
    hooks on the feed-forwards (a capture refuses a model with forward hooks), no ff counts."""
    ff = collections.Counter()
    handles = [model.transformer_blocks[-1].ff.register_forward_hook(lambda *a: ff.update(["last"])),
               model.transformer_blocks[0].ff.register_forward_hook(lambda *a: ff.update(["head"]))] if count else []
    onloads = [0]
    real = group_offloading.ModuleGroup.onload_

    def counted(group):
        onloads[0] += 1
        return real(group)

    group_offloading.ModuleGroup.onload_ = counted
    outs = []
    try:
        with torch.no_grad(), model.cache_context("cond"):
            for _ in range(CALLS):
                outs.append(torch.cat([o.flatten() for o in model(**inputs)]))
    finally:
        group_offloading.ModuleGroup.onload_ = real
        for h in handles:
            h.remove()
    return outs, dict(ff), onloads[0]


def assert_same_run(got, want):
    outs, ff, onloads = got
    want_outs, want_ff, want_onloads = want
    assert ff == want_ff and onloads == want_onloads, (ff, want_ff, onloads, want_onloads)
    for i, (a, b) in enumerate(zip(outs, want_outs)):
        assert torch.equal(a, b), f"call {i}: max |d| {float((a.float() - b.float()).abs().max()):.3g}"


def chains(model):
    """Every registry's hook order and each hook's forward references, by identity."""
    found = {}
    for name, module in model.named_modules():
        registry = module.__dict__.get("_diffusers_hook")
        if registry is not None:
            found[name] = (list(registry._hook_order), [(id(f.forward), id(f.original_forward))
                                                        for f in registry._fn_refs])
    return found


def assert_no_ditops(model):
    for name, module in model.named_modules():
        assert _patching.ditops_hook(module) is None, name
        registry = module.__dict__.get("_diffusers_hook")
        for ref in (registry._fn_refs if registry is not None else []):
            for f in (ref.forward, ref.original_forward):
                assert not isinstance(getattr(getattr(f, "func", None), "__self__", None), _patching._DitopsHook), name


# Each order of the hooks with ditops; the oracle is the same order without ditops's steps.
ORDERS = [
    ("cache", "ditops"),
    ("ditops", "cache"),
    ("enable_cache", "ditops"),
    ("ditops", "enable_cache"),
    ("cache", "ditops", "disable"),
    ("ditops", "cache", "disable"),
    ("ditops", "enable_cache", "disable_cache"),
    ("enable_cache", "ditops", "disable_cache"),
    ("enable_cache", "ditops", "disable_cache", "disable"),
    ("offload", "ditops"),
    ("ditops", "offload"),
    ("offload", "ditops", "disable"),
    ("ditops", "offload", "disable"),
] + [order for order in itertools.permutations(("cache", "offload", "ditops"))]


@pytest.mark.parametrize("order", ORDERS, ids=["-".join(o) for o in ORDERS])
def test_hooks_and_ditops_in_every_order_run_as_the_hooks_alone(order):
    hooks_only = [s for s in order if s not in ("ditops", "disable")]
    want = observe(*build(hooks_only))
    if any(s in ("cache", "enable_cache") for s in hooks_only) and "disable_cache" not in hooks_only:
        assert want[1] == {"head": CALLS, "last": 1}, want[1]  # the oracle's cache does skip blocks
    if "offload" in hooks_only:
        assert want[2] > 0
    model, inputs = build(order)
    enabled = "ditops" in order and "disable" not in order
    report = dd.enabled(model)
    assert (report is not None) == enabled
    assert_same_run(observe(model, inputs), want)
    if enabled:
        assert sum(s.fused_calls + s.model_calls for s in report.sites) > 0  # the sites did run
    else:
        assert_no_ditops(model)


@pytest.mark.parametrize("hooks", [("cache",), ("offload",), ("cache", "offload")])
def test_disable_restores_the_hooked_model_exactly(hooks):
    model, inputs = build(hooks)
    observe(model, inputs)  # diffusers' cache_context gives the model a registry of its own
    before, hook_chains = snapshot(model), chains(model)
    dd.enable(model, allow_cpu=True)
    assert chains(model) != hook_chains  # ditops went into the chains
    for name in ("transformer_blocks.0", "single_transformer_blocks.1"):
        block = model.get_submodule(name)
        assert block._diffusers_hook._hook_order[0] == _patching.HOOK_NAME, block._diffusers_hook  # innermost
    observe(model, inputs)
    dd.disable(model)
    assert_same(before, snapshot(model))
    assert chains(model) == hook_chains


def test_disable_under_a_later_hook_hands_it_the_class_forward():
    """ditops, then the cache, then disable: the cache's hooks reach the blocks' own forward again."""
    model, inputs = build(("ditops", "cache", "disable"))
    for blocks in (model.transformer_blocks, model.single_transformer_blocks):
        for block in blocks:
            (ref,) = block._diffusers_hook._fn_refs
            assert _patching._is_class_forward(block, ref.original_forward)


def test_disable_under_accelerates_sequential_offload_leaves_a_pass_through():
    """accelerate's sequential offloading (cpu_offload, a pipeline's enable_sequential_cpu_offload)
    wraps, after enable, the forward of every module with parameters of its own, Wan's blocks
    (their scale_shift_table) included: disable cannot take ditops's hook out of those blocks'
    chains (one warning), so the hook runs the block's own forward from then on: no site runs, the
    output is the model's, also once accelerate's hooks are removed."""
    accelerate = pytest.importorskip("accelerate")
    model, inputs, _ = tiny_wan()
    reference = run(model, inputs)
    report = dd.enable(model, allow_cpu=True)
    accelerate.cpu_offload(model, execution_device=CPU)
    assert all(block.forward is not _patching.ditops_hook(block).wrapper for block in model.blocks)
    assert torch.equal(run(model, inputs), reference)
    calls = sum(s.fused_calls + s.model_calls for s in report.sites)
    assert calls > 0
    with pytest.warns(RuntimeWarning, match="ditops's hook stays in the chain and runs the module's own forward"):
        dd.disable(model)
    assert torch.equal(run(model, inputs), reference)
    assert sum(s.fused_calls + s.model_calls for s in report.sites) == calls
    accelerate.hooks.remove_hook_from_module(model, recurse=True)
    assert torch.equal(run(model, inputs), reference)
    assert sum(s.fused_calls + s.model_calls for s in report.sites) == calls


def test_enable_without_hooks_leaves_no_registry_behind():
    model, inputs = build(())
    dd.enable(model, allow_cpu=True)
    assert "_diffusers_hook" in model.transformer_blocks[0].__dict__
    dd.disable(model)
    assert not any("_diffusers_hook" in m.__dict__ or "forward" in m.__dict__ for m in model.modules())


def test_leaf_level_offloading_is_refused_and_nothing_changes():
    model, _ = build(())
    model.enable_group_offload(onload_device=CPU, offload_device=CPU, offload_type="leaf_level")
    before, hook_chains = snapshot(model), chains(model)
    with pytest.raises(dd.UnsupportedError, match="leaf-level group offloading.*offload_type='block_level'"):
        dd.enable(model, allow_cpu=True)
    assert_same(before, snapshot(model))
    assert chains(model) == hook_chains and dd.enabled(model) is None


@pytest.mark.parametrize("order", [("cache", "ditops"), ("ditops", "cache"), ("cache",)],
                         ids=["cache-ditops", "ditops-cache", "cache"])
def test_capture_refuses_a_cached_model_with_one_warning(monkeypatch, order):
    """A cache hook decides per call whether the blocks run: capture leaves the forward eager
    (one warning naming the hook), the calls run as the cache alone does."""
    backend = StandIn()
    monkeypatch.setattr(_graphs, "BACKEND", backend)
    want = observe(*build(("cache",)))
    model, inputs = build(order)
    state = dd.capture(model)["FluxTransformer2DModel"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = observe(model, inputs)
    assert_same_run(got, want)
    msgs = capture_warnings(caught)
    assert len(msgs) == 1, msgs
    assert "transformer_blocks.0.forward is replaced by diffusers hooks (fbc_leader_block_hook)" in msgs[0], msgs[0]
    assert "a cache skips blocks" in msgs[0]
    assert state.graphs == 0 and backend.captures == 0


def test_capture_of_an_enabled_model_without_other_hooks_captures(monkeypatch):
    """ditops's own hooks are no reason to refuse."""
    backend = StandIn()
    monkeypatch.setattr(_graphs, "BACKEND", backend)
    want = observe(*build(()), count=False)
    model, inputs = build(("ditops",))
    state = dd.capture(model)["FluxTransformer2DModel"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = observe(model, inputs, count=False)
    assert not capture_warnings(caught)
    assert_same_run(got, want)
    assert state.graphs == 1 and backend.captures == 1 and state.replays == CALLS - 2
