"""Where a small batch's time goes on the GPU (issue 4: "the notes say what bounds it, with the profile").

    python -m benchmarks.rose_breakdown --out DIR [--models qwen3-0.6b,minilm-l6] [--tokens 128,512,4096]

For each model and one sequence of each length, with whole-model CUDA graphs (captured first):
- host->host p50 of engine.step(...).result() (what rose_gpu reports);
- the GPU time of the same steps from the profiler's kernel and copy records (CUPTI reports the kernels
  a graph replay runs, one record each), split into GEMM / attention / norm / rope / activation / copies /
  other, with kernel counts per step;
- the idle share: host->host minus GPU busy, i.e. what the host (packing, launch, copies' latency, the
  event wait) adds;
- the weight-read floor (the bytes of every weight but the embedding tables, whose rows a forward only
  gathers, / the card's own copy rate, measured at the start: `copy_bandwidth_gbs` in the JSON) beside it.
Writes DIR/rose_breakdown.json and prints a table last. `--device cpu` smoke-tests the script.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import torch

from benchmarks import gpu_env
from benchmarks.model_zoo import make_folder

CATEGORIES = (  # first match wins; kernel names of cuBLAS/cutlass/Triton/FlashInfer/torch
    ("persistent", r"^decoder_kernel"),  # rose.layers.persistent_kernels: every layer of a small batch, one kernel
    # attention first: torch's flash kernels (pytorch_flash::flash_fwd_kernel<...cutlass::bfloat16_t...>),
    # FlashInfer's and FA4's (CuTe DSL: kernel_cutlass_kernel_flash_attn...) carry "cutlass" in their names
    ("attention", r"flash|fmha|attention|prefill|varlen|sdpa"),
    # ROSE's gate-up GEMM with SiLU·mul in its epilogue (rose.layers.gate_up_act) is a GEMM, not an activation
    ("gemm", r"gemm|cutlass|xmma|nvjet|cublas|splitk|matmul|gate_up"),
    ("norm", r"rms|norm"),
    ("rope", r"rope|rotary|qk_"),
    ("activation", r"silu|gelu|act_|swiglu"),
    ("copy", r"memcpy|memset|copy"),
)


def category(name: str) -> str:
    low = name.lower()
    for label, pattern in CATEGORIES:
        if re.search(pattern, low):
            return label
    return "other"


def weight_bytes(engine) -> tuple[int, int]:
    """(bytes a forward reads of the weights, bytes of the embedding tables): a forward gathers only its
    tokens' rows of an embedding table (0.31 GB of the 0.6B's 1.19 GB), so the tables stay out of the
    weight-read floor."""
    model = engine._runner.model
    tables = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    params = {id(p): p for p in model.parameters()}  # each tensor once
    size = {k: p.numel() * p.element_size() for k, p in params.items()}
    embedding = sum(n for k, n in size.items() if k in tables)
    return sum(size.values()) - embedding, embedding


def breakdown(engine, batch, steps: int, device: str) -> dict:
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(steps):
            engine.step(batch).result()
    busy_us: defaultdict[str, float] = defaultdict(float)
    kernels: Counter[str] = Counter()
    top: defaultdict[str, float] = defaultdict(float)
    for event in prof.events():
        if event.device_type != torch.autograd.DeviceType.CUDA:
            continue
        label = category(event.name)
        us = event.time_range.elapsed_us()  # a device record: its own start and end on the GPU
        busy_us[label] += us
        kernels[label] += 1
        top[event.name[:90]] += us
    per_step = {k: round(v / steps / 1e3, 4) for k, v in sorted(busy_us.items())}
    return {"gpu_ms": per_step, "gpu_busy_ms": round(sum(per_step.values()), 4),
            "kernels_per_step": {k: round(v / steps, 1) for k, v in sorted(kernels.items())},
            "top_kernels_ms": {k: round(v / steps / 1e3, 4)
                               for k, v in sorted(top.items(), key=lambda kv: -kv[1])[:8]}}


def run_model(name: str, root: Path, tokens: list[int], device: str, iters: int,
              bandwidth: float | None) -> list[dict]:
    """bandwidth: the card's copy rate in bytes a second (gpu_env.copy_bandwidth), None on a CPU (no floor)."""
    from rose import Batch, Engine

    model_dir = make_folder(name, root / name, "bfloat16")
    engine = Engine.from_pretrained(model_dir, device=device, dtype="bfloat16", cuda_graphs=device == "cuda",
                                    graph_manifest=None)
    engine.warmup()
    weights, embedding = weight_bytes(engine)
    rows = []
    rng = np.random.default_rng(0)
    for n in tokens:
        if n > engine.spec.max_length:
            continue
        batch = Batch.from_sequences([rng.integers(1000, 30000, size=n).astype(np.int32)], engine.spec.pooling)
        for _ in range(3):  # eager, capture, replay
            engine.step(batch).result()
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            engine.step(batch).result()
            times.append(time.perf_counter() - t0)
        p50 = float(np.percentile(np.asarray(times) * 1e3, 50))
        row = {"model": name, "tokens": n, "host_to_host_p50_ms": round(p50, 4),
               "weight_bytes": weights, "embedding_bytes": embedding,
               "weight_read_floor_ms": round(weights / bandwidth * 1e3, 4) if bandwidth else None,
               "runs": {f"{k[0]}:{k[1]}": v for k, v in engine.stats()["runs"].items()}}
        row.update(breakdown(engine, batch, 20, device))
        row["host_side_ms"] = round(p50 - row["gpu_busy_ms"], 4)
        rows.append(row)
        print(f"  {name} {n:5d} tok: host->host {p50:.3f} ms, GPU busy {row['gpu_busy_ms']:.3f} ms "
              f"{row['gpu_ms']}", flush=True)
    engine.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--models", default="qwen3-0.6b,minilm-l6")
    parser.add_argument("--tokens", default="128,512,4096")
    parser.add_argument("--root", type=Path, default=Path("/tmp/rose-models"))
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: smoke-test the script")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    tokens = [int(t) for t in args.tokens.split(",")]
    rows = []
    bandwidth = gpu_env.copy_bandwidth() if args.device == "cuda" else None
    for name in args.models.split(","):
        print(f"== {name}", flush=True)
        rows += run_model(name, args.root, tokens, args.device, args.iters, bandwidth)
    env = {**gpu_env.collect(), "copy_bandwidth_gbs": round(bandwidth / 1e9, 1) if bandwidth else None}
    (args.out / "rose_breakdown.json").write_text(json.dumps({"env": env, "rows": rows}, indent=1))
    print(f"\n{'model':11s} {'tok':>5s} {'h2h ms':>8s} {'gpu ms':>8s} {'host ms':>8s} {'floor':>7s} "
          f"{'gemm':>7s} {'attn':>7s} {'norm':>7s} {'copy':>7s} {'other':>7s} {'kern':>5s}")
    for r in rows:
        g = r["gpu_ms"]
        print(f"{r['model']:11s} {r['tokens']:5d} {r['host_to_host_p50_ms']:8.3f} {r['gpu_busy_ms']:8.3f} "
              f"{r['host_side_ms']:8.3f} {r['weight_read_floor_ms'] or float('nan'):7.3f} {g.get('gemm', 0):7.3f} "
              f"{g.get('attention', 0):7.3f} {g.get('norm', 0):7.3f} {g.get('copy', 0):7.3f} "
              f"{g.get('other', 0) + g.get('rope', 0) + g.get('activation', 0):7.3f} "
              f"{sum(r['kernels_per_step'].values()):5.0f}")


if __name__ == "__main__":
    main()
