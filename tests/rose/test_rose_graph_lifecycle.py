"""A graph layout's life on any machine: eager warm-up, capture, replay, and what happens when a capture
fails or its graph is wrong. The real CudaGraphs and ModelRunner.step on a tiny CPU model, with torch.cuda's
capture calls faked (fake_cuda.py): a fake replay recomputes the captured forward in place."""

from __future__ import annotations

import numpy as np
import pytest

from fake_cuda import attach_graphs
from rose import Batch


def batch_of(engine, lengths=(20, 12, 8), seed=0):
    rng = np.random.default_rng(seed)
    return Batch.from_sequences([rng.integers(1, 200, size=n).astype(np.int32) for n in lengths],
                                engine.spec.pooling)


def hows(runner, before):
    return [how for (label, how), n in runner.runs.items() for _ in range(n - before.get((label, how), 0))]


@pytest.fixture
def engine(engine_for):
    return engine_for("bert")


def test_every_eager_run_takes_the_runners_one_eager_path(engine, monkeypatch):
    runner = engine.runner
    seen = []
    real = runner.eager
    monkeypatch.setattr(runner, "eager", lambda host, staged: seen.append(host.layout) or real(host, staged))
    attach_graphs(runner, monkeypatch)
    batch = batch_of(engine)
    graph_rows = runner.step(batch).result()  # a graph layout's eager warm-up
    exact_rows = runner.step(batch, use_graphs=False).result()  # an exact-size eager batch
    assert [(lay.tokens, lay.seqs) for lay in seen] == [(64, 4), (40, 3)]
    assert np.allclose(graph_rows, exact_rows, atol=1e-5)


def test_lazy_capture_then_replay_on_fake_cuda(engine, monkeypatch):
    runner = engine.runner
    fake = attach_graphs(runner, monkeypatch)
    before = dict(runner.runs)
    rows = [runner.step(batch_of(engine, seed=i)).result() for i in range(4)]
    assert hows(runner, before) == ["eager", "capture", "replay", "replay"]
    for i, got in enumerate(rows):
        assert np.allclose(got, runner.step(batch_of(engine, seed=i), use_graphs=False).result(), atol=1e-5)
    assert len(fake.captures) == 1 and len(runner.graphs.graphs) == 1
