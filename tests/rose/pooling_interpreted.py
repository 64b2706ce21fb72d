"""rose.layers.pooling's kernel under Triton's interpreter (TRITON_INTERPRET=1, numpy on the CPU) against torch's
segment mean (index_add_ in float32, then the division): spans as the engine packs them (rose.meta: tokens outside a
span index the dummy row Pb, filler rows count 1). Run by test_rose_pooling_kernel.py in a process of its own (the
interpreter is chosen when the kernel module is imported). Prints one line per case and exits 1 on a mismatch."""

from __future__ import annotations

import os
import sys

os.environ["TRITON_INTERPRET"] = "1"


def spans_of(kind: str, tokens: int):
    """[start, end) spans of a packed batch of `tokens` tokens (the layout's padding after the last), by kind."""
    if kind == "one":  # a lone long sequence's mean, padding after it: blocks in one span, then blocks of dummies
        return [(0, tokens - 37)]
    if kind == "many":  # short sequences' means: blocks across several spans
        return [(s, min(s + 5, tokens)) for s in range(0, tokens - 9, 7)]
    if kind == "cls":  # a token a sequence, the rest of each into the dummy row
        return [(s, s + 1) for s in range(0, tokens, 40)]
    if kind == "chunks":  # late chunking: spans back to back, one of 33 tokens across a block's edge
        return [(0, 30), (30, 63), (63, 64), (64, tokens)]
    raise ValueError(kind)


def check(kind: str, tokens: int, cols: int, dtype, filler: int) -> bool:
    import torch

    from rose.layers import pooling

    g = torch.Generator().manual_seed(tokens * 3 + cols)
    hidden = (torch.randn(tokens, cols + 24, generator=g) * 4 + 1).to(dtype)[:, 5:5 + cols]  # rows strided
    spans = spans_of(kind, tokens)
    rows = len(spans) + filler
    span_index = torch.full((tokens,), rows, dtype=torch.int64)
    count = torch.ones(rows, dtype=torch.float32)
    for row, (start, end) in enumerate(spans):
        span_index[start:end] = row
        count[row] = end - start
    pooling.FUSED_POOLING = True
    got = pooling.segment_mean(hidden, span_index, count)
    pooling.FUSED_POOLING = False
    want = pooling.segment_mean(hidden, span_index, count)
    # float32 sums in another order, and each term divided before the add: a few float32 steps of the row's size
    scale = hidden.float().abs().max() * 1e-6
    off = float((got - want).abs().max() / scale)
    ok = got.shape == want.shape and got.dtype == torch.float32 and off <= 4.0
    print(f"segment_mean {kind} tokens={tokens} cols={cols} {dtype} filler={filler}: max {off:.2f} steps "
          f"{'ok' if ok else 'MISMATCH'}")
    return ok


def main() -> int:
    import torch

    from rose.layers import fused

    fused._use_triton = lambda x: True  # CPU tensors: the interpreter runs the kernel on them
    failed = 0
    for dtype in (torch.float32, torch.float16):
        for kind in ("one", "many", "cls", "chunks"):
            failed += not check(kind, 128, 384, dtype, filler=0)
        failed += not check("one", 45, 1000, dtype, filler=3)  # a width past a power of two, filler rows
        failed += not check("many", 200, 64, dtype, filler=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
