"""What a fresh replica's prewarm costs per graph layout, and how much of it was torch.cuda.graph's context.

    python -m benchmarks.capture_cost --out DIR [--model qwen3-0.6b] [--sets singles:512,mix:48]

Three ways to prewarm the same layouts (the default prewarm sets), each on a fresh engine of the same folder,
in one run:
- `context-eager`: the old way: each layout's eager warm-up step, then a capture inside torch.cuda.graph's
  context manager (which synchronizes the device and empties the allocator's cache at every capture);
- `raw-eager`: what ROSE does: the eager warm-up step, then rose.graphs' capture (capture_begin/capture_end
  on its side stream, no device sync, cache kept);
- `raw`: the capture at the layout's first probe, no warm-up step (measured slower: NOTES, "Capture cost").
Each then replays a second probe and checks it against eager, as the prewarm does. Reports the whole prewarm's
seconds and the median per layout. A warm-up engine runs first so the first mode does not pay CUDA's
start (but not the Triton compiles of the QK-norm+RoPE variants the mix's sizes need, which the first mode
pays: compare the per-layout medians). Writes DIR/capture_cost.json and prints a table last. `--device cpu` is refused (graphs need CUDA).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from benchmarks import gpu_env
from benchmarks.model_zoo import make_folder

MODES = ("context-eager", "raw-eager", "raw")


def context_capture(graphs, layout, host, staged):
    """rose.graphs' capture as it was, inside torch.cuda.graph (the baseline of this benchmark only)."""
    from rose.graphs import ForwardMeta, _Graph

    stream = torch.cuda.current_stream(graphs.device)
    static_in = torch.zeros(layout.words, dtype=torch.int64, device=graphs.device)
    static_in.copy_(torch.from_numpy(host.packed))
    meta = ForwardMeta.from_buffer(static_in, layout, layout.seqlen_bound, host, graph=True)
    graphs.plan(meta)
    side = torch.cuda.Stream(graphs.device)
    side.wait_stream(stream)
    with torch.cuda.stream(side):
        graphs.forward(meta)
    stream.wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=graphs.pool, capture_error_mode="thread_local"):
        static_out = graphs.forward(meta)
    return _Graph(graph, static_in, static_out, meta)


def prewarm(folder: Path, sets: str, mode: str) -> dict:
    from rose.buckets import parse_layouts
    from rose.engine import Engine
    from rose.graphs import probe_batch
    from rose.warmup import prewarm_and_verify, prewarm_shapes

    engine = Engine.from_pretrained(folder, device="cuda", prewarm=(), graph_manifest=None,
                                    persistent_decoder="off")  # the layers' graphs, as measured before its default
    runner, graphs = engine.runner, engine.runner.graphs
    if mode == "context-eager":
        graphs._capture = lambda layout, host, staged: context_capture(graphs, layout, host, staged)
    shapes = prewarm_shapes(runner, parse_layouts(sets), None)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    per_layout, warm_s = [], 0.0
    for shape in shapes:
        t1 = time.perf_counter()
        if mode.endswith("-eager"):  # the old prewarm's eager step before the capture
            batch = probe_batch(shape, runner.vocab_size, engine.spec.pooling, seed=0)
            if batch is not None and int(batch.seq_lens.max()) <= engine.spec.max_length:
                runner.step(batch).result()
        warm_s += time.perf_counter() - t1
        done = prewarm_and_verify(runner, [shape], engine.spec.pooling)
        if done:
            per_layout.append(time.perf_counter() - t1)
    total = time.perf_counter() - t0
    engine.close()
    del engine
    torch.cuda.empty_cache()
    return {"mode": mode, "layouts": len(per_layout), "prewarm_s": total,
            "per_layout_p50_ms": 1e3 * statistics.median(per_layout) if per_layout else None,
            "per_layout_max_ms": 1e3 * max(per_layout) if per_layout else None,
            "eager_warm_up_s": warm_s, "capture_seconds": graphs.capture_seconds}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--model", default="qwen3-0.6b")
    ap.add_argument("--sets", default="singles:512,mix:48")
    ap.add_argument("--models-dir", type=Path, default=Path("/tmp/models"))
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("capture_cost needs a CUDA GPU")
    folder = make_folder(args.model, args.models_dir / args.model)
    prewarm(folder, "128x1,512x1", "raw")  # CUDA, cuBLAS and the allocator started before any mode is timed
    rows = [prewarm(folder, args.sets, mode) for mode in MODES]
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"env": gpu_env.collect(), "model": args.model, "sets": args.sets, "rows": rows}
    (args.out / "capture_cost.json").write_text(json.dumps(result, indent=1))
    print(f"\nprewarm of {args.sets} on {args.model} ({result['env'].get('gpu')}):")
    print(f"{'mode':<15} {'layouts':>7} {'prewarm s':>10} {'per layout p50 ms':>18} {'max ms':>8} {'in _capture s':>13}")
    for r in rows:
        print(f"{r['mode']:<15} {r['layouts']:>7} {r['prewarm_s']:>10.2f} {r['per_layout_p50_ms']:>18.1f} "
              f"{r['per_layout_max_ms']:>8.1f} {r['capture_seconds']:>13.2f}")


if __name__ == "__main__":
    main()
