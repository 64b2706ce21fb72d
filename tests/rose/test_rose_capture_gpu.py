"""A capture on a real device neither waits for the work already queued there nor empties the allocator's
cache (torch.cuda.graph's context manager does both: benchmarks/NOTES.md, "Capture cost").

    pytest -m gpu tests/rose/test_rose_capture_gpu.py
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from rose import Batch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_a_capture_does_not_synchronize_the_device_or_empty_the_cache(tiny_models):
    from rose.engine import Engine

    engine = Engine.from_pretrained(tiny_models["qwen3"].path, device="cuda", prewarm=(), graph_manifest=None)
    runner, graphs = engine.runner, engine.runner.graphs
    rng = np.random.default_rng(0)
    batch = Batch.from_sequences([rng.integers(1, 200, size=n).astype(np.int32) for n in (30, 9)],
                                 engine.spec.pooling)
    engine.warmup()  # as a replica starts: every Triton variant compiled and loaded (a module load syncs)
    runner.step(batch).result()  # the layout's eager warm-up: its next batch captures
    host = runner.pack(batch, runner._layout(graphs, batch))
    staged = torch.from_numpy(host.packed).pin_memory()
    with torch.inference_mode(), torch.cuda.device(runner.device):
        spare = torch.empty(256 << 20, dtype=torch.uint8, device=runner.device)
        del spare  # 256 MiB back in the allocator's cache, not in the driver's
        reserved = torch.cuda.memory_reserved(runner.device)
        torch.cuda._sleep(int(2e9))  # ~1 s of device time queued ahead of the capture
        t0 = time.perf_counter()
        entry = graphs._capture(host.layout, host, staged)
        host_s = time.perf_counter() - t0
        busy = not torch.cuda.current_stream(runner.device).query()
    assert busy and host_s < 0.5, f"the capture took {host_s:.3f} s of host time: it waited for the device"
    assert torch.cuda.memory_reserved(runner.device) >= reserved, "the capture emptied the allocator's cache"
    torch.cuda.synchronize()
    with torch.inference_mode():  # the graph's buffers are inference tensors, as in serving
        entry.static_in.copy_(torch.from_numpy(host.packed).to(runner.device))
        entry.graph.replay()
        replayed = entry.static_out[: host.num_rows].float().cpu().numpy()
    eager = runner.step(batch, use_graphs=False).result()
    cos = (replayed * eager).sum(1) / np.linalg.norm(replayed, axis=1) / np.linalg.norm(eager, axis=1)
    assert float(cos.min()) > 0.999


def test_a_batch_without_its_graph_replays_a_larger_captured_one_with_its_own_rows(tiny_models):
    from rose.engine import Engine
    from rose.graphs import layout_label

    engine = Engine.from_pretrained(tiny_models["qwen3"].path, device="cuda", prewarm=((128, 2),), graph_manifest=None)
    engine.warmup()
    runner, graphs = engine.runner, engine.runner.graphs
    (captured,) = graphs.graphs
    rng = np.random.default_rng(1)
    batch = Batch.from_sequences([rng.integers(1, 200, size=80).astype(np.int32)], engine.spec.pooling)
    own = graphs.layout_for(80, 1, 1, 80)
    assert own != captured and own not in graphs.graphs
    before = dict(runner.runs)
    rows = engine.step(batch).result()
    assert runner.runs[(layout_label(captured), "replay")] == before.get((layout_label(captured), "replay"), 0) + 1
    assert graphs.substituted[own] == 1 and own not in graphs.graphs
    eager = runner.step(batch, use_graphs=False).result()
    cos = (rows * eager).sum(1) / np.linalg.norm(rows, axis=1) / np.linalg.norm(eager, axis=1)
    assert float(cos.min()) > 0.999
