"""LTX-2 captured in the four ways it is called: without video_coords / audio_coords (as
ditops.diffusers.bench calls it: the forward builds them from host values) and with them (as
LTX2Pipeline calls it, text masks included), each without and with spatio-temporal guidance as the
pipeline passes it (spatio_temporal_guidance_blocks, perturbation_mask None).

On the CPU (CI): the stand-in backend of test_diffusers_capture, made strict: inside its "capture"
and its replays a torch.tensor(<host data>, device=...) raises, as the H200 raised "Cannot copy
between CPU and CUDA tensors during CUDA graph capture" in prepare_video_coords. Each form is
captured once and its replays are torch.equal to the unpatched model's eager forward; without the
coordinates built before the capture (ltx2.graph_constants) the capture fails with one warning
naming the error and the model's line; a perturbation_mask on the GPU is refused before a capture.
On CUDA (skipped without a device): the four forms captured, with and without ditops, torch.equal
to eager over replays; a perturbation_mask on the GPU: one warning, eager values."""
import warnings

import pytest

from conftest import diffusers_or_skip, needs_cuda_mark

torch, diffusers = diffusers_or_skip()
import ditops.diffusers as dd  # noqa: E402
from ditops.diffusers import _graphs, ltx2  # noqa: E402
from torch.overrides import TorchFunctionMode  # noqa: E402


from test_diffusers import tiny_ltx2  # noqa: E402
from test_diffusers_capture import CAPTURE_WARNING, Replayed, StandIn, capture_warnings  # noqa: E402

needs_cuda = needs_cuda_mark(torch)
FORMS = ["bench", "pipeline"]          # without / with video_coords and audio_coords
GUIDANCE = [False, True]               # spatio-temporal guidance at block 0, as the pipeline passes it


@pytest.fixture(autouse=True)
def nothing_left_enabled():
    yield
    for model in list(dd._ENABLED):
        dd.disable(model)


# ---------------------------------------------------------------- a strict CPU stand-in


HOST_COPY = "Cannot copy between CPU and CUDA tensors during CUDA graph capture unless the CPU tensor is pinned"


