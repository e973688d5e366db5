"""ditops.diffusers from several threads: each thread's outputs equal the same call made alone.

On the CPU (CI): a captured model (the stand-in backend of test_diffusers_capture, whose "graph"
reruns the forward on the shared static inputs as a replay does) and an enabled model whose
sites run the ops' CPU reference (tier high: the rotary table cache is used), called by 4
threads at two signatures; the rotary table cache from threads with different tables; the
first-sight rule that a signature disabled by one thread's check stays disabled (sites and
ditops.torch's gate); enable from two threads at once. The thread switch interval is shortened so
that an unguarded shared buffer is overwritten between two steps of a call.
On CUDA (skipped without a device): the H200 case of issue 41 §5, a tiny FLUX.1 (2 + 2 blocks)
warmed at 16x16 and 20x20 latents, then 4 threads x 20 calls (two threads per resolution), with
and without cuda_graph, on the default stream and on a stream per thread."""
import sys
import threading
import time
import warnings

import pytest

from conftest import diffusers_or_skip, needs_cuda_mark

torch, diffusers = diffusers_or_skip()
import ditops.diffusers as dd  # noqa: E402
import ditops.torch as dt  # noqa: E402
from ditops.diffusers import _graphs, _sites  # noqa: E402


from test_diffusers import HEAD_DIM, assert_same, randomize, snapshot  # noqa: E402
from test_diffusers_capture import StandIn  # noqa: E402

needs_cuda = needs_cuda_mark(torch)
THREADS, RESOLUTIONS = 4, (16, 20)  # latent sides: 8x8 and 10x10 tokens after FLUX's 2x2 packing


@pytest.fixture(autouse=True)
def nothing_left_enabled():
    yield
    for model in list(dd._ENABLED):
        dd.disable(model)


