"""Whole-model CUDA graphs: bucket choice, probes and manifests on any machine; capture, replay and
verification on a GPU (marked `gpu`, run on the H200)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rose.buckets import DEFAULT_SEQ_BUCKETS, DEFAULT_TOKEN_BUCKETS, Layout, choose_layout, parse_layouts

cuda = pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs CUDA")


def test_choose_layout_picks_smallest_fitting_bucket():
    tb, sb = DEFAULT_TOKEN_BUCKETS, DEFAULT_SEQ_BUCKETS
    assert choose_layout(tb, sb, 128, 1, 1, 128) == Layout(128, 1, 1, 128)  # exact fit: no padding sequence
    assert choose_layout(tb, sb, 100, 1, 1, 100) == Layout(128, 2, 2, 128)  # padding needs its own sequence
    assert choose_layout(tb, sb, 129, 3, 3, 60) == Layout(160, 4, 4, 128)  # max_seqlen in 4x steps
    assert choose_layout(tb, sb, 40, 3, 3, 20) == Layout(64, 4, 4, 64)  # ... capped at the token bucket
    assert choose_layout(tb, sb, 600, 7, 12, 100) == Layout(640, 8, 16, 128)  # late-chunking rows
    assert choose_layout(tb, sb, 2000, 7, 7, 600) == Layout(2048, 8, 8, 2048)
    assert choose_layout(tb, sb, 15000, 100, 100, 512) == Layout(16384, 128, 128, 2048)  # padding run of 1384
    assert choose_layout(tb, sb, tb[-1] + 1, 1, 1, 1) is None  # above the largest bucket: eager
    assert choose_layout(tb, sb, 1000, sb[-1], sb[-1], 10) is None


def test_mixed_traffic_meets_few_graph_keys():
    """Every new key is a cold eager run plus a capture in serving: the stack benchmark's concurrency mix
    (lognormal documents of 16..512 tokens, 1..16 per batch) must stay within a few dozen keys."""
    rng = np.random.default_rng(0)
    keys = set()
    for _ in range(3000):
        lengths = np.clip(rng.lognormal(4.852, 0.8, int(rng.integers(1, 17))), 16, 512).astype(int)
        n = int(lengths.sum())
        keys.add(choose_layout(DEFAULT_TOKEN_BUCKETS, DEFAULT_SEQ_BUCKETS, n, len(lengths), len(lengths),
                               int(lengths.max())))
    assert len(keys) <= 80, len(keys)  # 200+ with max_seqlen on the token buckets and a row bucket


def test_default_buckets_keep_padding_small():
    edges = DEFAULT_TOKEN_BUCKETS
    worst = max(b / (a + 1) for a, b in zip(edges[:-1], edges[1:]) if a >= 128)
    assert worst <= 1.34, "bucket steps from 128 tokens up stay under 1.34x (<= 25% padding)"


def test_parse_layouts():
    assert parse_layouts("128x1, 512x1,4096x4,64") == [(128, 1), (512, 1), (4096, 4), (64, 1)]


def test_probe_batch_reproduces_the_shape():
    from rose.graphs import probe_batch

    for shape in ((128, 1, 1, 128), (512, 4, 4, 200), (4096, 16, 16, 512), (300, 3, 7, 150)):
        batch = probe_batch(shape, vocab_size=1000, pooling="mean")
        assert (batch.num_tokens, batch.num_seqs, batch.num_rows, int(batch.seq_lens.max())) == shape
        assert batch.token_ids.min() >= 1, "probes are never zeros"
    assert probe_batch((4096, 2, 2, 512), vocab_size=1000, pooling="mean") is None  # cannot fit


def test_manifest_round_trip(tmp_path):
    from rose.graphs import load_manifest

    path = tmp_path / "rose_graphs.json"
    path.write_text(json.dumps({"version": 2, "shapes": [[512, 2, 2, 300, 9], [128, 1, 1, 128, 3]]}))
    assert load_manifest(path) == [(512, 2, 2, 300), (128, 1, 1, 128)]


def test_cpu_engine_has_no_graphs(engine_for):
    engine = engine_for("bert")
    assert engine.runner.graphs is None and engine.warmup() == []
    assert engine.capture_pending() is False


def test_pending_layouts_are_the_warmed_up_uncaptured_ones_hottest_first():
    import threading
    from collections import Counter
    from types import SimpleNamespace

    from rose.graphs import CudaGraphs

    a, b, c, d = (Layout(t, 2, 2, 128) for t in (64, 96, 128, 160))
    e = Layout(192, 2, 2, 128)
    state = SimpleNamespace(_lock=threading.Lock(), capture_after=1, graphs={c: object()}, eager_only={e: "failed"},
                            seen=Counter({a: 1, b: 3, c: 5, e: 9}), substituted=Counter(),
                            examples={a: (60, 2, 2, 40), b: (90, 2, 2, 50), c: (120, 2, 2, 70), e: (180, 2, 2, 90)})
    assert CudaGraphs.pending(state) == [(90, 2, 2, 50), (60, 2, 2, 40)]  # c has its graph; d never ran; e never will
    state.capture_after = 2  # a has had one of its two eager runs: its next batch still runs eagerly
    assert CudaGraphs.pending(state) == [(90, 2, 2, 50)]
    assert d not in state.seen
    state.substituted[d], state.examples[d] = 4, (150, 2, 2, 60)  # replayed at a larger graph 4 times
    assert CudaGraphs.pending(state) == [(150, 2, 2, 60), (90, 2, 2, 50)]


# -- GPU ------------------------------------------------------------------------------------------
@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("name", ["bert", "qwen3", "pplx-qwen3"])
def test_lazy_capture_then_replay_matches_eager(name, tiny_models, tmp_path):
    from rose import Batch
    from rose.engine import Engine
    from rose.graphs import cosine_divergence

    engine = Engine.from_pretrained(tiny_models[name].path, device="cuda", prewarm=(), graph_manifest=tmp_path / "m.json")
    rng = np.random.default_rng(0)
    hows = []
    for i in range(4):  # same layout each time (40 tokens, 3 sequences, longest 20): eager, capture, replay x2
        seqs = [rng.integers(1, 200, size=n).astype(np.int32) for n in (20, 12, 8)]
        batch = Batch.from_sequences(seqs, engine.spec.pooling)
        before = dict(engine.runner.runs)
        graph_rows = engine.step(batch).result()
        eager_rows = engine.runner.step(batch, use_graphs=False).result()
        assert cosine_divergence(graph_rows, eager_rows).max() <= 1e-3
        hows += [k[1] for k, v in engine.runner.runs.items()
                 if v > before.get(k, 0) and k[0].startswith("t64s4p4m")]
    assert hows == ["eager", "capture", "replay", "replay"]
    assert engine.stats()["graphs_captured"] == 1
    engine.close()
    assert json.loads((tmp_path / "m.json").read_text())["shapes"][0][:3] == [40, 3, 3]


@pytest.mark.gpu
@cuda
def test_idle_capture_takes_the_next_batchs_capture_off_the_request_path(tiny_models):
    from rose import Batch
    from rose.engine import Engine
    from rose.graphs import cosine_divergence

    engine = Engine.from_pretrained(tiny_models["qwen3"].path, device="cuda", prewarm=(), graph_manifest=None)
    rng = np.random.default_rng(1)
    seqs = [rng.integers(1, 200, size=n).astype(np.int32) for n in (50, 30)]
    batch = Batch.from_sequences(seqs, engine.spec.pooling)
    engine.step(batch).result()  # eager: the layout's warm-up
    assert len(engine.runner.graphs.pending()) == 1
    assert engine.capture_pending() is True  # a probe of that shape is captured now, while idle
    assert engine.runner.graphs.pending() == [] and engine.capture_pending() is False
    before = dict(engine.runner.runs)
    rows = engine.step(batch).result()
    assert [k[1] for k, v in engine.runner.runs.items() if v > before.get(k, 0)] == ["replay"]
    eager = engine.runner.step(batch, use_graphs=False).result()
    assert cosine_divergence(rows, eager).max() <= 1e-3
    engine.close()


@pytest.mark.gpu
@cuda
def test_prewarm_captures_and_verifies_before_ready(tiny_models, tmp_path):
    from rose.engine import Engine

    engine = Engine.from_pretrained(tiny_models["qwen3"].path, device="cuda", prewarm=[(32, 1), (96, 4)],
                                    graph_manifest=None)
    verified = engine.warmup()
    assert [(v.layout.tokens, v.layout.seqs) for v in verified] == [(32, 1), (96, 4)]
    assert all(v.max_divergence <= 1e-3 for v in verified)
    assert engine.stats()["graphs_captured"] == 2
    engine.close()


@pytest.mark.gpu
@cuda
def test_verification_refuses_a_wrong_graph(tiny_models, monkeypatch):
    import torch

    from rose.engine import Engine
    from rose.graphs import GraphVerificationError

    engine = Engine.from_pretrained(tiny_models["bert"].path, device="cuda", prewarm=[(32, 1)], graph_manifest=None)
    real_forward = engine.runner.graphs.forward
    engine.runner.graphs.forward = lambda meta: real_forward(meta) * torch.linspace(-1, 1, engine.spec.dimensions,
                                                                                      device="cuda")
    with pytest.raises(GraphVerificationError, match="refusing to serve"):
        engine.warmup()
    engine.close()


def test_named_prewarm_sets_expand_to_shapes():
    from rose.prewarm_sets import short_document_mix_shapes, single_sequence_shapes

    singles = single_sequence_shapes(512)
    layouts = {choose_layout(DEFAULT_TOKEN_BUCKETS, DEFAULT_SEQ_BUCKETS, *s) for s in singles}
    assert len(layouts) == len(singles)  # one shape per layout
    for n in range(1, 513):  # every lone sequence up to 512 tokens finds its layout prewarmed
        assert choose_layout(DEFAULT_TOKEN_BUCKETS, DEFAULT_SEQ_BUCKETS, n, 1, 1, n) in layouts
    mix = short_document_mix_shapes(48)
    assert len(mix) == 48 and mix == short_document_mix_shapes(48)  # deterministic, hottest first
    assert all(1 <= s <= 16 and 16 * s <= t <= 512 * s and r == s for t, s, r, _ in mix)
    parsed = parse_layouts("128x1,singles:512,mix:48")
    assert parsed[0] == (128, 1) and parsed[1:] == singles + mix


def test_an_unknown_prewarm_set_is_refused_by_name():
    import pytest

    with pytest.raises(ValueError, match="bogus"):
        parse_layouts("128x1,bogus:3")
    with pytest.raises(ValueError, match="needs a count"):
        parse_layouts("mix:")
