"""A batch stepped one decoder layer at a time (rose.layer_steps, for bulk work a query may pass between
layers): the same rows as one step, another batch stepped between two layers unharmed, and the families
without per-layer forwards refused."""

from __future__ import annotations

import numpy as np
import pytest
from rose_parity import random_seqs

from rose import Batch
from rose.layer_steps import step_layers


def _stepped(runner, batch, between=None, every=False) -> tuple[np.ndarray, int]:
    steps, layers = step_layers(runner, batch), 0
    while (lazy := next(steps)) is None:
        layers += 1
        if between is not None and (every or layers == 1):  # between the first layer and the second, or each two
            between()
    return lazy.result(), layers


@pytest.mark.parametrize("name", ["qwen3", "pplx-qwen3"])
def test_stepped_layer_by_layer_the_rows_equal_one_step(name, tiny_models, engine_for):
    tiny, engine = tiny_models[name], engine_for(name)
    batch = Batch.from_sequences(random_seqs(tiny, [17, 3, 40, 9], seed=31))
    whole = engine.step(batch).result()
    rows, layers = _stepped(engine.runner, batch)
    assert layers + 1 == len(engine.runner.model.layers)  # the last step yields the rows
    np.testing.assert_allclose(rows, whole, rtol=1e-5, atol=1e-5)


def test_a_batch_stepped_between_two_layers_leaves_both_rows_right(tiny_models, engine_for):
    tiny, engine = tiny_models["qwen3"], engine_for("qwen3")
    bulk = Batch.from_sequences(random_seqs(tiny, [33, 21], seed=32))
    query = Batch.from_sequences(random_seqs(tiny, [6], seed=33))
    alone_bulk, alone_query = engine.step(bulk).result(), engine.step(query).result()
    got = {}
    rows, _ = _stepped(engine.runner, bulk, between=lambda: got.update(query=engine.step(query).result()))
    np.testing.assert_allclose(rows, alone_bulk, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got["query"], alone_query, rtol=1e-5, atol=1e-5)


def test_an_abandoned_stepping_gives_its_buffer_back(tiny_models, engine_for):
    tiny, engine = tiny_models["qwen3"], engine_for("qwen3")
    pool = engine.runner.pool
    before = pool.bytes_in_use
    steps = step_layers(engine.runner, Batch.from_sequences(random_seqs(tiny, [12], seed=34)))
    next(steps)
    assert pool.bytes_in_use > before, "the stepping holds its buffer"
    steps.close()
    assert pool.bytes_in_use == before


def test_a_family_without_per_layer_forwards_is_refused(tiny_models, engine_for):
    tiny, engine = tiny_models["bert"], engine_for("bert")
    with pytest.raises(TypeError, match="layer by layer"):
        next(step_layers(engine.runner, Batch.from_sequences(random_seqs(tiny, [5], seed=35))))


