"""The Triton attention's block sizes per shape: (BLOCK_M, BLOCK_N, warps, stages) swept on the GPU (CUDA only).

    python -m benchmarks.triton_attention_sweep [--out benchmarks/results/triton_attention_sweep.json]
    python -m benchmarks.triton_attention_sweep --split --out benchmarks/results/triton_attention_split.json
    python -m benchmarks.triton_attention_sweep --tma [--wide] [--order] [--heads 32,8,128] [--causal yes]
        --out OUT/triton_attention_tma.json

For the Qwen3-0.6B attention shape, causal and bidirectional, at 1x128, 1x512, 1x4096 and the 100 mixed
documents: every configuration of the grid below timed by attention_ab's time_in_graph (8 or 2 calls captured
in one CUDA graph, median replay / calls), its error against the float32 reference checked, beside
`block_config`'s own choice and torch's varlen. A configuration that does not compile (shared memory) or
errs above attention_ab's ERR_TOL is recorded with its status. Prints, last, the best configuration per shape.
--split: a few configurations each with the kernel's split into unmasked and masked key blocks (the default) and
with every block masked, side by side. --tma: a few configurations each with K and V loaded by pointers (the
default) and through tensor descriptors (varlen_attention's `tma`), side by side; the table's third column is then
block_config's blocks in the other form (by pointers where it chose descriptors, and the reverse); without --tma the
default row loads by pointers, as the grid's rows do. --tma --order: block_config's blocks and nine others in the order
the layout does not choose (programs launched heads fastest and query blocks slowest, varlen_attention's
`longest_first`, or the older order), and the default's blocks in each order; the third column is then the
default's blocks in the order its layout does not choose (the default row runs the order
`triton_blocks.longest_first` chooses, as the engine does). --heads Q,KV,D:
another attention shape (BGE-base's 12,12,64) instead of the 0.6B's 16,8,128; --causal yes / no: one side only;
--tma --wide: fifteen more block shapes through descriptors, five of them with two query heads of a KV group in
one program (pack 2), two with four (pack 4: the 4B's `--heads 32,8,128`; a group of 2 records them as errors).
--shapes 2x4096,4x1024,100-docs: these shapes (sequences x length) instead of the mode's.
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import torch

from benchmarks.attention_ab import ERR_TOL, Case, docs_100, time_in_graph
from rose.attention import AttentionBackend, AttentionShape, make_backend
from rose.attention.triton_blocks import block_config, longest_first
from rose.attention.triton_varlen import varlen_attention
from rose.windows import FULL

# (config, split, tma): None for block_config's split
GRID = [(config, None, False) for config in itertools.product((64, 128), (32, 64, 128), (4, 8), (2, 3))]
SPLIT_GRID = [(config, split, False) for config in ((64, 64, 4, 3), (64, 32, 4, 3), (128, 64, 8, 3), (128, 128, 8, 3))
              for split in (True, False)]
TMA_GRID = [(config, None, tma) for config in ((64, 64, 4, 3), (64, 32, 4, 3), (128, 128, 8, 3), (128, 128, 8, 2),
                                               (128, 64, 8, 3)) for tma in (False, True)]
# --tma --wide: more shapes of block through descriptors only (stages, warps, 128-key and 128-query blocks)
# and both query heads of a KV group in one program (a 5th element, pack 2: 2 x BLOCK_M rows share each K/V block)
WIDE_TMA_GRID = [(config, None, True) for config in ((64, 64, 4, 2), (64, 64, 4, 4), (64, 64, 8, 3), (64, 128, 4, 2),
                                                     (64, 128, 8, 3), (128, 64, 4, 3), (128, 64, 8, 2), (128, 32, 8, 3),
                                                     (64, 64, 8, 3, 2), (64, 64, 8, 2, 2), (64, 128, 8, 2, 2),
                                                     (32, 64, 4, 3, 2), (64, 32, 8, 3, 2),
                                                     (16, 64, 4, 3, 4), (32, 64, 8, 3, 4))]  # pack 4: groups of 4+
# --order: block_config's blocks and the best-measured shapes in the order the layout does not choose (the grid's rows
# run the one it does), so each is measured both ways, and larger blocks (two warpgroups of 64 query rows, 128-key
# blocks), which both orders measured slower at 1 x 4096 (results/triton_attention_order_blocks_164990c/)
ORDER_GRID = [(config, None, True) for config in ((64, 64, 4, 3), (64, 32, 4, 3), (32, 64, 4, 3, 2), (16, 64, 4, 3, 4),
                                                  (128, 128, 8, 3), (128, 128, 8, 2), (128, 64, 8, 3), (64, 128, 4, 2),
                                                  (64, 64, 4, 4), (64, 64, 8, 3))]
OTHER = object()  # an order grid row's order: the one the layout does not choose
SHAPES = {"1x128": [128], "1x512": [512], "1x4096": [4096], "100-docs": None}
SPLIT_SHAPES = {"1x128": [128], "1x512": [512], "1x1024": [1024], "1x2048": [2048], "1x4096": [4096],
                "50x512": [512] * 50, "100-docs": None}


class Configured(AttentionBackend):
    """The Triton attention at one (BLOCK_M, BLOCK_N, warps, stages[, pack]), or block_config's when None, timed
    as attention_ab times any backend."""

    def __init__(self, config: tuple[int, ...] | None, split: bool | None = None,
                 tma: bool | None = None, longest_first: bool | None = None) -> None:
        self.config, self.split, self.tma, self.longest_first = config, split, tma, longest_first

    def forward(self, q, k, v, meta, causal, scale, state=None, window=FULL):
        return varlen_attention(q, k, v, meta.cu_seqlens, meta.max_seqlen, causal, scale, self.config,
                                split=self.split, tma=self.tma,
                                longest_first=self.longest_first)


def parse_shape(label: str) -> list[int] | None:
    """"2x4096" -> [4096, 4096]; "100-docs" -> None (docs_100's lengths)."""
    label = label.strip()
    if label == "100-docs":
        return None
    seqs, _, length = label.partition("x")
    if not (seqs.isdigit() and length.isdigit() and int(seqs) > 0 and int(length) > 0):
        raise SystemExit(f"--shapes: {label!r} is not SEQSxLEN (both at least 1) or 100-docs")
    return [int(length)] * int(seqs)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/triton_attention_sweep.json"))
    parser.add_argument("--split", action="store_true", help="masked vs unmasked key blocks, a few configurations")
    parser.add_argument("--tma", action="store_true", help="pointer loads vs tensor descriptors, a few configurations")
    parser.add_argument("--heads", default="16,8,128", help="query heads, KV heads, head dim")
    parser.add_argument("--wide", action="store_true", help="with --tma: more block shapes through descriptors")
    parser.add_argument("--causal", choices=("both", "yes", "no"), default="both")
    parser.add_argument("--order", action="store_true", help="with --tma: longest blocks first beside, a few shapes")
    parser.add_argument("--shapes", default="", help="comma-separated SEQSxLEN (2x4096) or 100-docs instead of the "
                                                     "mode's shapes")
    args = parser.parse_args(argv)
    grid, shapes = ((TMA_GRID, SPLIT_SHAPES) if args.tma else (SPLIT_GRID, SPLIT_SHAPES) if args.split
                    else (GRID, SHAPES))
    if args.shapes:
        shapes = {label.strip(): parse_shape(label) for label in args.shapes.split(",")}
    # (config, split, tma, longest_first): None runs the order the layout chooses (triton_blocks.longest_first)
    grid = [(*row, None) for row in (grid + WIDE_TMA_GRID if args.tma and args.wide else grid)]
    grid += [(None, None, None, True), (None, None, None, False), *((*row, OTHER) for row in ORDER_GRID)] \
        if args.tma and args.order else []
    device = torch.device("cuda")
    records, best = [], []
    for causal in {"both": (True, False), "yes": (True,), "no": (False,)}[args.causal]:
        qo_heads, kv_heads, head_dim = (int(x) for x in args.heads.split(","))
        shape = AttentionShape(qo_heads, kv_heads, head_dim, causal)
        varlen = make_backend("varlen", device, torch.bfloat16, shape=shape)
        for label, lengths in shapes.items():
            lengths = lengths or docs_100()
            case = Case(lengths, shape, device)
            default_tma = None if args.tma else False  # the other modes' grids load by pointers: so does the default
            chosen = block_config(head_dim, max(lengths), len(lengths), torch.cuda.get_device_capability(device),
                                  causal, default_tma, group=qo_heads // kv_heads)
            named = [*chosen[:4], chosen.pack] if chosen.pack > 1 else list(chosen[:4])  # as the grid names them
            rows = []
            auto_first = longest_first(max(lengths), len(lengths), causal)  # the order the default row runs
            for config, split, tma, first in [(None, None, default_tma, None), *grid]:
                first = (not auto_first) if first is OTHER else first
                rec = {"causal": causal, "shape": label, "config": list(config or named),
                       "split": chosen.split if split is None else split, "tma": chosen.tma if tma is None else tma,
                       "longest_first": auto_first if first is None else first,
                       "default": config is None and first is None}
                try:
                    timed = time_in_graph(Configured(config, split, tma, first), case, shape)
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
            other = next((r["us"] for r in rows[1:] if r["config"] == default["config"] and (
                r["longest_first"] != default["longest_first"] if args.tma and args.order
                else r["tma"] != default["tma"] if args.tma else not r["split"])), None)

            def name(r):
                return (f"{r['config']}{'' if r['split'] else ' masked'}{' tma' if r['tma'] else ''}"
                        f"{' first' if r['longest_first'] else ''}")

            best.append((causal, label, name(default), default["us"], other, top and name(top), top and top["us"],
                         round(us_varlen, 2)))
            records.append({"causal": causal, "shape": label, "backend": "varlen", "us": round(us_varlen, 2)})
            print(f"  causal={causal} {label}: block_config {default['config']} {default['us']} us, best "
                  f"{top and top['config']} {top and top['us']} us, varlen {us_varlen:.2f} us", flush=True)
            args.out.parent.mkdir(parents=True, exist_ok=True)  # after every shape: a call cut short keeps them
            args.out.write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                                            "heads": args.heads, "wide": args.wide, "order": args.tma and args.order,
                                            "records": records}, indent=1))
    other = "other order" if args.tma and args.order else "other form" if args.tma else "all masked"
    print(f"\n{'causal':6s} {'shape':9s} {'block_config':>23s} {'us':>8s} {other:>10s} "
          f"{'best':>27s} {'us':>8s} {'varlen us':>9s}")
    for causal, label, dcfg, dus, mus, bcfg, bus, vus in best:
        print(f"{causal!s:6s} {label:9s} {dcfg!s:>23s} {dus!s:>8s} {mus!s:>10s} {bcfg!s:>27s} {bus!s:>8s} {vus:9.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