class NoHostCopies(TorchFunctionMode):
    """torch.tensor(<host data>, device=...) raises, as a host-to-device copy does in a CUDA capture."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.tensor and kwargs.get("device") is not None:
            raise RuntimeError(f"{HOST_COPY} (stand-in: torch.tensor({args[0]!r}, device=...))")
        return func(*args, **kwargs)


class StrictReplayed(Replayed):
    def replay(self):
        with NoHostCopies():
            super().replay()


class Strict(StandIn):
    """StandIn whose capture and replays refuse host-to-device copies."""

    def capture(self, fn, pool, device):
        fn()  # the warm-up, outside the capture: host copies are legal there
        self.captures += 1
        with NoHostCopies():
            out = fn()
        return StrictReplayed(fn, out), out


@pytest.fixture
def strict(monkeypatch):
    backend = Strict()
    monkeypatch.setattr(_graphs, "BACKEND", backend)
    return backend


# ---------------------------------------------------------------- the call forms


def ltx2_call(form, guidance, device="cpu"):
    """(model, inputs) of one call form on device."""
    model, inputs, _ = tiny_ltx2(variant="gated_stg" if guidance else None)
    model = model.to(device)
    inputs = {k: v.to(device) if torch.is_tensor(v) else v for k, v in inputs.items()}
    if guidance:
        inputs.pop("perturbation_mask")  # the pipeline's STG call: every element perturbed
        inputs["spatio_temporal_guidance_blocks"] = [0]
    if form == "pipeline":
        # LTX2Pipeline: the coordinates prepared once per generation, the connectors' text masks
        batch = inputs["hidden_states"].shape[0]
        inputs["video_coords"] = model.rope.prepare_video_coords(batch, inputs["num_frames"], inputs["height"],
                                                                 inputs["width"], torch.device(device), fps=24.0)
        inputs["audio_coords"] = model.audio_rope.prepare_audio_coords(batch, inputs["audio_num_frames"],
                                                                       torch.device(device))
        mask = torch.ones(batch, 8, device=device)
        mask[:, -2:] = 0
        inputs.update(fps=24.0, encoder_attention_mask=mask, audio_encoder_attention_mask=mask.clone())
    return model, inputs


def steps(inputs, n=3):
    """n calls of one signature with new values (the latents and the timestep change per step)."""
    out = []
    for i in range(n):
        x = dict(inputs)
        x["hidden_states"] = inputs["hidden_states"] + 0.25 * i
        x["audio_hidden_states"] = inputs["audio_hidden_states"] - 0.125 * i
        x["timestep"] = inputs["timestep"] * (1.0 - 0.1 * i)
        if "sigma" in inputs:
            x["sigma"] = x["timestep"]
        out.append(x)
    return out


def run(model, inputs):
    with torch.no_grad():
        return model(**inputs)


def equal(a, b) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


# ---------------------------------------------------------------- CPU


@pytest.mark.parametrize("with_ditops", [False, True], ids=["capture", "enable+capture"])
@pytest.mark.parametrize("guidance", GUIDANCE, ids=["no-stg", "stg"])
@pytest.mark.parametrize("form", FORMS)
def test_each_call_form_is_captured(strict, form, guidance, with_ditops):
    """The oracle is the same model's eager forward (it builds what it needs): the unpatched
    model, or with ditops the enabled one (on the CPU a site's reference op need not equal CPU
    PyTorch: the GPU test compares with the unpatched model)."""
    model, inputs = ltx2_call(form, guidance)
    calls = steps(inputs)
    if with_ditops:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # CPU: the close references are unfit
            dd.enable(model, allow_cpu=True)
            reference = [run(model, x) for x in calls]  # and the first sights
    else:
        reference = [run(model, x) for x in calls]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        state = dd.capture(model)["LTX2VideoTransformer3DModel"]
        outs = [run(model, x) for x in calls]  # eager, capture + replay, replay
    assert not capture_warnings(caught), capture_warnings(caught)
    for i, (got, want) in enumerate(zip(outs, reference)):
        assert equal(got, want), f"{form}, guidance {guidance}: step {i} differs from eager"
    assert (state.graphs, state.captures, state.replays) == (1, 1, 1) and strict.captures == 1
    (entry,) = state.entries.values()
    built = entry.constants
    if form == "bench":  # built once before the capture; read by the graph, never copied in
        assert set(built) == {"video_coords", "audio_coords"}
        assert not any(s.view.data_ptr() == t.data_ptr() for s in entry.inputs for t in built.values())
    else:
        assert built is None


def test_without_built_coordinates_the_capture_fails_once_says_where_and_goes_regional(strict, monkeypatch):
    """What the H200 saw, on the strict stand-in: with graph_constants gone, the bench form's
    capture raises in prepare_video_coords; one warning names the error and the model's line, and
    the blocks are captured instead (the prologue with its host copy stays eager): eager values,
    no whole capture tried again."""
    monkeypatch.setattr(ltx2, "graph_constants", None)
    model, inputs = ltx2_call("bench", False)
    calls = steps(inputs, n=5)
    reference = [run(model, x) for x in calls]
    state = dd.capture(model)["LTX2VideoTransformer3DModel"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outs = [run(model, x) for x in calls]
    assert all(equal(a, b) for a, b in zip(outs, reference))
    (msg,) = capture_warnings(caught)
    assert f"the capture failed (RuntimeError: {HOST_COPY}" in msg, msg
    assert "at transformer_ltx2.py:" in msg and "in prepare_video_coords" in msg, msg
    assert "its repeated blocks are captured instead (2 blocks" in msg, msg
    blocks = len(model.transformer_blocks)
    assert state.graphs == 0 and state.region_graphs == blocks and strict.captures == 1 + blocks
    assert not state.refusals and sum(r.replays for r in state.regions) == 2 * blocks


def test_a_perturbation_mask_on_the_device_is_refused_before_a_capture():
    """graph_refusal: a mask on a device other than the CPU (meta stands for CUDA here) with STG at
    a perturbed block is refused with the reason; a CPU mask, no STG blocks, or blocks that do not
    read it are not."""
    model, inputs = ltx2_call("bench", True)
    device_mask = torch.zeros(1, device="meta")
    why = ltx2.graph_refusal(model, (), dict(inputs, perturbation_mask=device_mask))
    assert "perturbation_mask is on meta with spatio-temporal guidance at block(s) [0]" in why, why
    assert "pass perturbation_mask=None" in why
    assert ltx2.graph_refusal(model, (), dict(inputs, perturbation_mask=torch.zeros(1))) == ""
    assert ltx2.graph_refusal(model, (), dict(inputs, perturbation_mask=device_mask,
                                              spatio_temporal_guidance_blocks=None)) == ""
    assert ltx2.graph_refusal(model, (), dict(inputs, perturbation_mask=device_mask,
                                              spatio_temporal_guidance_blocks=[5, -1])) == ""
    plain, plain_inputs = ltx2_call("bench", False)  # no perturbed_attn: the blocks never read the mask
    assert ltx2.graph_refusal(plain, (), dict(plain_inputs, perturbation_mask=device_mask,
                                              spatio_temporal_guidance_blocks=[0])) == ""


def test_graph_constants_are_what_the_forward_builds():
    """The coordinates built for a call are the ones its forward builds: the model's outputs with
    them passed equal its outputs without (positional arguments bind as the forward binds them)."""
    model, inputs = ltx2_call("bench", False)
    args = (inputs.pop("hidden_states"), inputs.pop("audio_hidden_states"))
    new_args, new_kwargs, built = ltx2.graph_constants(model, args, inputs)
    assert set(built) == {"video_coords", "audio_coords"}
    assert new_kwargs["video_coords"] is built["video_coords"] or built["video_coords"] in new_args
    with torch.no_grad():
        assert equal(model(*new_args, **new_kwargs), model(*args, **inputs))
    given = dict(inputs, video_coords=built["video_coords"], audio_coords=built["audio_coords"])
    assert ltx2.graph_constants(model, args, given) == (args, given, None)  # nothing left to build


# ---------------------------------------------------------------- GPU


@needs_cuda
@pytest.mark.parametrize("with_ditops", [False, True], ids=["graph", "ditops+graph"])
@pytest.mark.parametrize("guidance", GUIDANCE, ids=["no-stg", "stg"])
@pytest.mark.parametrize("form", FORMS)
def test_gpu_each_call_form_is_captured(form, guidance, with_ditops):
    model, inputs = ltx2_call(form, guidance, "cuda")
    calls = steps(inputs, 5)
    reference = [run(model, x) for x in calls]
    if with_ditops:
        report = dd.enable(model, cuda_graph=True)
        state = report.graphs["LTX2VideoTransformer3DModel"]
    else:
        state = dd.capture(model)["LTX2VideoTransformer3DModel"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outs = [run(model, x) for x in calls]
        kept = [tuple(t.clone() for t in o) for o in outs]
        again = run(model, calls[1])
    print(state)
    assert not [str(w.message) for w in caught if "ditops" in str(w.message)]
    for i, (got, want) in enumerate(zip(outs, reference)):
        assert equal(got, want), f"{form}, guidance {guidance}: step {i} differs from eager"
        assert equal(got, kept[i]), f"step {i}'s output changed after later replays"
    assert equal(again, reference[1])
    assert (state.graphs, state.captures, state.replays) == (1, 1, 3 + 1)
    dd.disable(model)


@needs_cuda
@pytest.mark.parametrize("with_ditops", [False, True], ids=["graph", "ditops+graph"])
def test_gpu_a_failed_whole_capture_goes_regional(monkeypatch, with_ditops):
    """The H200's failure (bench form, coordinates built in the forward: a host-to-device copy) with
    graph_constants gone: the whole capture fails for real, the blocks are captured and replayed,
    and every step equals eager."""
    monkeypatch.setattr(ltx2, "graph_constants", None)
    model, inputs = ltx2_call("bench", False, "cuda")
    calls = steps(inputs, 5)
    if with_ditops:
        dd.enable(model)
    reference = [run(model, x) for x in calls]
    state = dd.capture(model)["LTX2VideoTransformer3DModel"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outs = [run(model, x) for x in calls]
        again = run(model, calls[1])
    print(state)
    (msg,) = capture_warnings(caught)
    assert "its repeated blocks are captured instead" in msg and "prepare_video_coords" in msg, msg
    for i, (got, want) in enumerate(zip(outs, reference)):
        assert equal(got, want), f"step {i} differs from eager"
    assert equal(again, reference[1])
    blocks = len(model.transformer_blocks)
    assert state.graphs == 0 and state.region_graphs == blocks
    assert sum(r.replays for r in state.regions) == (2 + 1) * blocks
    dd.disable(model) if with_ditops else dd.release(model)
    assert all("forward" not in m.__dict__ for m in model.modules())


@needs_cuda
def test_gpu_a_perturbation_mask_on_the_device_runs_eagerly_with_one_warning():
    model, inputs = ltx2_call("pipeline", True, "cuda")
    inputs["perturbation_mask"] = torch.zeros(1, device="cuda")  # read on the host by the forward
    calls = steps(inputs)
    reference = [run(model, x) for x in calls]
    state = dd.capture(model)["LTX2VideoTransformer3DModel"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outs = [run(model, x) for x in calls]
    assert all(equal(a, b) for a, b in zip(outs, reference))
    (msg,) = capture_warnings(caught)
    assert CAPTURE_WARNING in msg and "perturbation_mask is on cuda" in msg, msg
    assert state.graphs == 0
    dd.release(model)
