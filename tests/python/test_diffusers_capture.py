"""ditops.diffusers.capture / enable(..., cuda_graph=True): one CUDA graph per input signature.

On the CPU (CI): the signature, the static input buffers, and the whole per-signature logic with a
stand-in backend whose "graph" reruns the forward on the static inputs and writes into the static
outputs, as a replay does (first call eager, second captures, replays, output safety, a second
signature, the refusals and their one warning, a failed capture, release/disable restoring the
model); the real backend refusing a CPU model; torch.compile wrappers and tracing.
On CUDA (skipped without a device): every tiny model captured, with and without ditops, torch.equal
to the unpatched eager model over replays with new inputs and a second signature; a tiny FLUX.1
pipeline's images with and without the capture; a failed capture leaving CUDA usable; a call inside
someone else's capture; disable freeing the graphs."""
import gc
import types
import warnings
import weakref

import pytest

from conftest import diffusers_or_skip, needs_cuda_mark

torch, diffusers = diffusers_or_skip()
import ditops.diffusers as dd  # noqa: E402
from ditops.diffusers import _graphs  # noqa: E402
import torch.utils._pytree as pytree  # noqa: E402


from test_diffusers import TINY, assert_same, randomize, snapshot, tiny_flux  # noqa: E402
from test_diffusers import tiny_flux_pipeline as tiny_flux_pipeline_cpu  # noqa: E402

needs_cuda = needs_cuda_mark(torch)
CAPTURE_WARNING = "ditops.diffusers.capture"


# ---------------------------------------------------------------- a CPU stand-in for CUDA graphs

class Replayed:
    """A 'graph' that reruns the forward on the static inputs and writes its results into the
    outputs the capture returned, as a CUDA graph's replay overwrites its static outputs."""

    def __init__(self, fn, out):
        self.fn = fn
        self.outputs = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
        self.replays = 0

    def replay(self):
        self.replays += 1
        new = [t for t in pytree.tree_leaves(self.fn()) if isinstance(t, torch.Tensor)]
        for dst, src in zip(self.outputs, new):
            dst.copy_(src)


class StandIn:
    """The backend interface of _graphs.CudaGraphs, on any device. fail: the capture raises."""

    def __init__(self, fail=False):
        self.fail = fail
        self.captures = 0
        self.pools = []

    def refuses(self, device):
        return ""

    def capturing(self):
        return False

    def new_pool(self, device):
        self.pools.append(object())
        return self.pools[-1]

    def stream_token(self, device):
        return None  # one "stream": a replay's work is done when replay() returns

    def follow(self, device, previous):
        return None

    def capture(self, fn, pool, device):
        fn()  # the warm-up
        self.captures += 1
        if self.fail:
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing")
        out = fn()
        return Replayed(fn, out), out


@pytest.fixture
def standin(monkeypatch):
    backend = StandIn()
    monkeypatch.setattr(_graphs, "BACKEND", backend)
    return backend


@pytest.fixture(autouse=True)
def nothing_left_captured():
    yield
    for model in list(dd._ENABLED):
        dd.disable(model)


def small_flux():
    """tiny_flux's inputs and a FLUX.1 of one double and one single block: the CPU tests run
    the forward a few dozen times."""
    _, inputs, _ = tiny_flux()
    model = diffusers.FluxTransformer2DModel(
        patch_size=1, in_channels=8, num_layers=1, num_single_layers=1, attention_head_dim=64,
        num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=16, axes_dims_rope=(8, 28, 28))
    return randomize(model).to(torch.bfloat16), inputs, None


def run(model, inputs):
    with torch.no_grad():
        return model(**inputs)[0]


def varied(inputs, i):
    """inputs with new values (the same signature): hidden states and timestep change per step."""
    out = dict(inputs)
    out["hidden_states"] = inputs["hidden_states"] + 0.25 * i
    out["timestep"] = inputs["timestep"] * (1.0 - 0.1 * i)
    return out


def capture_warnings(caught):
    return [str(w.message) for w in caught if CAPTURE_WARNING in str(w.message)]


# ---------------------------------------------------------------- the signature


