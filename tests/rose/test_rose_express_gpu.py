"""The express lane on a real device (test_rose_express.py has its logic on a CPU): a high-priority stream,
graphs in a pool of their own, and rows that stay right while the bulk lane runs at the same time: two
threads step both lanes together, graph replays and captures included, and every row is checked against its
solo result (graphs of one pool would clobber each other's buffers here).

    pytest -m gpu tests/rose/test_rose_express_gpu.py
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from rose import Batch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
BAR = 1e-3


def gpu_engine(path, **kwargs):
    from rose.engine import Engine

    return Engine.from_pretrained(path, device="cuda", prewarm=((32, 1), (128, 1), (64, 2), (2048, 8)),
                                  graph_manifest=None, **kwargs)


def batch_of(lengths, seed=0):
    rng = np.random.default_rng(seed)
    return Batch.from_sequences([rng.integers(1, 200, size=n).astype(np.int32) for n in lengths], "mean")


def divergence(a, b) -> float:
    from rose.graphs import cosine_divergence

    return float(cosine_divergence(a, b).max())


SHAPES = {  # bulk batches (graph layouts, one lazily captured), express batches
    "qwen3-0.6b-shape": ([[512] * 4, [512] * 4, [512] * 4, [700, 300, 40]], [[32]] * 4 + [[50, 14], [100, 60, 3]]),
    "bert": ([[64] * 16, [64] * 16, [64] * 16, [60, 50, 40]], [[32]] * 4 + [[20, 14], [30, 20, 3]]),
}


@pytest.mark.parametrize("model", list(SHAPES))
def test_express_lane_rows_stay_right_beside_the_bulk_lane(tiny_models, tmp_path, model):
    from rose_tiny_models import build_qwen3_06b_shape

    path = build_qwen3_06b_shape(tmp_path).path if model == "qwen3-0.6b-shape" else tiny_models[model].path
    engine = gpu_engine(path, express_tokens=256)
    lane = engine.runner.express
    assert engine.express and lane is not None and lane.graphs is not None
    assert lane.stream.priority < torch.cuda.current_stream().priority
    engine.warmup()
    engine.prewarm_express()
    assert engine.stats()["express_graphs_captured"] >= 3  # 32x1, 128x1, 64x2 fit its 256 tokens; 2048x8 does not
    bulk = [batch_of(lengths, seed=s) for s, lengths in enumerate(SHAPES[model][0])]
    small = [batch_of(lengths, seed=10 + s) for s, lengths in enumerate(SHAPES[model][1])]
    solo_bulk = [engine.step(b).result() for b in bulk]
    solo_small = [engine.step(b).result() for b in small]
    errors, worst = [], [0.0, 0.0]

    def run(batches, solos, express, slot):
        try:
            for _ in range(20):
                for b, solo in zip(batches, solos):
                    worst[slot] = max(worst[slot], divergence(engine.step(b, express=express).result(), solo))
        except Exception as exc:  # noqa: BLE001 - reported by the test thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(bulk, solo_bulk, False, 0)),
               threading.Thread(target=run, args=(small, solo_small, True, 1))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not any(t.is_alive() for t in threads), "a lane hung"
    assert not errors, errors
    assert worst[0] <= BAR and worst[1] <= BAR, worst
    express_runs = {k: n for k, n in engine.runner.runs.items() if k[0].startswith("x")}
    assert sum(n for (_, how), n in express_runs.items() if how == "replay") >= 60
    stats = engine.stats()
    assert stats["captures_failed"] == stats["graphs_refused"] == 0
    assert stats["express_captures_failed"] == stats["express_graphs_refused"] == 0
    late = small[-1]  # not prewarmed: the express lane captured it while the bulk lane ran
    layout = lane.graphs.layout_for(late.num_tokens, late.num_seqs, late.num_rows, int(late.seq_lens.max()))
    assert layout in lane.graphs.graphs, "the lazily captured express layout has a graph"
    engine.close()
