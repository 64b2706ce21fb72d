"""ROSE's host time per step, phase by phase: what the CPU does inside `engine.step()` before the GPU has
its work, beside the GPU's own time for the same replay. Run on the GPU machine:

    python -m benchmarks.step_host --model-dir /tmp/m/qwen3-0.6b [--iters 400] [--json FILE]

For each batch shape (1 x 128, 1 x 512, 8 x 128, 16 lognormal documents) it captures the layout's graph, then
times, median and p90 in microseconds over `--iters` steps, the phases ModelRunner.step() runs in order
(rose/runner.py, "the steps of step()"): the graph layout, pack_batch, the pinned buffer, the copy into it,
the dispatch (static input copy, plan, graph replay), the copy back and its event, the count, the LazyTensor;
then `step()` itself, and host to host (`step()` + `wait()`). `replay` is `graph.replay()` alone (its host
launch cost), `gpu` the device time of that replay from CUDA events. Prints one table last.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from benchmarks import gpu_env
from rose.batch import Batch
from rose.engine import Engine
from rose.lazy import LazyTensor

PHASES = ("layout", "pack", "buffer", "stage", "dispatch", "copy_back", "count", "lazy", "step", "host_to_host",
          "replay", "gpu")


def shapes(seed: int = 0) -> dict[str, list[int]]:
    rng = np.random.default_rng(seed)
    docs = [int(x) for x in np.clip(rng.lognormal(np.log(128), 0.8, 16), 16, 512)]
    return {"1x128": [128], "1x512": [512], "8x128": [128] * 8, "16-docs": docs}


def batch_of(lengths: list[int], vocab: int, seed: int = 0) -> Batch:
    rng = np.random.default_rng(seed)
    return Batch.from_sequences([rng.integers(100, vocab - 1, n).astype(np.int32) for n in lengths], pooling="last")


def phases_once(runner, batch: Batch) -> dict[str, float]:
    """One step by ModelRunner.step()'s own phases, each timed (the main lane, graphs on)."""
    t = [time.perf_counter()]
    graphs = runner.graphs
    layout = runner._layout(graphs, batch)
    t.append(time.perf_counter())
    host = runner.pack(batch, layout)
    t.append(time.perf_counter())
    buf = runner.pool.acquire(runner._buffer_bytes(host))
    t.append(time.perf_counter())
    with runner._lock, torch.inference_mode():
        staged = runner._stage(host, buf)
        t.append(time.perf_counter())
        out, how = runner._dispatch(graphs if layout is not None else None, host, staged)
        t.append(time.perf_counter())
        event = runner._copy_back(out, host, buf)
        t.append(time.perf_counter())
        runner._count(host, layout, how)
        t.append(time.perf_counter())
    lazy = LazyTensor(runner.pool, buf, (host.num_rows, runner.dimensions), event)
    t.append(time.perf_counter())
    lazy.wait()
    lazy.release()
    assert how == "replay" or not runner.on_cuda, f"the {layout} layout did not replay ({how})"
    return dict(zip(PHASES[:8], np.diff(t) * 1e6))


def measure(engine: Engine, batch: Batch, iters: int) -> dict[str, dict[str, float]]:
    runner = engine.runner
    for _ in range(4):  # eager, capture, replays
        engine.step(batch).result()
    samples: dict[str, list[float]] = {p: [] for p in PHASES}
    for _ in range(iters):
        for name, us in phases_once(runner, batch).items():
            samples[name].append(us)
        t0 = time.perf_counter()
        lazy = engine.step(batch)
        t1 = time.perf_counter()
        lazy.wait()
        t2 = time.perf_counter()
        lazy.release()
        samples["step"].append((t1 - t0) * 1e6)
        samples["host_to_host"].append((t2 - t0) * 1e6)
    if not runner.on_cuda:  # a smoke run on a CPU: no graph to replay
        samples["replay"] = samples["gpu"] = [0.0]
        return _summary(samples)
    entry = runner.graphs.graphs[runner._layout(runner.graphs, batch)]
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(iters):
        torch.cuda.synchronize()
        start.record()
        t0 = time.perf_counter()
        entry.graph.replay()
        t1 = time.perf_counter()
        end.record()
        end.synchronize()
        samples["replay"].append((t1 - t0) * 1e6)
        samples["gpu"].append(start.elapsed_time(end) * 1e3)
    return _summary(samples)


def _summary(samples: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    return {p: {"p50_us": float(np.median(v)), "p90_us": float(np.percentile(v, 90))} for p, v in samples.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--iters", type=int, default=400)
    parser.add_argument("--json", default="")
    args = parser.parse_args(argv)
    # the layers' step, as measured before the persistent decoder's default (it is on from warmup(), never called here)
    engine = Engine.from_pretrained(args.model_dir, prewarm=(), graph_manifest=None, persistent_decoder="off")
    vocab = engine.runner.vocab_size
    longest = engine.runner.spec.max_length
    results = {name: measure(engine, batch_of([min(n, longest) for n in lengths], vocab), args.iters)
               for name, lengths in shapes().items()}
    out = {"env": gpu_env.collect(), "model_dir": args.model_dir, "iters": args.iters,
           "attention": engine.runner.backend.name if hasattr(engine.runner.backend, "name") else None,
           "results": results}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    print(f"{'phase':14s}" + "".join(f"{name:>18s}" for name in results))
    for phase in PHASES:
        print(f"{phase:14s}" + "".join(f"{r[phase]['p50_us']:9.1f} ({r[phase]['p90_us']:6.1f})" for r in results.values()))
    print("microseconds, p50 (p90); step = the phases together through engine.step(); gpu = one replay's device time")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
