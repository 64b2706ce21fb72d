"""`python -m benchmarks.express_inprocess`: a query's latency beside bulk batches, in-process (no harness).

    python -m benchmarks.express_inprocess --model-dir DIR [--out OUT] [--seconds 8]

What the lanes run measures through the stack (benchmarks/stack/lanes.py), without HTTP, Ivy, gRPC or
Tulip: one thread keeps two `--bulk-docs` x `--doc-tokens` batches in flight on the main lane (graph
replays, as Tulip's worker does), another steps single `--query-tokens` queries one after another. Variants,
each for `--seconds`: `alone` (queries only), `main` (queries on the main lane beside bulk: they queue behind
it on one stream), `express` (queries on the express lane: rose/express.py), and `bulk-alone` (bulk only, its
tokens/s the reference for what the queries cost it). So the part of the lanes run's interactive latency
that the GPU sets is told apart from the harness's. Writes OUT/express_inprocess.json; prints a table last.
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


def run_variant(engine, name: str, seconds: float, bulk, query) -> dict:
    stop = threading.Event()
    bulk_tokens = [0]

    def bulk_loop() -> None:
        inflight: deque = deque()
        while not stop.is_set():
            inflight.append(engine.step(bulk))
            if len(inflight) >= 2:
                inflight.popleft().result()
                bulk_tokens[0] += bulk.num_tokens
        while inflight:
            inflight.popleft().result()

    with_bulk, with_queries = name != "alone", name != "bulk-alone"
    thread = threading.Thread(target=bulk_loop, daemon=True) if with_bulk else None
    if thread:
        thread.start()
        time.sleep(0.5)  # bulk at its steady state before the first query
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
    args = parser.parse_args(argv)
    from rose.engine import Engine

    bulk_shape = (args.bulk_docs * args.doc_tokens, args.bulk_docs)
    engine = Engine.from_pretrained(args.model_dir, device=args.device, graph_manifest=None,
                                    prewarm=((args.query_tokens, 1), bulk_shape), express_tokens=args.express_tokens)
    engine.warmup()
    engine.prewarm_express()
    vocab = engine.runner.vocab_size
    bulk, query = batch(args.bulk_docs, args.doc_tokens, 0, vocab), batch(1, args.query_tokens, 1, vocab)
    variants = ["alone", "bulk-alone", "main"] + (["express"] if engine.express else [])
    for name in variants:  # untimed pass: every layout of every variant is captured before timing
        run_variant(engine, name, 0.3, bulk, query)
    records = [run_variant(engine, name, args.seconds, bulk, query) for name in variants]
    env = {**collect(), "config": {k: str(v) for k, v in vars(args).items()}}
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "express_inprocess.json").write_text(json.dumps({"env": env, "records": records}, indent=2))
    print(f"{'variant':11s} {'queries':>7s} {'p50 ms':>8s} {'p99 ms':>8s} {'bulk k tok/s':>13s}")
    for r in records:
        print(f"{r['variant']:11s} {r['queries']:7d} {r['p50_ms']:8.2f} {r['p99_ms']:8.2f} "
              f"{r['bulk_tokens_per_s'] / 1e3:13.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
