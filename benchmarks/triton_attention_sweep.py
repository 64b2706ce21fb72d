"""The Triton attention's block sizes per shape: (BLOCK_M, BLOCK_N, warps, stages) swept on the GPU (CUDA only).

    python -m benchmarks.triton_attention_sweep [--out benchmarks/results/triton_attention_sweep.json]

For the Qwen3-0.6B attention shape, causal and bidirectional, at 1x128, 1x512, 1x4096 and the 100 mixed
documents: every configuration of the grid below timed by attention_ab's time_in_graph (8 or 2 calls captured
in one CUDA graph, median replay / calls), its error against the float32 reference checked, beside
`block_config`'s own choice and torch's varlen. A configuration that does not compile (shared memory) or
errs above attention_ab's ERR_TOL is recorded with its status. Prints, last, the best configuration per shape.
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import torch

from benchmarks.attention_ab import ERR_TOL, Case, docs_100, time_in_graph
from rose.attention import AttentionBackend, AttentionShape, make_backend
from rose.attention.triton_varlen import block_config, varlen_attention
from rose.windows import FULL

GRID = list(itertools.product((64, 128), (32, 64, 128), (4, 8), (2, 3)))
SHAPES = {"1x128": [128], "1x512": [512], "1x4096": [4096], "100-docs": None}


class Configured(AttentionBackend):
    """The Triton attention at one (BLOCK_M, BLOCK_N, warps, stages), or block_config's when None, timed as
    attention_ab times any backend."""

    def __init__(self, config: tuple[int, int, int, int] | None) -> None:
        self.config = config

    def forward(self, q, k, v, meta, causal, scale, state=None, window=FULL):
        return varlen_attention(q, k, v, meta.cu_seqlens, meta.max_seqlen, causal, scale, self.config)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/triton_attention_sweep.json"))
    args = parser.parse_args(argv)
    device = torch.device("cuda")
    records, best = [], []
    for causal in (True, False):
        shape = AttentionShape(16, 8, 128, causal)
        varlen = make_backend("varlen", device, torch.bfloat16, shape=shape)
        for label, lengths in SHAPES.items():
            case = Case(lengths or docs_100(), shape, device)
            rows = []
            for config in [None, *GRID]:
                rec = {"causal": causal, "shape": label, "config": list(config or block_config(128)),
                       "default": config is None}
                try:
                    timed = time_in_graph(Configured(config), case, shape)
                    rec.update(us=timed["us"], err=timed["max_abs_err"],
                               status="ok" if timed["max_abs_err"] <= ERR_TOL else "wrong")
                except Exception as exc:  # noqa: BLE001 - a configuration that cannot run is recorded
                    rec.update(us=None, err=None, status=f"{type(exc).__name__}: {str(exc)[:100]}")
                    torch.cuda.synchronize()
                records.append(rec)
                rows.append(rec)
            us_varlen = time_in_graph(varlen, case, shape)["us"]
            ok = [r for r in rows if r["status"] == "ok"]
            top = min(ok, key=lambda r: r["us"]) if ok else None
            default = rows[0]
            best.append((causal, label, default["config"], default["us"], top and top["config"], top and top["us"],
                         round(us_varlen, 2)))
            records.append({"causal": causal, "shape": label, "backend": "varlen", "us": round(us_varlen, 2)})
            print(f"  causal={causal} {label}: block_config {default['config']} {default['us']} us, best "
                  f"{top and top['config']} {top and top['us']} us, varlen {us_varlen:.2f} us", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                                    "records": records}, indent=1))
    print(f"\n{'causal':6s} {'shape':9s} {'block_config':>16s} {'us':>8s} {'best':>16s} {'us':>8s} {'varlen us':>9s}")
    for causal, label, dcfg, dus, bcfg, bus, vus in best:
        print(f"{causal!s:6s} {label:9s} {dcfg!s:>16s} {dus!s:>8s} {bcfg!s:>16s} {bus!s:>8s} {vus:9.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
