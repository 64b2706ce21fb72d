"""Idle capture, best case, in-process: mixed batches (the stack benchmark's concurrency mix: 1-16
lognormal documents of 16-512 tokens) through one engine, lazily (captures on the path) vs with
`Engine.capture_pending()` called between batches (as Tulip's idle worker would, untimed).

    python -m benchmarks.idle_capture_sim --model-dir DIR [--batches 300] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np


def mix(count: int, seed: int = 0) -> list[list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        lengths = np.clip(rng.lognormal(4.852, 0.8, int(rng.integers(1, 17))), 16, 512).astype(int)
        out.append([rng.integers(1, 1000, size=n).astype(np.int32) for n in lengths])
    return out


def run(model_dir: str, batches: list, idle_capture: bool) -> dict:
    from rose import Batch, Engine

    engine = Engine.from_pretrained(model_dir, device="cuda", dtype="bfloat16", prewarm=(), graph_manifest=None)
    engine.warmup()
    lat, captured = [], 0
    for seqs in batches:
        t0 = time.perf_counter()
        engine.step(Batch.from_sequences(seqs, engine.spec.pooling)).result()
        lat.append((time.perf_counter() - t0) * 1e3)
        if idle_capture:
            while engine.capture_pending():
                captured += 1
    runs = {}
    for (_, how), n in engine.runner.runs.items():
        runs[how] = runs.get(how, 0) + n
    engine.close()
    a = np.array(lat)
    return {"idle_capture": idle_capture, "p50_ms": float(np.percentile(a, 50)), "p99_ms": float(np.percentile(a, 99)),
            "mean_ms": float(a.mean()), "max_ms": float(a.max()), "idle_captures": captured, "runs": runs}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--batches", type=int, default=300)
    parser.add_argument("--json", default="")
    parser.add_argument("--idle-first", action="store_true", help="run the idle-capture variant first")
    args = parser.parse_args()
    batches = mix(args.batches)
    rows = [run(args.model_dir, batches, flag) for flag in ((True, False) if args.idle_first else (False, True))]
    for r in rows:
        print(json.dumps(r))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
