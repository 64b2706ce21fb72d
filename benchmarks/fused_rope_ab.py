"""The decoder's QK step inside the attention kernel, or in its own kernel before it, side by side in one process.

    python -m benchmarks.fused_rope_ab [--models qwen3-0.6b] [--rounds 3] [--iters 40] [--json FILE]

Random bf16 weights of the real config (benchmarks.model_zoo). Two engines (CUDA graphs, attention `triton`) from
the same folder: `qk-apart` (`rope_max_bound` 0: rose.layers.fused's QK-norm+RoPE kernel, then the attention kernel)
and `qk-inside` (every bound: the attention kernel normalizes and rotates q and k as it loads them,
rose.attention.triton_varlen). Their outputs compared (1 - cosine, each suite), the kernels of one step of each
single-sequence suite counted with torch.profiler, then the suites timed host to host (token ids in, the
embedding on the host out), the two engines alternating `--rounds` times; the median of the rounds' p50s is
reported, by suite and so by the layout's max-seqlen bound (what `ROSE_ATTENTION_ROPE_MAX_BOUND` chooses by).
Prints a table last.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import numpy as np
import torch

from benchmarks import gpu_env
from benchmarks.model_zoo import make_folder
from benchmarks.rose_gpu import docs_100, make_ids, percentiles, time_serial

SUITES = {"bs1-128": [128], "bs1-512": [512], "bs1-2048": [2048], "bs1-4096": [4096], "score-50x512": [512] * 50}
BOUNDS = {"qk-apart": 0, "qk-inside": 1 << 30}


def load(model_dir: Path, bound: int):
    from rose import Batch, Engine

    engine = Engine.from_pretrained(model_dir, device="cuda", dtype="bfloat16", attention="triton",
                                    pinned_cap_bytes=1 << 30, graph_manifest=None, prewarm=())
    engine.runner.backend.rope_max_bound = bound  # before any forward: graphs capture with it
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
    engines = {variant: load(model_dir, bound) for variant, bound in BOUNDS.items()}
    facts: dict[tuple[str, str], dict] = {}
    for variant, (_, run) in engines.items():
        for suite in ("bs1-128", "bs1-512", "bs1-4096"):
            n, us = kernels_per_step(run, inputs[suite][0])
            facts[(variant, suite)] = {"kernels": n, "kernel_us": round(us, 1)}
            print(f"  {name} {variant} {suite}: {n} kernels, {us:.0f} us of kernels in a step", flush=True)
    div = {s: divergence(engines["qk-inside"][1](b[0]), engines["qk-apart"][1](b[0])) for s, b in inputs.items()}
    print(f"  {name} 1 - cos, inside vs apart: " + ", ".join(f"{s} {d:.1e}" for s, d in div.items()), flush=True)
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
                        "divergence_vs_apart": div[suite] if variant == "qk-inside" else 0.0,
                        **facts.get((variant, suite), {})})
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
    print(f"{'model':11s} {'suite':13s} {'apart p50':>10s} {'inside p50':>11s} {'change':>8s} "
          f"{'rounds (inside)':>26s} {'1-cos':>8s} {'kernels':>9s}")
    by = {(r["model"], r["suite"], r["variant"]): r for r in records}
    for (model, suite, variant), r in by.items():
        if variant != "qk-inside":
            continue
        base = by[(model, suite, "qk-apart")]
        change = r["p50_ms"] / base["p50_ms"] - 1
        rounds = "/".join(f"{v:.3f}" for v in r["p50_ms_rounds"])
        kernels = f"{base['kernels']}>{r['kernels']}" if "kernels" in r else ""
        print(f"{model:11s} {suite:13s} {base['p50_ms']:10.3f} {r['p50_ms']:11.3f} {change:+8.1%} {rounds:>26s} "
              f"{r['divergence_vs_apart']:8.1e} {kernels:>9s}")


if __name__ == "__main__":
    main()
