"""Qwen3-0.6B's four projections at few tokens: how far cuBLAS runs from the weight-read floor, by layout.

    python -m benchmarks.gemm_small_m [--tokens 128,512] [--json out.json]

Each variant runs the 28 layers' GEMMs of one projection back to back (28 distinct weights, 2-12 MB each,
so L2 (60 MB) does not hold them), timed as CUDA-graph replays (median). Variants: F.linear on [N, K]
weights (ROSE today, cuBLAS 'TN'), x @ W with W stored [K, N] ('NN'), and the cuBLASLt backend forced.
Floor: the weight bytes over 4.3 TB/s (KINDS.md's measured copy bandwidth).
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F
import triton

SHAPES = {"qkv": (4096, 1024), "o": (1024, 2048), "gate_up": (6144, 1024), "down": (1024, 3072)}
LAYERS = 28


def _median_us(fn) -> float:
    return triton.testing.do_bench_cudagraph(fn, rep=60, return_mode="median") * 1e3


def measure(name: str, n: int, k: int, m: int) -> dict:
    g = torch.Generator("cuda").manual_seed(n + k)
    weights = [torch.randn(n, k, device="cuda", generator=g, dtype=torch.bfloat16) * 0.02 for _ in range(LAYERS)]
    weights_t = [w.t().contiguous() for w in weights]
    x = torch.randn(m, k, device="cuda", generator=g, dtype=torch.bfloat16)
    row = {"proj": name, "tokens": m, "n": n, "k": k,
           "floor_us": round(LAYERS * n * k * 2 / 4.3e12 * 1e6, 1)}
    row["linear_tn_us"] = round(_median_us(lambda: [F.linear(x, w) for w in weights]), 1)
    row["matmul_nn_us"] = round(_median_us(lambda: [x @ w for w in weights_t]), 1)
    torch.backends.cuda.preferred_blas_library("cublaslt")
    row["lt_tn_us"] = round(_median_us(lambda: [F.linear(x, w) for w in weights]), 1)
    row["lt_nn_us"] = round(_median_us(lambda: [x @ w for w in weights_t]), 1)
    torch.backends.cuda.preferred_blas_library("cublas")
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", default="128,512")
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    rows = [measure(name, n, k, int(m)) for m in args.tokens.split(",") for name, (n, k) in SHAPES.items()]
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)
    cols = ("floor_us", "linear_tn_us", "matmul_nn_us", "lt_tn_us", "lt_nn_us")
    print(f"{'proj':8s} {'tok':>5s} " + " ".join(f"{c[:-3]:>12s}" for c in cols) + "  (us for 28 layers)")
    for r in rows:
        print(f"{r['proj']:8s} {r['tokens']:5d} " + " ".join(f"{r[c]:12.1f}" for c in cols))


if __name__ == "__main__":
    main()
