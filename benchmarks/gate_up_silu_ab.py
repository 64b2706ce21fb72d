"""Qwen3's gate-up projection and SiLU·mul at many tokens: F.linear (cuBLAS) then rose.layers.fused.silu_mul, as the
layers run them, against rose.layers.gate_up_act's fused kernel over a small sweep of its tiles.

    python -m benchmarks.gate_up_silu_ab [--tokens 512,4096,17920,25600] [--models qwen3-0.6b,qwen3-4b] [--out DIR]

Each variant runs LAYERS distinct weights back to back in one CUDA graph (triton.testing.do_bench_cudagraph,
median), reported in µs a layer: the unfused pair, F.linear alone and silu_mul alone (what the pair is made of),
and each fused configuration, checked against the unfused pair first (share of elements off, worst bf16 steps).
The GEMM's rate (TFLOP/s of 2 M K 2I) is printed beside each. 17 920 and 25 600 tokens are docs-100's and
score-50x512's batches. Writes OUT/gate_up_silu.json; prints the table last.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
import torch.nn.functional as F
import triton

from benchmarks.kernel_edges import median_us
from rose.layers.fused import silu_mul
from rose.layers.gate_up_act import GateUpConfig, gate_up_silu

SHAPES = {"qwen3-0.6b": (1024, 3072), "qwen3-4b": (2560, 9728)}  # hidden (K), intermediate (I)
LAYERS = 4
# the three fastest pointer-load configurations at e508b0d (of seven), the tensor-descriptor (TMA) forms, and
# 64-row TMA tiles for 512-2048 tokens (more tiles than SMs where 128-row ones leave SMs idle: 96 tiles at 512)
CONFIGS = [GateUpConfig(block_n=128, warps=8, stages=3), GateUpConfig(block_n=128, warps=8, stages=4),
           GateUpConfig(block_m=256, warps=8, stages=3), GateUpConfig(block_n=128, warps=8, stages=3, load="tma"),
           GateUpConfig(block_n=128, warps=8, stages=3, load="tma-sms"), GateUpConfig(load="tma"),
           GateUpConfig(warps=8, load="tma-sms"), GateUpConfig(block_m=64, block_n=128, warps=4, stages=3, load="tma"),
           GateUpConfig(block_m=64, block_n=128, warps=4, stages=4, load="tma"),
           GateUpConfig(block_m=64, block_n=64, warps=4, stages=4, load="tma"),
           GateUpConfig(block_m=64, block_n=128, warps=8, stages=3, load="tma")]


def _us(fn) -> float:
    return median_us(fn) / LAYERS  # µs a layer


def _steps_apart(got: torch.Tensor, want: torch.Tensor) -> tuple[float, int]:
    def ordered(x):
        bits = x.contiguous().view(torch.int16).to(torch.int32)
        return torch.where(bits < 0, -(bits + 32768), bits)

    apart = (ordered(got) - ordered(want)).abs()
    return float((apart > 0).float().mean()), int(apart.max())


def measure(model: str, m: int) -> dict:
    k, inner = SHAPES[model]
    g = torch.Generator("cuda").manual_seed(m + inner)
    weights = [(torch.randn(2 * inner, k, device="cuda", generator=g) * 0.03).bfloat16() for _ in range(LAYERS)]
    x = torch.randn(m, k, device="cuda", generator=g).bfloat16()
    gate_up = F.linear(x, weights[0])
    flop = 2 * m * k * 2 * inner
    row = {"model": model, "tokens": m, "k": k, "inner": inner,
           "unfused_us": _us(lambda: [silu_mul(F.linear(x, w)) for w in weights]),
           "linear_us": _us(lambda: [F.linear(x, w) for w in weights]),
           "silu_mul_us": _us(lambda: [silu_mul(gate_up) for _ in weights]), "configs": []}
    row["linear_tflops"] = flop / row["linear_us"] / 1e6
    want = silu_mul(gate_up)
    out = torch.empty(m, inner, dtype=torch.bfloat16, device="cuda")
    for config in CONFIGS:
        entry = {"config": config.label()}
        try:
            off, worst = _steps_apart(gate_up_silu(x, weights[0], config), want)
            entry.update(off_share=off, worst_steps=worst,
                         us=_us(lambda c=config: [gate_up_silu(x, w, c, out=out) for w in weights]))
            entry["tflops"] = flop / entry["us"] / 1e6
        except Exception as exc:  # noqa: BLE001 - a configuration that does not compile or fit is reported
            entry["error"] = repr(exc)[:200]
        row["configs"].append(entry)
        print(json.dumps({"model": model, "tokens": m, **entry}), flush=True)
    timed = [c for c in row["configs"] if "us" in c and c["worst_steps"] <= 4 and c["off_share"] <= 1e-3]
    best = min(timed, key=lambda c: c["us"], default=None)
    row["fused_us"], row["fused_config"] = (best["us"], best["config"]) if best else (None, None)
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gate_up_silu_ab", description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", default="512,4096,17920,25600")
    parser.add_argument("--models", default="qwen3-0.6b,qwen3-4b")
    parser.add_argument("--out", type=Path, default=Path("."))
    args = parser.parse_args(argv)
    rows = [measure(model, int(m)) for model in args.models.split(",") for m in args.tokens.split(",")]
    env = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "commit": os.environ.get("GIT_COMMIT", "?"), "layers": LAYERS}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gate_up_silu.json").write_text(json.dumps({"env": env, "records": rows}, indent=1))
    print(f"\n{env['gpu']} · torch {env['torch']} · triton {env['triton']} · {env['commit']} · µs a layer, median")
    print(f"{'model':11s} {'tokens':>6s} {'linear':>8s} {'silu':>7s} {'unfused':>8s} {'fused':>8s} {'ratio':>6s} "
          f"{'linear TF/s':>11s}  best config")
    for r in rows:
        fused = r["fused_us"]
        print(f"{r['model']:11s} {r['tokens']:6d} {r['linear_us']:8.1f} {r['silu_mul_us']:7.1f} {r['unfused_us']:8.1f} "
              f"{fused if fused is not None else float('nan'):8.1f} "
              f"{(fused / r['unfused_us']) if fused else float('nan'):6.3f} {r['linear_tflops']:11.0f}  "
              f"{r['fused_config']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
