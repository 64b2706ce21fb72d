"""Folded norms on and off (ROSE_FOLD_NORMS), side by side in one process: the decoder's pre-norm weights in
the projections after them, the residual adds in the o and down GEMMs (rose.layers.fused, "Folded norms").

    python -m benchmarks.folded_norms_ab [--models qwen3-0.6b] [--rounds 3] [--iters 40] [--json FILE]

Random bf16 weights of the real config (benchmarks.model_zoo). Two engines (CUDA graphs, default attention)
from the same folder, one folded, one not; their outputs compared (1 - cosine, each suite), the kernels of one
bs1-128 step counted with torch.profiler, then the suites timed host to host (token ids in, the embedding on
the host out), the two engines alternating `--rounds` times; the median of the rounds' p50s is reported.
Prints a table last.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path

import numpy as np
import torch

from benchmarks import gpu_env
from benchmarks.model_zoo import make_folder
from benchmarks.rose_gpu import docs_100, make_ids, percentiles, time_serial

SUITES = {"bs1-128": [128], "bs1-512": [512], "bs1-4096": [4096], "score-50x512": [512] * 50}


def load(model_dir: Path, fold: bool):
    from rose import Batch, Engine

    os.environ["ROSE_FOLD_NORMS"] = "1" if fold else "0"
    engine = Engine.from_pretrained(model_dir, device="cuda", dtype="bfloat16", pinned_cap_bytes=1 << 30,
                                    graph_manifest=None)
    assert engine.runner.model.folded is fold, "ROSE_FOLD_NORMS was not read at load"
    engine.warmup()

    def run(seqs):
        return engine.step(Batch.from_sequences(seqs, engine.spec.pooling)).result()

    return engine, run


def kernels_per_step(run, seqs) -> tuple[int, float]:
    """CUDA kernels of one step and their summed GPU time (µs), graph replays included."""
    from torch.profiler import ProfilerActivity, profile

    run(seqs)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run(seqs)
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
               and not e.name.startswith(("Memcpy", "Memset"))]
    return len(kernels), sum(e.device_time for e in kernels)


def divergence(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64), b.astype(np.float64)
    cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    return float((1 - cos).max())


def bench(name: str, root: Path, rounds: int, iters: int, records: list) -> None:
    model_dir = make_folder(name, root / name, "bfloat16")
    suites = dict(SUITES, **{"docs-100": docs_100(512)})
    inputs = {k: [make_ids(v, seed) for seed in range(4)] for k, v in suites.items()}
    engines = {"unfolded": load(model_dir, False), "folded": load(model_dir, True)}
    facts: dict[str, dict] = {v: {} for v in engines}
    for variant, (_, run) in engines.items():
        n, us = kernels_per_step(run, inputs["bs1-128"][0])
        facts[variant] = {"kernels_bs1_128": n, "kernel_us_bs1_128": round(us, 1)}
        print(f"  {name} {variant}: {n} kernels, {us:.0f} us of kernels in a bs1-128 step", flush=True)
    div = {s: divergence(engines["folded"][1](b[0]), engines["unfolded"][1](b[0])) for s, b in inputs.items()}
    print(f"  {name} 1 - cos, folded vs unfolded: " + ", ".join(f"{s} {d:.1e}" for s, d in div.items()), flush=True)
    p50s: dict[tuple[str, str], list[float]] = {}
    p99s: dict[tuple[str, str], list[float]] = {}
    for _ in range(rounds):
        for variant, (_, run) in engines.items():
            for suite, batches in inputs.items():
                p50, p99 = percentiles(time_serial(run, batches, iters, 3))
                p50s.setdefault((variant, suite), []).append(p50)
                p99s.setdefault((variant, suite), []).append(p99)
    for (variant, suite), values in p50s.items():
        p50 = statistics.median(values)
        records.append({"model": name, "variant": variant, "suite": suite, "p50_ms": round(p50, 4),
                        "p50_ms_rounds": [round(v, 4) for v in values],
                        "p99_ms": round(statistics.median(p99s[(variant, suite)]), 4),
                        "tokens_per_s": round(sum(suites[suite]) / (p50 / 1e3), 1),
                        "divergence_vs_unfolded": div[suite] if variant == "folded" else 0.0, **facts[variant]})
    for engine, _ in engines.values():
        engine.close()
    torch.cuda.empty_cache()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="qwen3-0.6b")
    parser.add_argument("--root", type=Path, default=Path("/tmp/rose-models"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--iters", type=int, default=40)
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    records: list[dict] = []
    env = gpu_env.collect()
    for name in args.models.split(","):
        bench(name, args.root, args.rounds, args.iters, records)
        if args.json:  # after each model: a run stopped later keeps what finished
            Path(args.json).write_text(json.dumps({"env": env, "records": records}, indent=1))
    print(f"{'model':11s} {'suite':13s} {'unfolded p50':>12s} {'folded p50':>11s} {'change':>8s} "
          f"{'rounds (folded)':>26s} {'1-cos':>8s} {'kernels':>9s}")
    by = {(r["model"], r["suite"], r["variant"]): r for r in records}
    for (model, suite, variant), r in by.items():
        if variant != "folded":
            continue
        base = by[(model, suite, "unfolded")]
        change = r["p50_ms"] / base["p50_ms"] - 1
        rounds = "/".join(f"{v:.3f}" for v in r["p50_ms_rounds"])
        print(f"{model:11s} {suite:13s} {base['p50_ms']:12.3f} {r['p50_ms']:11.3f} {change:+8.1%} {rounds:>26s} "
              f"{r['divergence_vs_unfolded']:8.1e} {base['kernels_bs1_128']:>4d}>{r['kernels_bs1_128']:<4d}")


if __name__ == "__main__":
    main()