def test_signature_holds_what_a_graph_bakes_in():
    x = torch.zeros(2, 8, 4)
    base = _graphs.signature((), dict(hidden_states=x, return_dict=False, img_shapes=[(1, 4, 4)], scale=1.0))[0]

    def key(**kw):
        args = dict(hidden_states=x, return_dict=False, img_shapes=[(1, 4, 4)], scale=1.0)
        args.update(kw)
        return _graphs.signature((), args)[0]

    assert key() == base
    assert key(hidden_states=torch.ones(2, 8, 4)) == base                  # values are not in it
    assert key(hidden_states=torch.zeros(2, 9, 4)) != base                 # shape
    assert key(hidden_states=torch.zeros(2, 8, 4, dtype=torch.bfloat16)) != base
    assert key(hidden_states=torch.zeros(2, 4, 8).transpose(1, 2)) != base  # strides
    assert key(hidden_states=torch.zeros(2 * 8 * 4 + 1)[1:].view(2, 8, 4)) != base  # address alignment
    assert key(return_dict=True) != base
    assert key(img_shapes=[(1, 4, 8)]) != base
    assert key(scale=2.0) != base
    assert key(scale=1) != base                                             # 1 and 1.0: other types
    assert key(attention_kwargs={"scale": 1.0}) != key(attention_kwargs=None)
    with torch.inference_mode():
        assert key() != base
    with pytest.raises(_graphs._Opaque, match="argument callback is of type function"):
        key(callback=lambda: None)
    paths = []
    k, tensors = _graphs.signature((x,), dict(kw={"a": [x, 2]}), paths)
    assert len(paths) == len(k) and len(tensors) == 2
    assert paths[1] == "args[0]" and "kw['a'][1]" in paths


def test_static_inputs_keep_layout_and_alignment():
    """An expanded timestep (stride 0), a transposed tensor and a misaligned slice: the static
    view has the argument's shape, strides and address alignment, and a copy_ reproduces it."""
    cases = {
        "expanded": torch.tensor([0.5]).expand(4),
        "transposed": torch.randn(3, 5).t(),
        "misaligned": torch.randn(41, dtype=torch.bfloat16)[1:].view(5, 8),
        "with gaps": torch.randn(2, 16, 8)[:, :5],
        "empty": torch.zeros(0, 3),
    }
    for name, t in cases.items():
        static = _graphs._StaticInput(t, name)
        assert static.view.shape == t.shape and static.view.stride() == t.stride(), name
        assert static.view.data_ptr() % 16 == t.data_ptr() % 16, name
        static.copy(t)
        assert torch.equal(static.view, t), name
    with pytest.raises(_graphs._Opaque, match="overlapping strides"):
        _graphs._StaticInput(torch.zeros(8).as_strided((4, 4), (1, 1)), "x")


# ---------------------------------------------------------------- the per-signature logic (stand-in backend)


@pytest.mark.parametrize("with_ditops", [False, True], ids=["capture", "enable"])
def test_first_eager_then_capture_then_replays(standin, with_ditops):
    model, inputs, _ = small_flux()
    steps = [varied(inputs, i) for i in range(4)]
    reference = [run(model, s) for s in steps]
    if with_ditops:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # CPU: the close references are unfit
            report = dd.enable(model, allow_cpu=True, cuda_graph=True)
        state = report.graphs["FluxTransformer2DModel"]
    else:
        state = dd.capture(model)["FluxTransformer2DModel"]
    assert dd.captured(model) is state
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning) if not with_ditops else warnings.simplefilter("ignore")
        outs = [run(model, s) for s in steps]
    for got, want in zip(outs, reference):
        assert torch.equal(got, want)
    assert (state.eager_calls, state.captures, state.replays, state.graphs) == (1, 1, 2, 1)
    assert standin.captures == 1
    # the caller's outputs are clones: the static output holds the last step, the kept ones theirs
    (entry,) = state.entries.values()
    assert torch.equal(entry.outputs[0], reference[-1]) and not torch.equal(outs[1], reference[-1])
    assert all(o.data_ptr() != entry.outputs[0].data_ptr() for o in outs)


def test_replays_make_no_decisions(standin, monkeypatch):
    """Once captured, a call is the signature lookup, the copies and the replay: the refusal
    checks and the first-call path are never reached."""
    model, inputs, _ = small_flux()
    state = dd.capture(model)["FluxTransformer2DModel"]
    run(model, inputs), run(model, inputs)

    def forbidden(*a, **k):
        raise AssertionError("a replay reached the slow path")

    monkeypatch.setattr(state, "_slow", forbidden)
    monkeypatch.setattr(state, "_refusal", forbidden)
    for i in range(3):
        run(model, varied(inputs, i))
    assert state.replays == 3


