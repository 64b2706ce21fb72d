"""Qwen3-0.6B's four projections at few tokens: how far cuBLAS runs from the weight-read floor, by layout.

    python -m benchmarks.gemm_small_m [--tokens 128,512] [--json out.json] [--splitk]

Each variant runs the 28 layers' GEMMs of one projection back to back (28 distinct weights, 2-12 MB each,
so L2 (60 MB) does not hold them), timed as CUDA-graph replays (median). Variants: F.linear on [N, K]
weights (ROSE today, cuBLAS 'TN'), x @ W with W stored [K, N] ('NN'), and the cuBLASLt backend forced.
Floor: the weight bytes over 4.3 TB/s (KINDS.md's measured copy bandwidth). `--splitk` adds
rose.layers.splitk_gemm (split-K reduced inside the kernel) over a small grid of tile shapes and splits per
projection and size (`splitk_us` the best, `splitk_config` which, `splitk_tried` how many compiled and ran
correctly: each is checked against F.linear first).
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


def measure(name: str, n: int, k: int, m: int, splitk: bool = False) -> dict:
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
    if splitk:
        row.update(_best_splitk(x, weights))
    return row


def _splitk_grid(m: int, n: int, k: int):
    """Tile shapes and splits worth timing: whole-block K slices, 64-400 programs (132 SMs)."""
    from rose.layers.splitk_gemm import SplitConfig

    block_m = 64 if m <= 64 else 128
    for block_n in (32, 64, 128):
        for block_k in (64, 128):
            for split in (1, 2, 4, 8, 16):
                programs = -(-m // block_m) * -(-n // block_n) * split
                if k % (split * block_k) == 0 and 64 <= programs <= 400:
                    yield SplitConfig(block_m=block_m, block_n=block_n, block_k=block_k, split=split,
                                      warps=8 if block_n == 128 else 4)


def _best_splitk(x: torch.Tensor, weights: list[torch.Tensor]) -> dict:
    from rose.layers.splitk_gemm import Workspace, splitk_linear

    m, k = x.shape
    n = weights[0].shape[0]
    reference = F.linear(x, weights[0]).float()
    best, tried = None, 0
    for config in _splitk_grid(m, n, k):
        ws = Workspace(m, n, config, x.device)
        try:
            y = splitk_linear(x, weights[0], config, ws).float()
        except Exception as exc:  # noqa: BLE001 - a configuration that does not compile is skipped, and said
            print(f"  {config.label()}: {type(exc).__name__}: {str(exc)[:120]}")
            continue
        if (y - reference).norm() > 1e-2 * reference.norm():
            print(f"  {config.label()}: wrong result, skipped")
            continue
        tried += 1
        us = _median_us(lambda: [splitk_linear(x, w, config, ws) for w in weights])
        if best is None or us < best[0]:
            best = (us, config.label())
    if best is None:
        return {"splitk_us": None, "splitk_config": None, "splitk_tried": 0}
    return {"splitk_us": round(best[0], 1), "splitk_config": best[1], "splitk_tried": tried}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", default="128,512")
    parser.add_argument("--json", default="")
    parser.add_argument("--splitk", action="store_true", help="add the split-K kernel's best configuration")
    args = parser.parse_args()
    rows = [measure(name, n, k, int(m), args.splitk) for m in args.tokens.split(",")
            for name, (n, k) in SHAPES.items()]
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)
    cols = ("floor_us", "linear_tn_us", "matmul_nn_us", "lt_tn_us", "lt_nn_us") + (("splitk_us",) if args.splitk else ())
    print(f"{'proj':8s} {'tok':>5s} " + " ".join(f"{c[:-3]:>12s}" for c in cols) + "  (us for 28 layers)")
    for r in rows:
        cells = " ".join(f"{r[c]:12.1f}" if r[c] is not None else f"{'-':>12s}" for c in cols)
        print(f"{r['proj']:8s} {r['tokens']:5d} {cells}" + (f"  {r['splitk_config']}" if args.splitk else ""))


if __name__ == "__main__":
    main()
