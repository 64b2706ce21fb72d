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
    monkeypatch.setattr(runner, "eager",
                        lambda host, staged, backend=None: seen.append(host.layout) or real(host, staged, backend))
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


def test_a_step_says_whether_its_layout_ran_cold(engine, monkeypatch):
    """The eager warm-up and the capture of a graph layout are cold hits; replays and exact sizes are not."""
    runner = engine.runner
    attach_graphs(runner, monkeypatch)
    colds = [runner.step(batch_of(engine, seed=i)).cold for i in range(3)]
    assert colds == [True, True, False]
    assert runner.step(batch_of(engine), use_graphs=False).cold is False


def test_a_failed_capture_falls_back_to_eager_for_that_layout_once(engine, monkeypatch, caplog):
    runner = engine.runner
    fake = attach_graphs(runner, monkeypatch)
    fake.fail = RuntimeError("CUDA error: operation not permitted when stream is capturing")
    before = dict(runner.runs)
    with caplog.at_level("WARNING", logger="rose.graphs"):
        for i in range(4):  # eager warm-up, the failed capture, then eager: the failing batch is served too
            got = runner.step(batch_of(engine, seed=i)).result()
            assert np.allclose(got, runner.step(batch_of(engine, seed=i), use_graphs=False).result(), atol=1e-5)
    assert hows(runner, before).count("capture") == 0 and len(fake.captures) == 1, "never retried"
    assert engine.stats()["captures_failed"] == 1 and engine.stats()["graphs_captured"] == 0
    warnings = [r for r in caplog.records if r.name == "rose.graphs"]
    assert len(warnings) == 1 and "t64s4p4m64" in warnings[0].getMessage() and "runs eagerly" in warnings[0].getMessage()
    assert runner.graphs.pending() == [] and engine.capture_pending() is False
    fake.fail = None  # other layouts still capture
    other = batch_of(engine, lengths=(60, 20))
    for _ in range(3):
        runner.step(other).result()
    assert len(runner.graphs.graphs) == 1


def test_a_backend_out_of_graph_slots_fails_the_capture_not_the_batch(engine, monkeypatch):
    from rose.attention import AttentionBackendError

    runner = engine.runner
    attach_graphs(runner, monkeypatch)
    real_plan = runner.graphs.plan

    def plan(meta):
        if meta.graph:
            raise AttentionBackendError("all 256 graph wrappers are taken")
        real_plan(meta)

    monkeypatch.setattr(runner.graphs, "plan", plan)
    rows = [runner.step(batch_of(engine, seed=i)).result() for i in range(3)]
    assert all(np.isfinite(r).all() for r in rows) and runner.graphs.captures_failed == 1


def test_captures_run_in_thread_local_error_mode(engine, monkeypatch):
    """Other threads (the completer, metrics, LazyTensor releases) query CUDA events while the launcher
    captures: in the default global mode each such call would invalidate the capture."""
    runner = engine.runner
    fake = attach_graphs(runner, monkeypatch)
    for i in range(2):
        runner.step(batch_of(engine, seed=i)).result()
    assert [c["capture_error_mode"] for c in fake.captures] == ["thread_local"]


def test_a_failed_step_returns_its_pinned_buffer_even_when_the_device_cannot_sync(engine, monkeypatch):
    import torch

    import rose.runner

    runner = engine.runner
    monkeypatch.setattr(runner, "device", torch.device("cuda", 0))  # the CUDA step path, on a CPU
    monkeypatch.setattr(rose.runner, "_device_scope", lambda device: __import__("contextlib").nullcontext())

    class Sticky:  # the step's stream, on a device that cannot synchronize any more
        def synchronize(self):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    def failing_eager(host, staged, backend=None):
        raise ValueError("the kernel failed")

    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: Sticky())
    monkeypatch.setattr(runner, "eager", failing_eager)
    in_use = runner.pool.stats()["bytes_in_use"]
    with pytest.raises(ValueError, match="the kernel failed"):  # the step's own error, not the sync's
        runner.step(batch_of(engine))
    assert runner.pool.stats()["bytes_in_use"] == in_use


def test_a_lazily_captured_graph_that_disagrees_with_eager_is_refused(engine, monkeypatch, caplog):
    runner = engine.runner
    fake = attach_graphs(runner, monkeypatch)
    fake.corrupt = True  # every replay writes a wrong (but finite) result
    before = dict(runner.runs)
    with caplog.at_level("WARNING", logger="rose.graphs"):
        for i in range(4):
            got = runner.step(batch_of(engine, seed=i)).result()
            assert np.allclose(got, runner.step(batch_of(engine, seed=i), use_graphs=False).result(), atol=1e-5), i
    assert hows(runner, before) == ["eager"] * 8 and len(fake.captures) == 1, "refused once, never recaptured"
    stats = engine.stats()
    assert (stats["graphs_refused"], stats["graphs_captured"], stats["captures_failed"]) == (1, 0, 0)
    warnings = [r.getMessage() for r in caplog.records if r.name == "rose.graphs"]
    assert len(warnings) == 1 and "disagrees with the eager forward" in warnings[0]
    assert runner.graphs.pending() == []


