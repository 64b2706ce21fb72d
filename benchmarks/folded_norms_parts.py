"""What each piece of the folded norms costs on the GPU (Qwen3-0.6B shapes): µs per call, each op 28 times in a
CUDA graph with 28 distinct weights (as in the model), median of 30 replays.

    python -m benchmarks.folded_norms_parts [--tokens 128,4096] [--json FILE]

Rows: the o and down projections as F.linear vs addmm with the residual (beta = 1) vs F.linear then a torch
add; the QK-norm+RoPE kernel without and with the row scale (q, k, and v in place); SiLU*mul without and with
it; add+RMSNorm (what folding removes). Prints a table last.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks import gpu_env
from rose.layers import fused

HIDDEN, HEADS, KV, D, INNER, LAYERS = 1024, 16, 8, 128, 3072, 28


def timed(fn, reps: int = 30) -> float:
    """µs per call of fn (which runs LAYERS calls), replayed from a CUDA graph."""
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        fn()
        fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) * 1e3 / LAYERS)
    return statistics.median(out)


def rows_for(t: int) -> dict[str, float]:
    dev, bf = "cuda", torch.bfloat16
    r = lambda *shape: torch.randn(*shape, device=dev, dtype=bf) * 0.05  # noqa: E731
    wo = [r(HIDDEN, HEADS * D) for _ in range(LAYERS)]
    wd = [r(HIDDEN, INNER) for _ in range(LAYERS)]
    a, m, res, x = r(t, HEADS * D), r(t, INNER), r(t, HIDDEN) * 20, r(t, HIDDEN)
    qkv = r(t, (HEADS + 2 * KV) * D)
    gu = r(t, 2 * INNER)
    qw, kw, nw = r(D) + 1, r(D) + 1, r(HIDDEN) + 1
    pos = torch.arange(t, device=dev)
    inv = 1.0 / (1e6 ** (torch.arange(0, D, 2, device=dev, dtype=torch.float32) / D))
    q, k = torch.empty(t, HEADS, D, device=dev, dtype=bf), torch.empty(t, KV, D, device=dev, dtype=bf)
    out_i = torch.empty(t, INNER, device=dev, dtype=bf)
    rows = {
        "o: F.linear": lambda: [F.linear(a, w) for w in wo],
        "o: addmm(residual)": lambda: [torch.addmm(res, a, w.t()) for w in wo],
        "o: F.linear + add": lambda: [F.linear(a, w).add_(res) for w in wo],
        "down: F.linear": lambda: [F.linear(m, w) for w in wd],
        "down: addmm(residual)": lambda: [torch.addmm(res, m, w.t()) for w in wd],
        "qk-norm+rope": lambda: [fused.launch_qk_norm_rope(qkv, q, k, qw, kw, pos, inv, 1e-6) for _ in wo],
        "qk-norm+rope, row scale": lambda: [fused.launch_qk_norm_rope(qkv, q, k, qw, kw, pos, inv, 1e-6,
                                                                      row_scale_of=res) for _ in wo],
        "silu*mul": lambda: [fused.launch_act_mul(gu, out_i) for _ in wo],
        "silu*mul, row scale": lambda: [fused.launch_act_mul(gu, out_i, "silu", res, 1e-6) for _ in wo],
        "add+rmsnorm": lambda: [fused.add_rms_norm(x, res, nw, 1e-6) for _ in wo],
    }
    return {name: timed(fn) for name, fn in rows.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", default="128,4096")
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    sizes = [int(x) for x in args.tokens.split(",")]
    results = {t: rows_for(t) for t in sizes}
    if args.json:
        Path(args.json).write_text(json.dumps({"env": gpu_env.collect(), "us_per_call": results}, indent=1))
    print(f"{'µs per call':28s}" + "".join(f"{t:>10d}" for t in sizes))
    for name in results[sizes[0]]:
        print(f"{name:28s}" + "".join(f"{results[t][name]:10.2f}" for t in sizes))


if __name__ == "__main__":
    main()