def test_a_second_signature_captures_a_second_graph(standin):
    model, inputs, _ = small_flux()
    state = dd.capture(model)["FluxTransformer2DModel"]
    two = dict(inputs, hidden_states=torch.cat([inputs["hidden_states"]] * 2),
               encoder_hidden_states=torch.cat([inputs["encoder_hidden_states"]] * 2),
               pooled_projections=torch.cat([inputs["pooled_projections"]] * 2),
               timestep=torch.cat([inputs["timestep"]] * 2))
    dd.release(model)
    ref1, ref2 = run(model, inputs), run(model, two)
    state = dd.capture(model)["FluxTransformer2DModel"]
    for _ in range(3):
        assert torch.equal(run(model, inputs), ref1) and torch.equal(run(model, two), ref2)
    assert state.graphs == 2 and state.replays == 2
    assert len(standin.pools) == 1  # one pool for all graphs of the model
    assert "captured" in str(state) and "[2, 16, 8]" in str(state)


def test_max_graphs_refuses_more_with_one_warning(standin):
    model, inputs, _ = small_flux()
    other = dict(inputs, return_dict=True)  # another signature of the same shapes
    with torch.no_grad():
        reference = model(**other).sample
    state = dd.capture(model, max_graphs=1)["FluxTransformer2DModel"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            run(model, inputs)
            with torch.no_grad():
                assert torch.equal(model(**other).sample, reference)
    assert state.graphs == 1
    (msg,) = capture_warnings(caught)
    assert "max_graphs=1" in msg
    with pytest.raises(dd.UnsupportedError, match="max_graphs"):
        dd.capture(small_flux()[0], max_graphs=0)


def test_a_python_number_that_changes_runs_eagerly_with_one_warning(standin, monkeypatch):
    """A float that differs per call (a timestep passed as a Python number) would bake each value
    into a graph of its own: past VALUES_PER_LAYOUT values with the same tensors, calls with a new
    value run eagerly, unrecorded."""
    model, inputs, _ = small_flux()
    seen = []
    real = type(model).forward

    def forward(self, *args, step_scale=1.0, **kwargs):
        seen.append(step_scale)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(type(model), "forward", forward)
    state = dd.capture(model)["FluxTransformer2DModel"]
    n = _graphs.VALUES_PER_LAYOUT
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(n + 2):
            with torch.no_grad():
                model(**inputs, step_scale=1.0 - 0.1 * i)
    (msg,) = capture_warnings(caught)
    assert "step_scale (1.0, ..., " in msg and f"more than {n} values" in msg and "pass it as a tensor" in msg
    assert state.graphs == 0 and len(state.entries) == n and len(seen) == n + 2


def test_numbers_with_a_few_values_each_get_a_graph(standin):
    """Qwen-Image's img_shapes at one token count (portrait and landscape): two signatures that
    differ only in Python numbers, each captured, each equal to eager."""
    model, inputs, _ = TINY["qwen"]()
    shapes = [[(1, 4, 4)], [(1, 2, 8)]]
    reference = [run(model, dict(inputs, img_shapes=s)) for s in shapes]
    state = dd.capture(model)["QwenImageTransformer2DModel"]
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        for _ in range(3):
            for s, want in zip(shapes, reference):
                assert torch.equal(run(model, dict(inputs, img_shapes=s)), want)
    assert state.graphs == 2 and state.replays == 2


@pytest.mark.parametrize("hazard", ["grad", "opaque", "hook", "processor", "replaced_forward"])
def test_refusals_run_eagerly_with_one_warning(standin, hazard):
    model, inputs, _ = small_flux()
    reference = run(model, inputs)
    extra = {}
    grad = False
    if hazard == "grad":
        grad = True
    elif hazard == "opaque":
        extra = dict(joint_attention_kwargs={"note": object()})
    elif hazard == "hook":
        model.transformer_blocks[0].register_forward_hook(lambda *a: None)
    elif hazard == "processor":
        class MyProcessor(type(model.transformer_blocks[0].attn.processor)):
            pass
        model.transformer_blocks[0].attn.set_processor(MyProcessor())
    elif hazard == "replaced_forward":
        block = model.single_transformer_blocks[0]
        block.forward = types.MethodType(type(block).forward, block)
    state = dd.capture(model)["FluxTransformer2DModel"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            with torch.set_grad_enabled(grad):
                out = model(**inputs, **extra)[0]
            assert torch.equal(out, reference)
    msgs = capture_warnings(caught)
    assert len(msgs) == 1, msgs
    expected = {"grad": "autograd is recording", "opaque": "argument joint_attention_kwargs['note'] is of type object",
                "hook": "transformer_blocks.0 has forward hooks",
                "processor": "transformer_blocks.0.attn.processor is test_diffusers_capture.",
                "replaced_forward": "single_transformer_blocks.0.forward is replaced"}[hazard]
    assert expected in msgs[0], msgs[0]
    assert state.graphs == 0 and standin.captures == 0


def test_a_failed_capture_goes_regional_and_a_failed_block_capture_stays_eager(standin):
    """Every capture fails: the whole forward's first, then each repeated block's once; one warning
    per kind (the blocks' per class), eager values throughout, nothing tried again."""
    standin.fail = True
    model, inputs, _ = small_flux()
    reference = run(model, inputs)
    state = dd.capture(model)["FluxTransformer2DModel"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outs = [run(model, inputs) for _ in range(5)]
    assert all(torch.equal(o, reference) for o in outs)
    msgs = capture_warnings(caught)
    assert len(msgs) == 3, msgs
    assert "the capture failed (RuntimeError: CUDA error: operation not permitted" in msgs[0]
    assert "its repeated blocks are captured instead (2 blocks" in msgs[0], msgs[0]
    assert {m.split("a repeated block (")[1].split(")")[0] for m in msgs[1:]} == {
        "FluxTransformerBlock", "FluxSingleTransformerBlock"}
    assert all("runs eagerly from now on" in m for m in msgs[1:])
    (entry,) = state.entries.values()
    assert entry.state == "regional" and entry.graph is None and entry.inputs is None
    # one whole-forward capture, then one per block; none tried again, no graph holds the pool
    assert standin.captures == 1 + 2 and state.graphs == 0 and state.region_graphs == 0
    assert all(e.state == "eager" for r in state.regions for e in r.entries.values())


class FailFirst(StandIn):
    """The whole forward's capture fails (the first one tried), the blocks' succeed."""

    def capture(self, fn, pool, device):
        if self.captures == 0:
            fn()
            self.captures += 1
            raise RuntimeError("Cannot copy between CPU and CUDA tensors during CUDA graph capture unless "
                               "the CPU tensor is pinned")
        return super().capture(fn, pool, device)


def test_a_failed_whole_capture_falls_back_to_the_repeated_blocks(monkeypatch):
    """The regional fallback: the forward eager around one graph per block and signature, in the
    model's pool, values equal to eager at every step; release puts every forward back."""
    backend = FailFirst()
    monkeypatch.setattr(_graphs, "BACKEND", backend)
    model, inputs, _ = small_flux()
    calls = [varied(inputs, i) for i in range(5)]
    reference = [run(model, x) for x in calls]
    state = dd.capture(model)["FluxTransformer2DModel"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outs = [run(model, x) for x in calls]
    assert all(torch.equal(a, b) for a, b in zip(outs, reference))
    (msg,) = capture_warnings(caught)
    assert "its repeated blocks are captured instead (2 blocks" in msg, msg
    # call 1: first sight; 2: the whole capture fails, the blocks' first calls; 3: the blocks
    # capture; 4 and 5: the blocks replay
    assert state.graphs == 0 and state.region_graphs == 2 and backend.captures == 1 + 2
    assert sum(r.replays for r in state.regions) == 2 * 2 and state.regional_calls == 4
    # the failed whole capture's pool is dropped with it; the blocks' graphs share the next one
    assert len(backend.pools) == 2 and state.pool is backend.pools[1]
    blocks = [model.transformer_blocks[0], model.single_transformer_blocks[0]]
    assert [b.__dict__["forward"]._ditops_capture for b in blocks] == state.regions
    assert "regional: 4 call(s) of the forward around 2 captured blocks (2 graph(s), 4 block replays)" in str(state)
    assert state.as_dict()["regions"][0]["graphs"] == 1
    assert dd.release(model)
    assert all("forward" not in m.__dict__ for m in model.modules())
    assert torch.equal(run(model, calls[0]), reference[0])


def test_regions_keep_the_sites_and_leave_before_enable_changes_the_blocks(monkeypatch):
    """With ditops enabled the regions capture the blocks' patched forwards (the sites' calls);
    enable again (other sites) first puts the blocks' forwards back; disable restores the model."""
    backend = FailFirst()
    monkeypatch.setattr(_graphs, "BACKEND", backend)
    model, inputs, _ = small_flux()
    calls = [varied(inputs, i) for i in range(5)]
    before = snapshot(model)
    dd.enable(model, allow_cpu=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        enabled = [run(model, x) for x in calls]
        state = dd.capture(model)["FluxTransformer2DModel"]
        outs = [run(model, x) for x in calls]
    assert all(torch.equal(a, b) for a, b in zip(outs, enabled))
    assert state.region_graphs == 2
    report = dd.enabled(model)
    assert sum(s.fused_calls for s in report.sites) > 0
    hooked = [m.__dict__["forward"]._ditops_capture.original for m in (model.transformer_blocks[0],)]
    assert hooked[0] is not type(model.transformer_blocks[0]).forward  # the hook chain, not the class's
    dd.disable(model)
    assert all("forward" not in m.__dict__ for m in model.modules())
    assert_same(before, snapshot(model))


def test_moved_weights_release_the_graphs(standin):
    model, inputs, _ = small_flux()
    state = dd.capture(model)["FluxTransformer2DModel"]
    run(model, inputs), run(model, inputs)
    assert state.graphs == 1
    with torch.no_grad():
        weight = model.proj_out.weight
        weight.data = weight.data * 2  # new storage, as a fused LoRA or model.to() leaves it
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = run(model, inputs)
    dd.release(model)
    assert torch.equal(out, run(model, inputs))
    (msg,) = capture_warnings(caught)
    assert "parameters moved" in msg and state.graphs == 0


# ---------------------------------------------------------------- install, release, disable


def test_release_and_disable_restore_exactly(standin):
    model, inputs, _ = small_flux()
    before = snapshot(model)
    state = dd.capture(model)["FluxTransformer2DModel"]
    run(model, inputs), run(model, inputs)
    entry = next(iter(state.entries.values()))
    static = weakref.ref(entry.outputs[0])
    with pytest.raises(dd.UnsupportedError, match="already captured"):
        dd.capture(model)
    assert dd.release(model) and dd.captured(model) is None and not dd.release(model)
    gc.collect()
    assert static() is None and state.graphs == 0
    assert_same(before, snapshot(model))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        report = dd.enable(model, allow_cpu=True, cuda_graph=True)
        run(model, inputs), run(model, inputs)
    assert report.graphs["FluxTransformer2DModel"].graphs == 1 and "graph(s)" in str(report)
    assert dd.disable(model) is report
    assert dd.captured(model) is None
    assert_same(before, snapshot(model))


def test_enable_after_capture_forgets_the_graphs(standin):
    """Graphs captured before enable recorded the model's code at the sites: enable drops them."""
    model, inputs, _ = small_flux()
    state = dd.capture(model)["FluxTransformer2DModel"]
    run(model, inputs), run(model, inputs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        report = dd.enable(model, allow_cpu=True, cuda_graph=True)
    assert state.graphs == 0 and not state.entries and report.graphs["FluxTransformer2DModel"] is state
    dd.disable(model)


@pytest.mark.parametrize("order", ["enable_with_graph", "capture_then_enable", "enable_then_capture"])
def test_a_model_whose_own_forward_enable_patches_is_captured_through_the_hook(standin, order):
    """Wan: enable patches the model's own forward (norm_out's modulation, through ditops's diffusers
    hook). The capture wraps that hook in every order of capture and enable: a capture made before
    steps aside while enable patches and stays the same object; capture after enable is not refused
    as a replaced forward; every forward (eager, capture, replays) runs the sites at norm_out too;
    disable restores the model exactly."""
    model, inputs, _ = TINY["wan"]()
    before = snapshot(model)
    steps = [varied(inputs, i) for i in range(4)]
    reference = [run(model, s) for s in steps]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # CPU: the close references are unfit
        if order == "enable_with_graph":
            report = dd.enable(model, allow_cpu=True, cuda_graph=True)
            state = report.graphs["WanTransformer3DModel"]
        elif order == "capture_then_enable":
            state = dd.capture(model)["WanTransformer3DModel"]
            report = dd.enable(model, allow_cpu=True, cuda_graph=True)
            assert report.graphs["WanTransformer3DModel"] is state
        else:
            report = dd.enable(model, allow_cpu=True)
            with warnings.catch_warnings():
                warnings.simplefilter("error", RuntimeWarning)  # no "forward is already replaced"
                state = dd.capture(model)["WanTransformer3DModel"]
        assert dd.captured(model) is state and state.original is model._diffusers_hook.hooks["ditops.diffusers"].wrapper
        outs = [run(model, s) for s in steps]
    assert all(torch.equal(got, want) for got, want in zip(outs, reference))
    assert (state.eager_calls, state.captures, state.replays) == (1, 1, 2)
    # norm_out ran in every forward the blocks ran (eager, the stand-in's warm-up and capture, replays):
    # adaLN's calls per place equal those of the ffn's gated residual, which the blocks make
    adaln, residual = report["adaln_modulate"], report["gated_residual"]
    assert adaln.places[-1] == "norm_out"
    calls = [(s.fused_calls + s.model_calls) / len(s.places) for s in (adaln, residual)]
    assert calls[0] == calls[1] >= 5, calls
    dd.disable(model)
    assert dd.captured(model) is None
    assert_same(before, snapshot(model))


def test_pipeline_parts_and_install_refusals(standin):
    model, inputs, _ = small_flux()
    second, _, _ = small_flux()
    pipe = types.SimpleNamespace(transformer=model, transformer_2=second, vae=None)
    report = dd.capture(pipe)
    assert set(report.parts) == {"transformer", "transformer_2"} and dd.captured(pipe) is report["transformer"]
    assert dd.release(pipe) and dd.captured(second) is None
    with pytest.raises(dd.UnsupportedError, match="neither a model nor a pipeline"):
        dd.capture(object())
    other, _, _ = small_flux()
    other.forward = types.MethodType(type(other).forward, other)  # e.g. a diffusers hook on the model
    with pytest.warns(RuntimeWarning, match="forward is already replaced"):
        report = dd.capture(other)
    assert not report.parts and "forward" in other.__dict__ and dd.captured(other) is None


# ---------------------------------------------------------------- the real backend on the CPU, compile


def test_cpu_model_runs_eagerly_with_one_warning():
    model, inputs, _ = small_flux()
    reference = [run(model, varied(inputs, i)) for i in range(3)]
    state = dd.capture(model)["FluxTransformer2DModel"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outs = [run(model, varied(inputs, i)) for i in range(3)]
    assert all(torch.equal(a, b) for a, b in zip(outs, reference))
    (msg,) = capture_warnings(caught)
    assert "the model is on cpu" in msg and state.graphs == 0


def test_torch_compile_wrappers_and_tracing():
    """A compiled wrapper is not captured (a warning; enable still patches the sites), and a
    captured model being traced runs the model's forward in the trace (one warning at trace time)."""
    model, inputs, _ = small_flux()
    reference = run(model, inputs)
    compiled = torch.compile(model, fullgraph=True, backend="eager")
    with pytest.warns(RuntimeWarning, match="is a torch.compile wrapper"):
        report = dd.capture(compiled)
    assert not report.parts and dd.captured(model) is None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = dd.enable(compiled, allow_cpu=True, cuda_graph=True)
    assert report.patched and not report.graphs.parts
    assert any("torch.compile wrapper" in m for m in capture_warnings(caught))
    dd.disable(compiled)

    dd.capture(model)
    _graphs._traced_warned.clear()
    torch._dynamo.reset()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = run(compiled, inputs)
        out2 = run(compiled, inputs)
    torch._dynamo.reset()
    assert torch.equal(out, reference) and torch.equal(out2, reference)
    (msg,) = capture_warnings(caught)
    assert "traced by torch.compile" in msg


# ---------------------------------------------------------------- GPU: real CUDA graphs


def to_cuda(inputs, model=None):
    """inputs on the GPU; LTX-2's with the RoPE coordinates its pipeline passes (the call without
    them, and with guidance: test_diffusers_capture_ltx2.py)."""
    out = {k: v.to("cuda") if torch.is_tensor(v) else v for k, v in inputs.items()}
    if model is not None and "audio_num_frames" in out and out.get("video_coords") is None:
        batch = out["hidden_states"].shape[0]
        out["video_coords"] = model.rope.prepare_video_coords(batch, out["num_frames"], out["height"], out["width"],
                                                              torch.device("cuda"))
        out["audio_coords"] = model.audio_rope.prepare_audio_coords(batch, out["audio_num_frames"],
                                                                    torch.device("cuda"))
    return out


def bigger(name, inputs):
    """The same model's inputs at another signature: batch 2."""
    return TINY[name](batch=2)[1]


@needs_cuda
@pytest.mark.parametrize("with_ditops", [False, True], ids=["graph", "ditops+graph"])
@pytest.mark.parametrize("name", sorted(TINY))
def test_gpu_captured_equals_eager(name, with_ditops):
    model, inputs, _ = TINY[name]()
    model = model.to("cuda")
    steps = [to_cuda(varied(inputs, i), model) for i in range(5)]
    two = to_cuda(bigger(name, inputs), model)
    reference = [run(model, s) for s in steps]
    reference_two = run(model, two)
    before = snapshot(model)
    allocated = torch.cuda.memory_allocated()
    if with_ditops:
        report = dd.enable(model, cuda_graph=True)
        state = report.graphs[type(model).__name__]
    else:
        state = dd.capture(model)[type(model).__name__]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outs = [run(model, s) for s in steps]          # eager, capture + replay, 3 replays
        kept = [o.clone() for o in outs]
        outs_two = [run(model, two) for _ in range(3)]  # a second signature: a second graph
        again = run(model, steps[2])                     # the first graph still replays right
    assert not [str(w.message) for w in caught if "ditops" in str(w.message)]
    for i, (got, want) in enumerate(zip(outs, reference)):
        assert torch.equal(got, want), f"{name} step {i}"
        assert torch.equal(got, kept[i]), f"{name}: the output of step {i} changed after later replays"
    assert all(torch.equal(o, reference_two) for o in outs_two) and torch.equal(again, reference[2])
    assert (state.graphs, state.captures, state.replays) == (2, 2, 3 + 1 + 1)
    print(state)
    statics = [weakref.ref(t) for e in state.entries.values() for t in e.outputs]
    captured_allocated = torch.cuda.memory_allocated()
    assert captured_allocated > allocated
    dd.disable(model)
    gc.collect()
    assert all(ref() is None for ref in statics), "disable left static outputs alive"
    assert torch.cuda.memory_allocated() < captured_allocated
    assert_same(before, snapshot(model))
    assert torch.equal(run(model, steps[0]), reference[0])


@needs_cuda
def test_gpu_failed_capture_leaves_cuda_usable(monkeypatch):
    """A forward that syncs (a .item() on a CUDA tensor) at batch 1 cannot be captured: one
    warning, the eager values, no whole-forward graph; the CUDA generator still works, and the
    model's batch-2 signature then runs through its repeated blocks' graphs (the regional fallback
    holds for every signature once a whole capture failed), equal to eager."""
    model, inputs, _ = tiny_flux()
    model, inputs = model.to("cuda"), to_cuda(inputs)
    two = to_cuda(bigger("flux", inputs))
    reference, reference_two = run(model, inputs), run(model, two)
    real = type(model).forward

    def syncing(self, *args, **kwargs):
        if kwargs["hidden_states"].shape[0] == 1:
            float(kwargs["hidden_states"].float().sum())  # a device sync: illegal while capturing
        return real(self, *args, **kwargs)

    monkeypatch.setattr(type(model), "forward", syncing)
    state = dd.capture(model)["FluxTransformer2DModel"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outs = [run(model, inputs) for _ in range(3)]
    assert all(torch.equal(o, reference) for o in outs)
    (msg,) = capture_warnings(caught)
    assert "the capture failed" in msg and state.graphs == 0
    torch.cuda.manual_seed(0)
    a = torch.randn(64, device="cuda")  # raised 'Offset increment outside graph capture' if left in capture mode
    torch.cuda.manual_seed(0)
    assert torch.equal(a, torch.randn(64, device="cuda"))
    region_graphs, regional_calls = state.region_graphs, state.regional_calls
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        assert all(torch.equal(run(model, two), reference_two) for _ in range(3))
    assert state.graphs == 0 and state.region_graphs > region_graphs and state.regional_calls > regional_calls
    assert sum(r.replays for r in state.regions) > 0
    dd.release(model)


@needs_cuda
def test_gpu_inside_someone_elses_capture():
    """Called inside the user's own torch.cuda.graph capture, the model's forward is recorded into
    that graph as eager code (one warning), and the user's replays give the eager values."""
    model, inputs, _ = tiny_flux()
    model, inputs = model.to("cuda"), to_cuda(inputs)
    reference = run(model, inputs)
    dd.capture(model)
    static = {k: v.clone() if torch.is_tensor(v) else v for k, v in inputs.items()}
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run(model, static)  # the user's warm-up (our first call of the signature: eager)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.cuda.graph(graph):
            out = run(model, static)
    (msg,) = capture_warnings(caught)
    assert "inside a CUDA-graph capture ditops does not own" in msg
    graph.replay()
    assert torch.equal(out, reference)
    dd.release(model)


@needs_cuda
def test_gpu_qwen_with_a_text_mask_fails_to_capture_and_runs_eagerly():
    """Qwen-Image with an encoder_hidden_states_mask builds a tensor from a host value in each
    forward (torch.as_tensor(text_seq_len, device=...): a copy from pageable host memory, which
    PyTorch 2.11 refuses inside a capture, as it refused LTX-2's torch.tensor(..., device=...) on the
    H200): the capture fails once, with one warning naming the copy, and every call runs eagerly
    with eager's values; CUDA stays usable."""
    model, inputs, _ = TINY["qwen"]()
    inputs = dict(inputs, encoder_hidden_states_mask=torch.tensor([[1] * 6 + [0] * 2]))
    model = model.to("cuda")
    steps = [to_cuda(varied(inputs, i)) for i in range(4)]
    reference = [run(model, s) for s in steps]
    state = dd.capture(model)["QwenImageTransformer2DModel"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outs = [run(model, s) for s in steps]
    msgs = capture_warnings(caught)
    print(state)
    assert all(torch.equal(a, b) for a, b in zip(outs, reference))
    assert state.graphs == 0 and len(msgs) == 1, msgs
    assert "the capture failed" in msgs[0] and "Cannot copy between CPU and CUDA" in msgs[0], msgs[0]
    torch.cuda.manual_seed(0)
    torch.randn(8, device="cuda")
    dd.release(model)


def tiny_flux_pipeline():
    return tiny_flux_pipeline_cpu().to("cuda")


@needs_cuda
def test_gpu_pipeline_images_equal_with_and_without_capture():
    """A tiny FLUX.1 pipeline (random transformer and VAE, prompt embeddings passed in: no text
    encoder or tokenizer) for 4 steps: the same images bit for bit with ditops and the capture;
    another resolution captures a second graph."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        pipe = tiny_flux_pipeline()
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randn(1, 8, 32, generator=gen).to("cuda", torch.bfloat16)
    pooled = torch.randn(1, 16, generator=gen).to("cuda", torch.bfloat16)

    def images(height, width):
        return pipe(prompt_embeds=prompt, pooled_prompt_embeds=pooled, height=height, width=width,
                    num_inference_steps=4, guidance_scale=3.5, output_type="pt",
                    generator=torch.Generator().manual_seed(0)).images

    reference = {size: images(*size) for size in ((32, 32), (48, 32))}
    report = dd.enable(pipe, cuda_graph=True)
    state = report.graphs["transformer"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = images(32, 32)
        assert state.graphs == 1 and state.replays == 4 - 2
        second = images(48, 32)
        again = images(32, 32)
    assert not [str(w.message) for w in caught if "ditops" in str(w.message)]
    print(report)
    assert torch.equal(first, reference[(32, 32)]) and torch.equal(again, reference[(32, 32)])
    assert torch.equal(second, reference[(48, 32)])
    assert state.graphs == 2 and state.replays == 2 + 2 + 4
    dd.disable(pipe)
    assert dd.captured(pipe) is None