def test_a_verified_lazy_capture_costs_one_eager_run_of_the_same_batch(engine, monkeypatch):
    runner = engine.runner
    seen = []
    real = runner.eager
    monkeypatch.setattr(runner, "eager", lambda host, staged: seen.append(host.packed.copy()) or real(host, staged))
    attach_graphs(runner, monkeypatch)
    first, second = batch_of(engine, seed=0), batch_of(engine, seed=1)
    runner.step(first).result()
    runner.step(second).result()  # captured, replayed, and checked against the eager run of this batch
    runner.step(second).result()
    assert len(seen) == 2 and np.array_equal(seen[1], runner.pack(second, runner.graphs.layout_for(40, 3, 3, 20)).packed)
    assert runner.graphs.graphs_refused == 0 and len(runner.graphs.graphs) == 1


def test_prewarm_refuses_to_serve_when_a_graph_disagrees(engine, monkeypatch):
    from rose.graphs import GraphVerificationError
    from rose.warmup import prewarm_and_verify

    runner = engine.runner
    fake = attach_graphs(runner, monkeypatch)
    assert len(prewarm_and_verify(runner, [(32, 1, 1, 32)], engine.spec.pooling)) == 1
    fake.corrupt = True
    with pytest.raises(GraphVerificationError, match="refusing to serve"):
        prewarm_and_verify(runner, [(64, 2, 2, 40)], engine.spec.pooling)


def _prewarmed(engine, monkeypatch, shapes):
    from rose.warmup import prewarm_and_verify

    runner = engine.runner
    attach_graphs(runner, monkeypatch)
    assert len(prewarm_and_verify(runner, shapes, engine.spec.pooling)) == len(shapes)
    return runner


def test_a_batch_without_its_graph_replays_a_larger_captured_layout(engine, monkeypatch):
    """rose.graph_substitutes: no eager run and no capture on the request path while a captured layout
    within the padding bound holds the batch; the rows are the batch's own."""
    runner = _prewarmed(engine, monkeypatch, [(64, 4, 4, 40), (32, 1, 1, 32)])  # larger first: both captured
    assert len(runner.graphs.graphs) == 2
    batch = batch_of(engine, (20, 12, 9))  # 41 tokens, 3 sequences: its own layout t64s4 is captured...
    small = batch_of(engine, (14, 10))  # 24 tokens: own layout t32s4p4m32, not captured; t64s4 holds it
    own = runner.graphs.layout_for(24, 2, 2, 14)
    assert own not in runner.graphs.graphs
    before = dict(runner.runs)
    rows = runner.step(small).result()
    assert hows(runner, before) == ["replay"] and runner.graphs.substituted[own] == 1
    assert np.allclose(rows, runner.step(small, use_graphs=False).result(), atol=1e-5)
    assert engine.stats()["graph_substitutions"] == 1
    assert runner.graphs.pending()[0] == (24, 2, 2, 14), "idle capture would capture its own layout"
    mark = dict(runner.runs)
    runner.step(batch).result()
    assert hows(runner, mark) == ["replay"] and sum(runner.graphs.substituted.values()) == 1


def test_no_substitute_beyond_the_padding_bound_and_a_frequent_layout_gets_its_own_graph(engine, monkeypatch):
    import rose.graphs

    runner = _prewarmed(engine, monkeypatch, [(64, 4, 4, 40)])
    tiny = batch_of(engine, (5, 4))  # own layout t16: t64 is 4x its tokens, over the 2x bound
    before = dict(runner.runs)
    runner.step(tiny).result()
    assert hows(runner, before) == ["eager"] and not runner.graphs.substituted
    monkeypatch.setattr(rose.graphs, "SUBSTITUTE_SIGHTS", 2)
    small = batch_of(engine, (14, 10))
    seen = []
    for _ in range(5):
        mark = dict(runner.runs)
        rows = runner.step(small).result()
        seen += hows(runner, mark)
        assert np.allclose(rows, runner.step(small, use_graphs=False).result(), atol=1e-5)
    assert seen == ["replay", "replay", "eager", "capture", "replay"], "2 substitutes, then the lazy path"
    assert runner.graphs.layout_for(24, 2, 2, 14) in runner.graphs.graphs


def test_a_graph_holds_a_batch_only_when_its_seqlen_bound_holds_the_padding():
    from rose.graph_substitutes import find_substitute, holds
    from rose.meta import MetaLayout

    g = MetaLayout(512, 8, 8, 128)
    assert holds(g, 400, 3, 3, 100)  # padding 112 <= 128
    assert not holds(g, 300, 3, 3, 100), "a padding pseudo-sequence of 212 tokens is over Mb = 128"
    assert not holds(g, 400, 8, 8, 100), "8 sequences + the padding one need 9 slots"
    own = MetaLayout(384, 4, 4, 128)
    assert find_substitute(own, [MetaLayout(1024, 8, 8, 512), g], 370, 3, 3, 100) is None  # 370+142 pad > 128
    assert find_substitute(own, [MetaLayout(1024, 8, 8, 512), MetaLayout(512, 8, 8, 512)], 370, 3, 3, 100) \
        == MetaLayout(512, 8, 8, 512), "the smallest that holds it, within 2x"


