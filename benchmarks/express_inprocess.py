"""`python -m benchmarks.express_inprocess`: a query's latency beside bulk batches, in-process (no harness).

    python -m benchmarks.express_inprocess --model-dir DIR [--out OUT] [--seconds 8]

What the lanes run measures through the stack (benchmarks/stack/lanes.py), without HTTP, Ivy, gRPC or
Tulip: one thread keeps two `--bulk-docs` x `--doc-tokens` batches in flight on the main lane (graph
replays, as Tulip's worker does), another steps single `--query-tokens` queries one after another. Variants,
each for `--seconds`: `alone` (queries only), `main` (queries on the main lane beside bulk: they queue behind
it on one stream), `express` (queries on the express lane: rose/express.py), `bulk-alone` (bulk only, its
tokens/s the reference for what the queries cost it), and with `--layers` `layers` / `layers-alone`: bulk
stepped one decoder layer at a time (rose.layer_steps: replays of its layout's chain of per-layer CUDA graphs,
`--layers-per-graph` layers a graph, rose.layer_graphs), at most `--layers-ahead` steps on the stream, the
queries on the main lane passing between them; `layers-eager-alone` the same stepping run eagerly at the exact
size (what the chains replace). So the part of the lanes run's
interactive latency that the GPU sets is told apart from the harness's. Writes OUT/express_inprocess.json;
prints a table last.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from collections import deque
from pathlib import Path

import numpy as np

from benchmarks.gpu_env import collect


def batch(rows: int, tokens: int, seed: int, vocab: int):
    from rose import Batch

    rng = np.random.default_rng(seed)
    return Batch.from_sequences([rng.integers(1, vocab, size=tokens).astype(np.int32) for _ in range(rows)], "last")


def bulk_by_layers(engine, bulk, stop: threading.Event, tokens: list, ahead: int, graphs: bool = True) -> None:
    """Bulk batches stepped layer by layer as Tulip steps them (rose.layer_steps.step_paced: at most `ahead` steps
    on the stream); a batch's rows are collected once the next batch is enqueued, so the stream never runs dry
    between batches."""
    from rose.layer_steps import step_paced

    pending = None
    while not stop.is_set():
        lazy = step_paced(engine.runner, bulk, ahead, graphs=graphs)
        if pending is not None:
            pending.result()
            tokens[0] += bulk.num_tokens
        pending = lazy
    if pending is not None:
        pending.result()


def run_variant(engine, name: str, seconds: float, bulk, query, ahead: int = 2) -> dict:
    stop = threading.Event()
    bulk_tokens = [0]

    def bulk_loop() -> None:
        if name.startswith("layers"):
            return bulk_by_layers(engine, bulk, stop, bulk_tokens, ahead, graphs=not name.startswith("layers-eager"))
        inflight: deque = deque()
        while not stop.is_set():
            inflight.append(engine.step(bulk))
            if len(inflight) >= 2:
                inflight.popleft().result()
                bulk_tokens[0] += bulk.num_tokens
        while inflight:
            inflight.popleft().result()

    with_bulk, with_queries = name != "alone", not name.endswith("-alone")
    thread = threading.Thread(target=bulk_loop, daemon=True) if with_bulk else None
    if thread:
        thread.start()
        time.sleep(0.5)  # bulk at its steady state before the first query
    bulk_tokens[0] = 0  # counted from here, over the same seconds as the queries
    latencies, start = [], time.perf_counter()
    while time.perf_counter() - start < seconds:
        if not with_queries:
            time.sleep(0.05)
            continue
        t0 = time.perf_counter()
        engine.step(query, express=name == "express").result()
        latencies.append((time.perf_counter() - t0) * 1e3)
    elapsed = time.perf_counter() - start
    stop.set()
    if thread:
        thread.join()
    lat = np.array(latencies) if latencies else np.array([np.nan])
    return {"variant": name, "queries": len(latencies), "p50_ms": float(np.percentile(lat, 50)),
            "p99_ms": float(np.percentile(lat, 99)), "bulk_tokens_per_s": bulk_tokens[0] / elapsed}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--bulk-docs", type=int, default=16)
    parser.add_argument("--doc-tokens", type=int, default=512)
    parser.add_argument("--query-tokens", type=int, default=32)
    parser.add_argument("--express-tokens", type=int, default=1024)
    parser.add_argument("--device", default=None)
    parser.add_argument("--layers", action="store_true", help="also bulk stepped layer by layer (rose.layer_steps)")
    parser.add_argument("--layers-ahead", type=int, default=2, help="its layers on the stream at most")
    parser.add_argument("--layers-per-graph", type=int, default=1, help="decoder layers per graph of a chain")
    args = parser.parse_args(argv)
    if args.layers_ahead < 1:
        parser.error("--layers-ahead must be at least 1")
    from rose.engine import Engine

    bulk_shape = (args.bulk_docs * args.doc_tokens, args.bulk_docs)
    engine = Engine.from_pretrained(args.model_dir, device=args.device, graph_manifest=None,
                                    prewarm=((args.query_tokens, 1), bulk_shape), express_tokens=args.express_tokens)
    engine.runner.layers_per_graph = args.layers_per_graph  # before anything builds the chains (runner.layer_chains)
    engine.warmup()
    engine.prewarm_express()
    vocab = engine.runner.vocab_size
    bulk, query = batch(args.bulk_docs, args.doc_tokens, 0, vocab), batch(1, args.query_tokens, 1, vocab)
    variants = (["alone", "bulk-alone", "main"] + (["express"] if engine.express else [])
                + (["layers-eager-alone", "layers-alone", "layers"] if args.layers else []))
    for name in variants:  # untimed pass: every layout of every variant is captured before timing
        run_variant(engine, name, 0.3, bulk, query, args.layers_ahead)
    records = [run_variant(engine, name, args.seconds, bulk, query, args.layers_ahead) for name in variants]
    env = {**collect(), "config": {k: str(v) for k, v in vars(args).items()}}
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "express_inprocess.json").write_text(json.dumps({"env": env, "records": records}, indent=2))
    print(f"{'variant':18s} {'queries':>7s} {'p50 ms':>8s} {'p99 ms':>8s} {'bulk k tok/s':>13s}")
    for r in records:
        print(f"{r['variant']:18s} {r['queries']:7d} {r['p50_ms']:8.2f} {r['p99_ms']:8.2f} "
              f"{r['bulk_tokens_per_s'] / 1e3:13.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
