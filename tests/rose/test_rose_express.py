"""ROSE's express lane (rose/express.py) on any machine: its own graphs (own pool, buckets up to its
budget), its own backend and lock, the same rows as the main lane, and its prewarm. The real ModelRunner and
CudaGraphs on a tiny CPU model with torch.cuda's capture calls faked (fake_cuda.py); the stream priority and
the concurrency are the GPU test's (test_rose_express_gpu.py)."""

from __future__ import annotations

import numpy as np
import pytest

from fake_cuda import attach_express, attach_graphs
from rose import Batch


@pytest.fixture
def engine(engine_for):
    return engine_for("bert")


def batch_of(engine, lengths=(20, 12), seed=0):
    rng = np.random.default_rng(seed)
    return Batch.from_sequences([rng.integers(1, 200, size=n).astype(np.int32) for n in lengths],
                                engine.spec.pooling)


def test_no_express_lane_on_a_cpu(engine):
    assert engine.express is False and engine.runner.enable_express(64) is False
    with pytest.raises(RuntimeError, match="express lane"):
        engine.step(batch_of(engine), express=True)


def test_express_steps_capture_and_replay_in_graphs_of_their_own(engine, monkeypatch):
    runner = engine.runner
    fake = attach_graphs(runner, monkeypatch)
    lane = attach_express(runner, monkeypatch, fake, max_tokens=100)
    assert lane.graphs is not runner.graphs and lane.graphs.pool is not None
    assert lane.stream.priority < 0, "a higher priority than the bulk stream's 0"
    assert lane.backend is not runner.backend and lane.lock is not runner._lock
    assert max(lane.graphs.token_buckets) == min(t for t in runner.graphs.token_buckets if t >= 100)
    before = dict(runner.runs)
    for seed in range(3):
        got = engine.step(batch_of(engine, seed=seed), express=True).result()
        want = engine.step(batch_of(engine, seed=seed), express=False).result()  # the main lane's graphs
        assert np.allclose(got, want, atol=1e-5)
    express_runs = {k: n - before.get(k, 0) for k, n in runner.runs.items() if k[0].startswith("x")}
    assert sorted(how for (_, how), n in express_runs.items() for _ in range(n)) == ["capture", "eager", "replay"]
    assert len(lane.graphs.graphs) == 1 and len(runner.graphs.graphs) == 1, "each lane captured its own"
    stats = engine.stats()
    assert stats["express_graphs_captured"] == 1 and stats["express_captures_failed"] == 0


def test_express_batches_above_its_buckets_run_eagerly_on_the_lane(engine, monkeypatch):
    runner = engine.runner
    fake = attach_graphs(runner, monkeypatch)
    lane = attach_express(runner, monkeypatch, fake, max_tokens=32)
    big = batch_of(engine, lengths=(60, 50, 40))  # 150 tokens: above the lane's largest bucket
    assert lane.graphs.layout_for(big.num_tokens, big.num_seqs, big.num_rows, 60) is None
    got = [engine.step(big, express=True).result() for _ in range(3)]
    assert all(np.allclose(g, engine.step(big, express=False).result(), atol=1e-5) for g in got)
    assert not lane.graphs.graphs and runner.runs[("xt256", "eager")] == 3


def test_prewarm_express_captures_the_small_prewarm_layouts_on_the_lane_alone(engine, monkeypatch):
    runner = engine.runner
    fake = attach_graphs(runner, monkeypatch)
    lane = attach_express(runner, monkeypatch, fake, max_tokens=64)
    monkeypatch.setattr(engine, "prewarm", ((32, 1), (64, 2), (200, 4)))
    monkeypatch.setattr(engine, "graph_manifest", None)
    assert len(engine.warmup()) == 3 and not lane.graphs.graphs, "the main prewarm leaves the lane alone"
    def main_runs():
        return {k: n for k, n in runner.runs.items() if not k[0].startswith("x")}

    before = main_runs()
    verified = engine.prewarm_express()
    main_tokens = sorted(layout.tokens for layout in runner.graphs.graphs)
    express_tokens = sorted(layout.tokens for layout in lane.graphs.graphs)
    assert main_tokens == [32, 64, 256] and express_tokens == [32, 64]
    assert len(verified) == 2 and all(v.max_divergence < 1e-3 for v in verified)
    assert main_runs() == before, "every step of the express prewarm, the eager checks too, ran on the express lane"