def test_replays_says_whether_a_step_would_replay_its_own_captured_layout(engine, monkeypatch):
    """Engine.replays (what Tulip checks before stepping on its event loop): false through the eager warm-up
    and until the capture, true once the layout's graph serves, false for layouts without one; reads only."""
    batch = batch_of(engine)
    assert engine.replays(batch) is False  # no graphs at all (a CPU)
    runner = engine.runner
    attach_graphs(runner, monkeypatch)
    said = []
    for i in range(3):
        said.append(engine.replays(batch_of(engine, seed=i)))
        runner.step(batch_of(engine, seed=i)).result()
    assert said == [False, False, True]  # warm-up, capture, then the replay
    before = dict(runner.runs)
    assert engine.replays(batch) and engine.replays(batch)
    assert dict(runner.runs) == before and runner.graphs.substituted == {}
    assert engine.replays(batch_of(engine, lengths=(60, 20))) is False  # another layout, not captured
    assert engine.replays(Batch.from_sequences([], engine.spec.pooling)) is False


def test_layout_for_keeps_each_shapes_answer_within_its_bound(engine, monkeypatch):
    """CudaGraphs.layout_for answers as rose.buckets.choose_layout does, for shapes seen and new, and keeps at most
    LAYOUTS_KEPT shapes' answers."""
    import rose.graphs
    from rose.buckets import choose_layout
    from rose.meta import MetaLayout

    attach_graphs(engine.runner, monkeypatch)
    graphs = engine.runner.graphs
    monkeypatch.setattr(rose.graphs, "LAYOUTS_KEPT", 8)
    rng = np.random.default_rng(3)
    shapes = []
    for _ in range(40):
        seqs = int(rng.integers(1, 6))
        tokens = int(rng.integers(seqs, 300))
        shapes.append((tokens, seqs, seqs, int(rng.integers(1, tokens + 1))))
    shapes.append((20000, 1, 1, 20000))  # above the largest bucket: None, kept as such
    for shape in shapes[:5] * 3 + shapes * 2:  # the first five seen again while kept, then every one twice
        found = choose_layout(graphs.token_buckets, graphs.seq_buckets, *shape)
        assert graphs.layout_for(*shape) == (None if found is None else MetaLayout(*found))
        assert len(graphs._layouts) <= 8
    assert graphs._layouts[shapes[-1]] is None


def test_lone_queries_of_one_length_replay_their_own_rows(engine, monkeypatch):
    """Lone queries of one length share their packed words' fixed part (rose.meta._lone_words): each replay still
    embeds its own ids. (A CPU runner stages from the packed array itself; the pinned buffer's staging views are
    tests/rose/test_rose_lazy.py's, and the GPU tests' through the real path.)"""
    runner = engine.runner
    attach_graphs(runner, monkeypatch)
    rng = np.random.default_rng(5)
    queries = [Batch.from_sequences([rng.integers(1, 200, 30).astype(np.int32)], engine.spec.pooling)
               for _ in range(5)]
    before = dict(runner.runs)
    rows = [runner.step(q).result() for q in queries]
    assert hows(runner, before) == ["eager", "capture", "replay", "replay", "replay"]
    for q, got in zip(queries, rows):
        assert np.allclose(got, runner.step(q, use_graphs=False).result(), atol=1e-5)
    assert not np.allclose(rows[2], rows[3], atol=1e-3)


def test_replays_copy_out_their_own_rows_through_views_made_once(engine, monkeypatch):
    """A replay's real rows are sliced from its graph's output once per row count (CudaGraphs' out_rows: a torch
    slice gives up the GIL); batches of 3 and 4 sequences each get their own rows, as eagerly."""
    runner = engine.runner
    attach_graphs(runner, monkeypatch)
    three, four = (20, 12, 8), (20, 12, 8, 5)
    for i in range(3):  # each shape's layout warmed up and captured
        runner.step(batch_of(engine, three, seed=i)).result()
        runner.step(batch_of(engine, four, seed=i)).result()
    before = dict(runner.runs)
    for lengths, seed in [(three, 3), (four, 4), (three, 5), (four, 6)]:
        got = runner.step(batch_of(engine, lengths, seed=seed)).result()
        want = runner.step(batch_of(engine, lengths, seed=seed), use_graphs=False).result()
        assert got.shape == (len(lengths), runner.dimensions) and np.allclose(got, want, atol=1e-5)
    assert [how for how in hows(runner, before) if how != "eager"] == ["replay"] * 4
    views = {key: view for entry in runner.graphs.graphs.values() for key, view in entry.views.items()}
    assert sorted(views) == [(3, runner.dimensions), (4, runner.dimensions)], "one view per row count"
    for entry in runner.graphs.graphs.values():  # a later replay of that row count copies out of the same view
        for (rows, dims), view in entry.views.items():
            assert entry.out_rows(rows, dims) is view