@pytest.fixture
def fast_switching():
    """Threads switch every few microseconds (CPython's default is 5 ms, longer than a step)."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


@pytest.fixture
def standin(monkeypatch):
    backend = StandIn()
    monkeypatch.setattr(_graphs, "BACKEND", backend)
    return backend


def flux(layers=1, single_layers=1, device="cpu"):
    model = diffusers.FluxTransformer2DModel(
        patch_size=1, in_channels=8, num_layers=layers, num_single_layers=single_layers,
        attention_head_dim=HEAD_DIM, num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=16,
        axes_dims_rope=(8, 28, 28))
    return randomize(model).to(device, torch.bfloat16)


def flux_inputs(latent_side, seed, device="cpu"):
    """One call's inputs at latent_side x latent_side latents (packed 2x2: (side / 2)^2 tokens),
    values from seed."""
    side = latent_side // 2
    gen = torch.Generator().manual_seed(seed)
    grid = torch.meshgrid(torch.zeros(1), torch.arange(float(side)), torch.arange(float(side)), indexing="ij")
    inputs = dict(hidden_states=torch.randn(1, side * side, 8, generator=gen),
                  encoder_hidden_states=torch.randn(1, 8, 32, generator=gen),
                  pooled_projections=torch.randn(1, 16, generator=gen),
                  timestep=torch.rand(1, generator=gen), img_ids=torch.stack(grid, -1).reshape(-1, 3),
                  txt_ids=torch.zeros(8, 3), return_dict=False)
    return {k: (v.to(device, torch.bfloat16) if torch.is_floating_point(v) and k not in ("img_ids", "txt_ids")
                else v.to(device)) if torch.is_tensor(v) else v for k, v in inputs.items()}


def run(model, inputs):
    with torch.no_grad():
        return model(**inputs)[0]


def calls(per_thread):
    """[(thread, resolution, inputs)] of every call: two threads per resolution, each call its own values."""
    return [[(t, RESOLUTIONS[t % 2], 1000 * t + i) for i in range(per_thread)] for t in range(THREADS)]


def threaded(model, plan, device="cpu", streams=False):
    """Runs plan (calls()) with one thread per row; returns {(thread, i): output} and the errors."""
    outs, errors = {}, []
    barrier = threading.Barrier(len(plan))

    def worker(t, row):
        stream = torch.cuda.Stream() if streams else None
        try:
            inputs = [flux_inputs(res, seed, device) for _, res, seed in row]
            if stream is not None:
                stream.wait_stream(torch.cuda.current_stream())
            barrier.wait()
            for i, x in enumerate(inputs):
                if stream is None:
                    outs[t, i] = run(model, x)
                else:
                    with torch.cuda.stream(stream):
                        outs[t, i] = run(model, x)
            if stream is not None:
                stream.synchronize()
        except BaseException as e:  # noqa: BLE001 (reported by the test)
            errors.append(e)

    workers = [threading.Thread(target=worker, args=(t, row)) for t, row in enumerate(plan)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return outs, errors


def alone(model, plan, device="cpu"):
    return {(t, i): run(model, flux_inputs(res, seed, device)) for t, row in enumerate(plan)
            for i, (_, res, seed) in enumerate(row)}


def differing(outs, reference):
    return sorted(k for k in reference if not torch.equal(outs[k], reference[k]))


# ---------------------------------------------------------------- CPU


def test_regional_capture_from_threads_equals_alone(monkeypatch, fast_switching):
    """The regional fallback under 4 threads: the blocks' graphs share the model's pool, lock and
    stream, so every output is the same call's alone."""
    from test_diffusers_capture import FailFirst
    backend = FailFirst()
    monkeypatch.setattr(_graphs, "BACKEND", backend)
    model = flux()
    plan = calls(8)
    state = dd.capture(model)["FluxTransformer2DModel"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for res in RESOLUTIONS:  # first sight; regional (the blocks' first calls); the blocks capture
            for seed in range(3):
                run(model, flux_inputs(res, seed))
        reference = alone(model, plan)
        outs, errors = threaded(model, plan)
    assert not errors, errors
    bad = differing(outs, reference)
    assert not bad, f"{len(bad)} of {len(reference)} outputs differ from the same call made alone: {bad[:8]}"
    assert state.graphs == 0 and state.region_graphs == 2 * len(RESOLUTIONS)
    assert {r._lock for r in state.regions} == {state._lock}


@pytest.mark.parametrize("with_ditops", [False, True], ids=["capture", "enable+capture"])
def test_captured_model_from_threads_equals_alone(standin, fast_switching, with_ditops):
    """4 threads through one captured model at two signatures: every output is the same call's
    alone, and every replay is counted (the static inputs, outputs and counters are shared)."""
    model = flux()
    plan = calls(8)
    if with_ditops:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # CPU: the close references are unfit
            state = dd.enable(model, allow_cpu=True, cuda_graph=True).graphs["FluxTransformer2DModel"]
    else:
        state = dd.capture(model)["FluxTransformer2DModel"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for res in RESOLUTIONS:  # warm: first call eager, second captures
            run(model, flux_inputs(res, 0)), run(model, flux_inputs(res, 1))
        reference = alone(model, plan)
        replays = state.replays
        outs, errors = threaded(model, plan)
    assert not errors, errors
    bad = differing(outs, reference)
    assert not bad, f"{len(bad)} of {len(reference)} outputs differ from the same call made alone: {bad[:8]}"
    assert state.graphs == 2 and standin.captures == 2
    assert state.replays - replays == len(reference)


def test_enabled_model_from_threads_equals_alone(fast_switching):
    """The sites from 4 threads (tier high: the ops run their CPU reference, each forward builds
    its rotary table cache): outputs equal the same call alone, and the site counters count every
    call of every thread."""
    model = flux()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        report = dd.enable(model, "high", allow_cpu=True)
        plan = calls(6)
        reference = alone(model, plan)  # also the first sights of both signatures
        qk = report["qk_norm_rope"]
        assert qk.fused_calls > 0, str(report)  # the op (and its rotary cache) runs at this site
        before = {s.name: s.fused_calls + s.model_calls for s in report.sites}
        outs, errors = threaded(model, plan)
    assert not errors, errors
    bad = differing(outs, reference)
    assert not bad, f"{len(bad)} of {len(reference)} outputs differ from the same call made alone: {bad[:8]}"
    for s in report.sites:  # the same calls again: the same number of site calls as alone
        assert s.fused_calls + s.model_calls - before[s.name] == before[s.name], s.name


def test_rope_table_threads_get_their_own_table(fast_switching):
    """Threads with different rotary tensors asking one site's RopeTable for a table: each gets
    the table built from its own tensors (before the cache was per thread, a thread could read
    another's table between the identity check and the read)."""
    table = _sites.RopeTable()
    errors, wrong = [], []
    barrier = threading.Barrier(THREADS)

    def worker(t):
        try:
            cos = torch.full((16, 8), float(t))
            sin = torch.full((16, 8), -float(t))
            want = _sites.RopeTable.build((cos, sin), "full_width")
            barrier.wait()
            for i in range(3000):
                freqs = (cos, sin) if i % 7 else (cos.clone(), sin.clone())  # now and then a new forward
                cache, positions = table.get(freqs, "full_width", 2, 5, 1, torch.device("cpu"))
                if not torch.equal(cache, want) or not torch.equal(positions, torch.arange(2, 7)):
                    wrong.append((t, i))
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    workers = [threading.Thread(target=worker, args=(t,)) for t in range(THREADS)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert not errors, errors
    assert not wrong, f"{len(wrong)} calls got another thread's table: {wrong[:5]}"


def test_a_disabled_signature_stays_disabled(monkeypatch):
    """Two first sights of one signature at once: the one that saw a difference wins, whichever
    finishes last (a site's and ditops.torch's gate)."""
    site = _sites.Site("s", op="residual_gate_add", chain="x")
    site.exact = True
    sig = ("cpu", torch.bfloat16)
    ref, out = (torch.zeros(3),), (torch.zeros(3),)
    with pytest.warns(RuntimeWarning, match="disabling residual_gate_add"):
        site._disable(sig, "3 of 3 elements differ")  # one thread's check
    report = type("R", (), {"chosen": "residual_gate_add.reference"})()
    monkeypatch.setattr(_sites, "_contract", lambda name: "bit_exact")
    got = site._first_sight(sig, lambda: out, lambda: ref, lambda: report)  # the other's: equal
    assert got is ref and site.states[sig] == _sites.DISABLED
    assert site.fused_calls == 0 and site.model_calls == 2

    gate = dt._QKNORM_ROPE_GATE  # ditops.torch's self-check: the same mechanism (ditops._gate)
    try:
        with pytest.warns(RuntimeWarning, match="disabling the fused qknorm_rope path"):
            dt._disable_qknorm_rope("sig", "differ")
        assert not gate.verify("sig") and gate.state("sig") == "disabled"
        assert gate.verify("other") and gate.state("other") == "verified"
        with pytest.warns(RuntimeWarning):
            dt._disable_qknorm_rope("other", "a later check differed")
        assert gate.state("other") == "disabled" and gate.reasons["other"] == "a later check differed"
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            dt._disable_qknorm_rope("other", "again")  # warned once per signature
    finally:
        dt.reset_gates()


def test_enable_from_two_threads_patches_once(monkeypatch):
    """Two threads enabling one model at once: one enables it, the other is refused; disable
    restores the model exactly. Planning is slowed (a big model's plan takes that long) so that
    both threads are between the "already enabled" check and the registration together."""
    model = flux()
    before = snapshot(model)
    plan_model = dd._plan_model

    def slow_plan(*args, **kwargs):
        time.sleep(0.05)
        return plan_model(*args, **kwargs)

    monkeypatch.setattr(dd, "_plan_model", slow_plan)
    results, barrier = [], threading.Barrier(2)

    def worker():
        barrier.wait()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                results.append(dd.enable(model, allow_cpu=True))
        except dd.UnsupportedError as e:
            results.append(e)

    workers = [threading.Thread(target=worker) for _ in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    reports = [r for r in results if isinstance(r, dd.Report)]
    refused = [r for r in results if isinstance(r, dd.UnsupportedError)]
    assert len(reports) == 1 and len(refused) == 1 and "already enabled" in str(refused[0])
    assert dd.disable(model) is reports[0]
    assert_same(before, snapshot(model))


# ---------------------------------------------------------------- GPU


@needs_cuda
@pytest.mark.parametrize("streams", [False, True], ids=["default-stream", "stream-per-thread"])
@pytest.mark.parametrize("cuda_graph", [False, True], ids=["ditops", "ditops+graph"])
def test_gpu_threads_equal_alone(cuda_graph, streams):
    """Issue 41 §5 on the H200: a tiny FLUX.1 (2 + 2 blocks, random norm weights) enabled (and
    captured), warmed at 16x16 and 20x20 latents, then 4 threads x 20 calls (two per resolution):
    0 of 80 outputs differ from the same call made alone (7 of 80 did before the replay lock)."""
    model = flux(2, 2, "cuda")
    report = dd.enable(model, cuda_graph=cuda_graph)
    plan = calls(20)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for res in RESOLUTIONS:
            run(model, flux_inputs(res, 0, "cuda")), run(model, flux_inputs(res, 1, "cuda"))
        reference = alone(model, plan, "cuda")
        torch.cuda.synchronize()
        outs, errors = threaded(model, plan, "cuda", streams)
        torch.cuda.synchronize()
    assert not errors, errors
    assert not [str(w.message) for w in caught if "ditops" in str(w.message)]
    bad = differing(outs, reference)
    print(report)
    assert not bad, f"{len(bad)} of {len(reference)} outputs differ from the same call made alone: {bad[:8]}"
    if cuda_graph:
        state = report.graphs["FluxTransformer2DModel"]
        assert state.graphs == 2 and state.replays == 2 * len(reference)


def test_reports_read_while_threads_add_signatures(standin, fast_switching):
    """The live reports (str and as_dict of the Report and the CapturedForward) read while 4 threads
    add signatures (a new resolution per call) and count: no 'changed size during iteration', and
    the counts add up at the end."""
    model = flux()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        report = dd.enable(model, allow_cpu=True, cuda_graph=True)
    state = report.graphs["FluxTransformer2DModel"]
    sides = [[2 * (2 + t + THREADS * i) for i in range(6)] for t in range(THREADS)]  # 24 token grids
    done, errors = threading.Event(), []

    def worker(row):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                for side in row:
                    run(model, flux_inputs(side, side))
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    workers = [threading.Thread(target=worker, args=(row,)) for row in sides]
    for w in workers:
        w.start()
    reads = 0
    while any(w.is_alive() for w in workers):
        try:
            str(report), report.as_dict(), str(state), state.as_dict()
        except RuntimeError as e:
            errors.append(e)
            break
        reads += 1
    for w in workers:
        w.join()
    assert not errors, errors
    assert reads > 0 and len(state.entries) == THREADS * 6 and state.eager_calls == THREADS * 6
