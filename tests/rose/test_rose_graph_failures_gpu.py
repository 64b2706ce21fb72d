"""Issue 14's graph defects on a real device (test_rose_graph_lifecycle.py has the same logic on a CPU with
a faked capture): a capture the driver invalidates, captures while another thread queries CUDA events, a
lazily captured graph that disagrees with eager, FlashInfer out of graph wrappers.

    pytest -m gpu tests/rose/test_rose_graph_failures_gpu.py
"""

from __future__ import annotations

import sys
import threading

import numpy as np
import pytest
import torch

from rose import Batch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
BAR = 1e-3


def gpu_engine(path, **kwargs):
    from rose.engine import Engine

    return Engine.from_pretrained(path, device="cuda", prewarm=(), graph_manifest=None, **kwargs)


def batch_of(engine, lengths, seed=0):
    rng = np.random.default_rng(seed)
    return Batch.from_sequences([rng.integers(1, 200, size=n).astype(np.int32) for n in lengths], engine.spec.pooling)


def new_hows(runner, before):
    return [how for (label, how), n in runner.runs.items() for _ in range(n - before.get((label, how), 0))]


def steps_like_eager(engine, batch, times: int) -> list[str]:
    """Step `batch` `times` times, each result checked against an exact-size eager run; how each step ran
    (the checks' own eager runs are not counted)."""
    hows = []
    for _ in range(times):
        before = dict(engine.runner.runs)
        rows = engine.step(batch).result()
        hows += new_hows(engine.runner, before)
        assert_like_eager(engine, batch, rows)
    return hows


def assert_like_eager(engine, batch, rows):
    from rose.graphs import cosine_divergence

    eager = engine.runner.step(batch, use_graphs=False).result()
    assert np.isfinite(rows).all() and float(cosine_divergence(rows, eager).max()) <= BAR


def test_a_capture_the_driver_invalidates_falls_back_to_eager(tiny_models):
    engine = gpu_engine(tiny_models["qwen3"].path)
    graphs = engine.runner.graphs
    real = graphs.forward

    def syncing_forward(meta):
        out = real(meta)
        if torch.cuda.is_current_stream_capturing():
            torch.cuda.current_stream().synchronize()  # not permitted while capturing: invalidates the capture
            raise RuntimeError("the driver allowed a stream synchronize during capture")
        return out

    graphs.forward = syncing_forward
    batch = batch_of(engine, (20, 12, 8))
    # eager warm-up, the failed capture (served eagerly), eager
    assert steps_like_eager(engine, batch, 3).count("capture") == 0
    assert (engine.stats()["captures_failed"], engine.stats()["graphs_captured"]) == (1, 0)
    graphs.forward = real  # the device, the stream and the allocator are fine afterwards: another layout captures
    other = batch_of(engine, (60, 30), seed=1)
    assert steps_like_eager(engine, other, 3) == ["eager", "capture", "replay"]
    assert torch.cuda.current_stream() == torch.cuda.default_stream()
    engine.close()


def test_captures_survive_another_thread_querying_events(tiny_models, monkeypatch):
    """Tulip's completer polls LazyTensor events while the launcher captures: in the default global capture
    mode each query from another thread invalidates the capture (and raises in that thread). Every shape
    takes the lazy path here (no substitute graphs: each must be captured)."""
    import rose.graphs

    monkeypatch.setattr(rose.graphs, "SUBSTITUTE_SIGHTS", 0)
    old = sys.getswitchinterval()
    engine = gpu_engine(tiny_models["qwen3"].path)
    done = torch.cuda.Event()
    done.record()
    torch.cuda.synchronize()
    stop, errors, queries = threading.Event(), [], [0]

    def poll():
        while not stop.is_set():
            try:
                done.query()
                queries[0] += 1
            except Exception as exc:  # noqa: BLE001
                errors.append(exc)

    sys.setswitchinterval(1e-5)  # hand the GIL over often, so the queries land inside the captures
    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    try:
        shapes = [(20, 12, 8), (60,), (100, 30), (7, 7, 7, 7, 7), (120,)]
        for i, lengths in enumerate(shapes):
            batch = batch_of(engine, lengths, seed=i)
            for _ in range(2):  # eager warm-up, then the capture
                assert_like_eager(engine, batch, engine.step(batch).result())
    finally:
        stop.set()
        thread.join()
        sys.setswitchinterval(old)
    stats = engine.stats()
    assert errors == [] and queries[0] > 0
    assert (stats["graphs_captured"], stats["captures_failed"], stats["graphs_refused"]) == (len(shapes), 0, 0)
    engine.close()


def test_a_lazily_captured_graph_that_disagrees_with_eager_is_refused(tiny_models):
    engine = gpu_engine(tiny_models["bert"].path)
    graphs = engine.runner.graphs
    real = graphs.forward
    skew = torch.linspace(-1, 1, engine.spec.dimensions, device="cuda")
    graphs.forward = lambda meta: real(meta) * skew  # what the graph records; eager runs stay right
    batch = batch_of(engine, (20, 12, 8))
    # eager warm-up, the refused capture (served its eager rows), eager
    assert steps_like_eager(engine, batch, 3) == ["eager"] * 3
    stats = engine.stats()
    assert (stats["graphs_refused"], stats["graphs_captured"], stats["captures_failed"]) == (1, 0, 0)
    engine.close()


def test_flashinfer_out_of_graph_wrappers_serves_new_layouts_eagerly(tiny_root, monkeypatch):
    from rose_tiny_models import build_qwen3_06b_shape

    from rose.attention import AttentionBackendError, AttentionShape, flashinfer, make_backend

    try:
        make_backend("flashinfer-fa2", torch.device("cuda"), torch.bfloat16, shape=AttentionShape(16, 8, 128, True))
    except AttentionBackendError as exc:
        pytest.skip(f"flashinfer-fa2 cannot run here: {exc}")
    monkeypatch.setattr(flashinfer, "MAX_GRAPH_WRAPPERS", 1)
    engine = gpu_engine(build_qwen3_06b_shape(tiny_root).path, attention="flashinfer-fa2")
    runner = engine.runner
    for n in (37, 50, 64, 100):  # exact-size single-sequence batches take no graph wrapper
        runner.step(batch_of(engine, (n,)), use_graphs=False).result()
    assert len(runner.backend._graph_slots) == 0
    first, second = batch_of(engine, (20, 12, 8)), batch_of(engine, (300, 100), seed=1)
    before = dict(runner.runs)
    for batch in (first, first, first, second, second, second):
        assert_like_eager(engine, batch, engine.step(batch).result())
    assert new_hows(runner, before) == ["eager", "capture", "replay", "eager", "eager", "eager"]
    assert (engine.stats()["graphs_captured"], engine.stats()["captures_failed"]) == (1, 1)
    engine.close()
