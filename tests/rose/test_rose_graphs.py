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
    assert choose_layout(tb, sb, 128, 1, 1) == Layout(128, 1, 1)  # exact fit: no padding pseudo-sequence
    assert choose_layout(tb, sb, 100, 1, 1) == Layout(128, 2, 1)  # padding tokens need their own sequence
    assert choose_layout(tb, sb, 129, 3, 3) == Layout(160, 4, 4)
    assert choose_layout(tb, sb, 600, 7, 12) == Layout(640, 8, 16)  # late-chunking rows bucket separately
    assert choose_layout(tb, sb, tb[-1] + 1, 1, 1) is None  # above the largest bucket: eager
    assert choose_layout(tb, sb, 1000, sb[-1], sb[-1]) is None


def test_default_buckets_keep_padding_small():
    edges = DEFAULT_TOKEN_BUCKETS
    worst = max(b / (a + 1) for a, b in zip(edges[:-1], edges[1:]) if a >= 128)
    assert worst <= 1.34, "bucket steps from 128 tokens up stay under 1.34x (<= 25% padding)"


def test_parse_layouts():
    assert parse_layouts("128x1, 512x1,4096x4,64") == [(128, 1), (512, 1), (4096, 4), (64, 1)]


def test_probe_sequences_fill_layout_within_max_length():
    from rose.graphs import probe_sequences
    from rose.meta import MetaLayout

    for layout in (MetaLayout(128, 1, 1), MetaLayout(512, 4, 4), MetaLayout(4096, 16, 16)):
        seqs = probe_sequences(layout, vocab_size=1000, max_length=512)
        assert sum(len(s) for s in seqs) == layout.tokens
        assert all(1 <= len(s) <= 512 for s in seqs) and len(seqs) <= layout.seqs
        assert all(s.min() >= 1 for s in seqs), "probes are never all zeros"
    assert probe_sequences(MetaLayout(4096, 2, 2), vocab_size=1000, max_length=512) is None


def test_manifest_round_trip(tmp_path):
    from rose.graphs import load_manifest
    from rose.meta import MetaLayout

    path = tmp_path / "rose_graphs.json"
    path.write_text(json.dumps({"version": 1, "layouts": [[512, 2, 1, 9], [128, 1, 1, 3]]}))
    assert load_manifest(path) == [MetaLayout(512, 2, 1), MetaLayout(128, 1, 1)]


def test_cpu_engine_has_no_graphs(engine_for):
    engine = engine_for("bert")
    assert engine.runner.graphs is None and engine.warmup() == []


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
    for i in range(4):  # same layout each time: eager, capture, replay, replay
        seqs = [rng.integers(1, 200, size=n).astype(np.int32) for n in rng.integers(3, 20, size=3)]
        seqs[0] = np.concatenate([seqs[0], np.ones(40 - sum(len(s) for s in seqs), np.int32)])
        batch = Batch.from_sequences(seqs, engine.spec.pooling)
        before = dict(engine.runner.runs)
        graph_rows = engine.step(batch).result()
        eager_rows = engine.runner.step(batch, use_graphs=False).result()
        assert cosine_divergence(graph_rows, eager_rows).max() <= 1e-3
        hows += [k[1] for k, v in engine.runner.runs.items() if v > before.get(k, 0) and k[0] == "t64s4p4"]
    assert hows == ["eager", "capture", "replay", "replay"]
    assert engine.stats()["graphs_captured"] == 1
    engine.close()
    assert json.loads((tmp_path / "m.json").read_text())["layouts"][0][:3] == [64, 4, 4]


@pytest.mark.gpu
@cuda
def test_prewarm_captures_and_verifies_before_ready(tiny_models, tmp_path):
    from rose.engine import Engine

    engine = Engine.from_pretrained(tiny_models["qwen3"].path, device="cuda", prewarm=[(128, 1), (256, 4)],
                                    graph_manifest=None)
    verified = engine.warmup()
    assert [(v.layout.tokens, v.layout.seqs) for v in verified] == [(128, 1), (256, 4)]
    assert all(v.max_divergence <= 1e-3 for v in verified)
    assert engine.stats()["graphs_captured"] == 2
    engine.close()


@pytest.mark.gpu
@cuda
def test_verification_refuses_a_wrong_graph(tiny_models, monkeypatch):
    import torch

    from rose.engine import Engine
    from rose.graphs import GraphVerificationError

    engine = Engine.from_pretrained(tiny_models["bert"].path, device="cuda", prewarm=[(128, 1)], graph_manifest=None)
    real_forward = engine.runner.graphs.forward
    engine.runner.graphs.forward = lambda meta: real_forward(meta) * torch.linspace(-1, 1, engine.spec.dimensions,
                                                                                      device="cuda")
    with pytest.raises(GraphVerificationError, match="refusing to serve"):
        engine.warmup()
    engine.close()