@pytest.mark.gpu
def test_on_the_gpu_a_graph_replayed_between_layers_leaves_both_rows_right(tiny_models):
    """On CUDA, with the query's graph replayed on the same stream between two bulk layers (what the lanes'
    layer stepping does): both results equal their own exact-size eager runs."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from rose.engine import Engine
    from rose.graphs import cosine_divergence

    engine = Engine.from_pretrained(tiny_models["qwen3"].path, device="cuda", prewarm=(), graph_manifest=None)
    tiny = tiny_models["qwen3"]
    bulk = Batch.from_sequences(random_seqs(tiny, [120, 100, 64], seed=36))  # the tiny model takes 128
    query = Batch.from_sequences(random_seqs(tiny, [16], seed=37))
    for _ in range(3):  # eager warm-up, capture, replay: the query's layout replays from here on
        engine.step(query).result()
    eager_bulk = engine.runner.step(bulk, use_graphs=False).result()
    eager_query = engine.runner.step(query, use_graphs=False).result()
    got = {}
    before = dict(engine.runner.runs)
    rows, _ = _stepped(engine.runner, bulk, between=lambda: got.update(query=engine.step(query)))
    query_rows = got["query"].result()
    assert float(cosine_divergence(rows, eager_bulk).max()) <= 1e-3
    assert float(cosine_divergence(query_rows, eager_query).max()) <= 1e-3
    assert [how for (label, how), n in engine.runner.runs.items() if n > before.get((label, how), 0)] \
        .count("replay") == 1, "the query between the layers was a graph replay"
    engine.close()


class _PlannedSdpa:
    """FlashInfer's contract on a CPU: plan() fixes the segmentation the next eager forwards run with (one eager
    slot), forward checks only that the planned (tokens, sequences) match (the review's counterexample)."""

    host_plan_state = True

    def __init__(self, inner) -> None:
        self.inner, self.planned = inner, None

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def plan(self, meta) -> None:
        self.planned = meta

    def prepare(self, meta, causal, window=-1):
        return None

    def forward(self, q, k, v, meta, causal, scale, state=None, window=-1):
        from rose.attention.base import AttentionBackendError

        m = self.planned
        if m is None or (m.layout.tokens, m.layout.seqs) != (meta.layout.tokens, meta.layout.seqs):
            raise AttentionBackendError("plan(meta) must run before forward")
        return self.inner.forward(q, k, v, m, causal, scale, self.inner.prepare(m, causal, window), window)


@pytest.mark.parametrize("lengths", [[6], [20, 34]], ids=["other-layout", "same-size-other-lengths"])
def test_a_backend_with_plan_state_is_planned_again_before_each_layer(lengths, tiny_models):
    from rose.engine import Engine

    tiny = tiny_models["qwen3"]
    engine = Engine.from_pretrained(tiny.path, device="cpu")
    bulk = Batch.from_sequences(random_seqs(tiny, [33, 21], seed=38))
    query = Batch.from_sequences(random_seqs(tiny, lengths, seed=39))
    alone_bulk, alone_query = engine.step(bulk).result(), engine.step(query).result()
    engine.runner.backend = _PlannedSdpa(engine.runner.backend)
    got = {}
    rows, _ = _stepped(engine.runner, bulk, between=lambda: got.update(query=engine.step(query).result()))
    np.testing.assert_allclose(rows, alone_bulk, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got["query"], alone_query, rtol=1e-5, atol=1e-5)
    engine.close()


def test_layer_chunks_cover_every_layer_in_order():
    from rose.layer_graphs import layer_chunks

    assert layer_chunks(28, 1) == [1] * 28
    assert layer_chunks(28, 3) == [3] * 9 + [1]
    assert layer_chunks(2, 4) == [2]
    with pytest.raises(ValueError):
        layer_chunks(4, 0)


def test_a_cpu_runner_has_no_layer_chains_and_steps_eagerly(tiny_models, engine_for):
    tiny, engine = tiny_models["qwen3"], engine_for("qwen3")
    assert engine.runner.layer_chains() is None
    batch = Batch.from_sequences(random_seqs(tiny, [9, 14], seed=40))
    eager, _ = _stepped_no_graphs(engine.runner, batch)
    rows, _ = _stepped(engine.runner, batch)
    np.testing.assert_allclose(rows, eager, rtol=1e-6, atol=1e-6)


def _stepped_no_graphs(runner, batch):
    steps, n = step_layers(runner, batch, graphs=False), 0
    while (lazy := next(steps)) is None:
        n += 1
    return lazy.result(), n


@pytest.mark.gpu
@pytest.mark.parametrize("layers_per_graph", [1, 2])
def test_on_the_gpu_chains_of_layer_graphs_replay_right_with_a_query_between(layers_per_graph, tmp_path):
    """A bulk layout stepped three times: eager at its bucket layout, then its chain captured and checked a step
    at a time with the query's whole-model graph replayed between every two steps, then replayed with the query
    between two of the chain's graphs; all rows equal their eager runs, and the chain (its own pool) is not
    disturbed by the query's graph. Five layers: with two a graph the chain is 2 + 2 + 1."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from rose_tiny_models import build_qwen3

    from rose.engine import Engine
    from rose.graphs import cosine_divergence

    tiny = build_qwen3(tmp_path, overrides={"num_hidden_layers": 5})
    engine = Engine.from_pretrained(tiny.path, device="cuda", prewarm=(), graph_manifest=None)
    runner = engine.runner
    runner.layers_per_graph = layers_per_graph
    bulk = Batch.from_sequences(random_seqs(tiny, [120, 100, 64], seed=41))
    query = Batch.from_sequences(random_seqs(tiny, [16], seed=42))
    for _ in range(3):
        engine.step(query).result()
    eager_bulk = runner.step(bulk, use_graphs=False).result()
    eager_query = runner.step(query, use_graphs=False).result()
    rows, _ = _stepped(runner, bulk)  # the bucket layout's eager warm-up
    assert float(cosine_divergence(rows, eager_bulk).max()) <= 1e-3
    # Then the chain's capture and check, a step at a time, with the query's graph replayed between every two
    # steps: the eager run's layers (on the side stream), each graph's capture, the new chain's replays.
    queries = []
    rows, steps = _stepped(runner, bulk, between=lambda: queries.append(engine.step(query)), every=True)
    chains = runner.layer_chains()
    assert len(chains.chains) == 1 and not chains.eager_only, chains.eager_only
    assert steps == 5 - 1 + 2 * len(chains.chunks) - 1, steps
    assert float(cosine_divergence(rows, eager_bulk).max()) <= 1e-3
    for lazy in queries:
        assert float(cosine_divergence(lazy.result(), eager_query).max()) <= 1e-3
    got = {}
    rows, steps = _stepped(runner, bulk, between=lambda: got.update(query=engine.step(query)))
    assert steps + 1 == len(chains.chunks) == (5 if layers_per_graph == 1 else 3)
    assert float(cosine_divergence(rows, eager_bulk).max()) <= 1e-3
    assert float(cosine_divergence(got["query"].result(), eager_query).max()) <= 1e-3
    hows = {how for (_, how) in runner.runs}
    assert {"layers", "layers-capture"} <= hows, hows
    # A second batch stepped while the first is mid-chain (interleaved by this thread) runs eagerly: the chains
    # share one pool, so no two may be mid-stepping at once. Both rows stay right.
    other = Batch.from_sequences(random_seqs(tiny, [50, 30], seed=43))
    eager_other = runner.step(other, use_graphs=False).result()
    for _ in range(2):
        _stepped(runner, other)  # its layout's chain captured: it would replay, were the lock free
    got, before = {}, dict(runner.runs)
    rows, _ = _stepped(runner, bulk, between=lambda: got.update(other=_stepped(runner, other)[0]))
    assert float(cosine_divergence(rows, eager_bulk).max()) <= 1e-3
    assert float(cosine_divergence(got["other"], eager_other).max()) <= 1e-3
    grew = {key for key, n in runner.runs.items() if n > before.get(key, 0)}
    assert {how for _, how in grew} == {"layers", "eager"}, grew  # bulk replayed its chain, the other ran eagerly
    assert len(chains.chains) == 2
    engine.close()


def test_the_chains_lock_is_let_go_before_the_rows_and_by_an_abandoned_stepping(tiny_models, engine_for):
    """rose.layer_graphs.LayerGraphs.steps with a stand-in chain (capturing needs CUDA): the lock that keeps one
    batch at a time in the chains' shared pool is free once the rows are yielded, though the generator is still
    referenced (an exception kept in a traceback must not hold it), and when a stepping is abandoned; a batch
    stepped while another holds it runs eagerly."""
    import threading
    from collections import Counter

    import torch

    from rose.layer_graphs import LayerGraphs

    tiny, engine = tiny_models["qwen3"], engine_for("qwen3")
    runner = engine.runner
    host = runner.pack(Batch.from_sequences(random_seqs(tiny, [9, 5], seed=44)))
    staged = runner._stage(host, None)
    chains = object.__new__(LayerGraphs)
    chains.runner, chains.seen, chains.eager_only, chains.full = runner, Counter(), {}, 0
    chains.capture_after, chains.max_chains, chains._stepping, chains.examples = 1, 16, threading.Lock(), {}
    rows = torch.zeros(2, runner.dimensions)
    chains.chains = {host.layout: "a chain"}
    chains._replay = lambda chain, h, s: iter([None, None, rows])
    whole = chains.steps(host, staged)
    assert next(whole) is None and chains._stepping.locked()
    assert next(whole) is None
    assert next(whole) == (rows, "layers") and not chains._stepping.locked()
    abandoned = chains.steps(host, staged)
    next(abandoned)
    assert chains._stepping.locked()
    abandoned.close()
    assert not chains._stepping.locked()
    first = chains.steps(host, staged)
    next(first)
    second = list(chains.steps(host, staged))
    assert second[-1][1] == "eager" and len(second) == len(runner.model.layers)
    first.close()
    assert not chains._stepping.locked()


def test_on_a_gpu_layer_steps_is_0_where_the_layers_would_run_eagerly(tiny_models, engine_for, monkeypatch):
    """Engine.layer_steps, which turns Tulip's stepping by layers on: a CPU steps its layers; a GPU only through
    chains (no whole-model graphs, or a backend with host plan state such as FlashInfer: 0, the express lane)."""
    from types import SimpleNamespace

    from rose.runner import ModelRunner

    assert engine_for("bert").layer_steps == 0  # no per-layer forwards
    engine = engine_for("qwen3")
    runner = engine.runner
    assert engine.layer_steps == len(runner.model.layers)  # a CPU
    monkeypatch.setattr(ModelRunner, "on_cuda", property(lambda self: True))
    assert engine.layer_steps == 0  # no graphs: no chains
    runner._layer_graphs = SimpleNamespace(chunks=[1, 1, 1])
    monkeypatch.setattr(runner, "graphs", object())
    assert engine.layer_steps == 3
    monkeypatch.setattr(runner, "backend", SimpleNamespace(host_plan_state=True))
    assert engine.layer_steps == 0
    runner._layer_graphs = None


@pytest.mark.parametrize("check", ["kept", "refused"])
def test_a_chain_is_captured_a_step_at_a_time_and_a_refused_one_serves_the_eager_run(check, tiny_models, engine_for):
    """rose.layer_graphs.LayerGraphs.steps for a layout whose chain is due, with stand-ins for the CUDA parts (the
    side stream, the captures, the replays): the eager run a layer a step, then one step per graph captured, then
    the replay a graph a step; the chain is kept when its rows pass the check. A chain whose rows fail it is
    refused, and the batch gets the eager run's rows without running it again."""
    import threading
    from collections import Counter

    import torch

    from rose.layer_graphs import LayerGraphs

    tiny, engine = tiny_models["qwen3"], engine_for("qwen3")
    runner = engine.runner
    host = runner.pack(Batch.from_sequences(random_seqs(tiny, [9, 5], seed=45)))
    staged = runner._stage(host, None)
    eager = runner.eager(host, staged)
    chains = object.__new__(LayerGraphs)
    chains.runner, chains.seen, chains.eager_only, chains.full, chains.chains = runner, Counter(), {}, 0, {}
    chains.capture_after, chains.max_chains, chains._stepping = 0, 16, threading.Lock()
    chains.examples, chains.divergence, chains.captures, chains.chunks = {}, {}, 0, [1] * len(runner.model.layers)
    chains.refused = set()
    chains._on_side = lambda steps: steps
    captured = []

    def capture(h, s):
        for _ in chains.chunks:
            captured.append(len(captured))
            yield None
        return "a chain"

    rows = eager.clone() if check == "kept" else -eager
    chains._capture = capture
    chains.pool, chains._fresh_pool = "the pool", lambda: "a fresh pool"
    chains._replay = lambda chain, h, s: iter([None] * (len(chains.chunks) - 1) + [rows])
    steps = list(chains.steps(host, staged))
    layers = len(runner.model.layers)
    assert steps[:-1] == [None] * (layers - 1 + 2 * len(chains.chunks) - 1) and captured == list(range(layers))
    got, how = steps[-1]
    assert not chains._stepping.locked()
    if check == "kept":
        assert how == "layers-capture" and got is rows and chains.chains == {host.layout: "a chain"}
        assert chains.captures == 1 and chains.pool == "the pool"
    else:
        assert how == "eager" and host.layout in chains.eager_only and not chains.chains
        torch.testing.assert_close(got, eager)
        # the dropped chain was the pool's only user: a pool nobody uses may not be captured into again
        assert chains.pool == "a fresh pool"


def test_the_layouts_stepped_by_layers_go_to_the_manifest_and_come_back_as_probes(tiny_models, engine_for, tmp_path):
    """LayerGraphs records a real shape per layout stepped (stand-in chains on a CPU); the graph manifest keeps
    them beside the whole-model shapes ("chains"), hottest first, and a probe batch of each has that shape, so
    the next start's prewarm (rose.warmup.prewarm_chains) captures the same layout."""
    import threading
    from collections import Counter

    from rose.graph_checks import load_manifest, probe_batch
    from rose.graphs import CudaGraphs
    from rose.layer_graphs import LayerGraphs

    tiny, engine = tiny_models["qwen3"], engine_for("qwen3")
    runner = engine.runner
    chains = object.__new__(LayerGraphs)
    chains.runner, chains.seen, chains.eager_only, chains.full, chains.chains = runner, Counter(), {}, 0, {}
    chains.examples, chains.capture_after, chains.max_chains, chains._stepping = {}, 9, 16, threading.Lock()
    batches = [Batch.from_sequences(random_seqs(tiny, lengths, seed=46)) for lengths in ([30, 12, 9], [7])]
    for batch in (batches[0], batches[1], batches[0]):
        list(chains.steps(runner.pack(batch), runner._stage(runner.pack(batch), None)))
    assert chains.manifest_rows() == [[51, 3, 3, 30, 2], [7, 1, 1, 7, 1]]
    graphs = object.__new__(CudaGraphs)
    graphs.seen, graphs.substituted, graphs.examples = Counter(), Counter(), {}
    graphs.save_manifest(tmp_path / "m.json", chains.manifest_rows())
    assert load_manifest(tmp_path / "m.json") == []
    shapes = load_manifest(tmp_path / "m.json", "chains")
    assert shapes == [(51, 3, 3, 30), (7, 1, 1, 7)]
    for shape in shapes:
        probe = probe_batch(shape, runner.vocab_size, "mean")
        assert (probe.num_tokens, probe.num_seqs, probe.num_rows, int(probe.seq_lens.max())) == shape


@pytest.mark.gpu
def test_on_the_gpu_a_restart_prewarms_the_chains_its_manifest_names(tmp_path):
    """An engine that stepped a bulk layout by layers writes it to its graph manifest at close; the next engine on
    that manifest captures and checks the layout's chain in warmup(), so its first bulk batch replays the chain."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from rose_tiny_models import build_qwen3

    from rose.engine import Engine
    from rose.graphs import cosine_divergence

    tiny = build_qwen3(tmp_path, overrides={"num_hidden_layers": 3})
    manifest = tmp_path / "rose_graphs.json"
    bulk = Batch.from_sequences(random_seqs(tiny, [120, 100, 64], seed=47))
    with Engine.from_pretrained(tiny.path, device="cuda", prewarm=(), graph_manifest=manifest) as engine:
        engine.warmup()
        for _ in range(2):
            _stepped(engine.runner, bulk)
        eager_bulk = engine.runner.step(bulk, use_graphs=False).result()
    with Engine.from_pretrained(tiny.path, device="cuda", prewarm=(), graph_manifest=manifest) as engine:
        engine.prewarm_layer_chains = True  # as Tulip sets it when it steps bulk by layers
        verified = engine.warmup()
        chains = engine.runner.layer_chains()
        assert len(chains.chains) == 1 and any(v.layout in chains.chains for v in verified)
        before = dict(engine.runner.runs)
        rows, _ = _stepped(engine.runner, bulk)
        grew = {key[1] for key, n in engine.runner.runs.items() if n > before.get(key, 0)}
        assert grew == {"layers"}, grew
        assert float(cosine_divergence(rows, eager_bulk).max()) <= 1e-3


def test_the_chains_prewarm_steps_each_layout_a_bounded_number_of_times(tiny_models, engine_for, tmp_path,
                                                                        monkeypatch):
    """rose.warmup.prewarm_chains with stand-in chains whose lock another stepping holds (so nothing is captured):
    each manifest layout is stepped capture_after + 1 times, eagerly, and skipped; the prewarm ends."""
    import json
    import threading
    from collections import Counter

    from rose.layer_graphs import LayerGraphs
    from rose.warmup import prewarm_chains

    engine = engine_for("qwen3")
    runner = engine.runner
    chains = object.__new__(LayerGraphs)
    chains.runner, chains.seen, chains.eager_only, chains.full, chains.chains = runner, Counter(), {}, 0, {}
    chains.capture_after, chains.max_chains, chains._stepping, chains.examples = 1, 16, threading.Lock(), {}
    chains.refused, chains.chunks = set(), [1] * len(runner.model.layers)
    chains.layout_for = lambda t, s, p, m: runner.pack(Batch.from_sequences([[5] * (t // s)] * s)).layout
    chains._stepping.acquire()  # held: every stepping runs eagerly
    monkeypatch.setattr(runner, "layer_chains", lambda: chains)
    stepped, steps = [], chains.steps
    chains.steps = lambda host, staged: (stepped.append(host.layout), steps(host, staged))[1]
    manifest = tmp_path / "m.json"
    manifest.write_text(json.dumps({"version": 2, "shapes": [], "chains": [[24, 3, 3, 8, 5], [10, 1, 1, 10, 2]]}))
    assert prewarm_chains(runner, manifest, "mean") == []
    assert len(stepped) == 4 and len(set(stepped)) == 2  # capture_after + 1 steppings each, then skipped
    assert not chains.chains and not any(chains.seen.values())  # the probes are not counted as traffic
    assert chains.manifest_rows() == []
    manifest.write_text("[1, 2]")  # readable JSON, not a manifest
    assert prewarm_chains(runner, manifest, "mean") == []
