"""Pooling (every output row is the mean over one span of tokens) and the family's output transform.

One segment mean serves mean, CLS, last-token and late-chunking spans alike (see rose/batch.py). torch's form sums
in float32 with index_add_ (fixed shapes, no host sync: capturable), then divides by the span's count: four kernels
(the zeroed sums, the cast, the add, the division). On CUDA with ROSE_FUSED_POOLING=1 (opt-in until a GPU run has
measured it: benchmarks/NOTES.md, "Pooling in one kernel"; `device.sh encoder-pooling`) one Triton kernel after the
zeroed sums reads each token block once, divides by its span's count and adds the block's rows into theirs: one add
a block where the block lies in one span (a long sequence's mean), one a token otherwise. Both add in an order the
GPU's atomics choose, as index_add_ does; the kernel divides before it adds, a rounding step of float32 from torch's
order.
"""

from __future__ import annotations

import os

import torch

from rose.layers import fused
from rose.layers.fused import triton

FUSED_POOLING = fused.ENABLED and os.environ.get("ROSE_FUSED_POOLING", "0").strip().lower() in ("1", "true", "on")
BLOCK_TOKENS, BLOCK_COLS = 32, 128


def segment_mean(hidden: torch.Tensor, span_index: torch.Tensor, span_count: torch.Tensor) -> torch.Tensor:
    """hidden [Tb, H] -> float32 [Pb, H]; tokens with span_index == Pb fall into a dropped dummy row."""
    rows = span_count.shape[0]
    if FUSED_POOLING and fused._use_triton(hidden) and hidden.stride(-1) == 1 and span_index.is_contiguous() \
            and span_count.is_contiguous():
        tokens, cols = hidden.shape
        sums = torch.zeros(rows, cols, dtype=torch.float32, device=hidden.device)
        grid = (triton.cdiv(tokens, BLOCK_TOKENS), triton.cdiv(cols, BLOCK_COLS))
        _segment_mean_kernel[grid](hidden, span_index, span_count, sums, tokens, cols, rows, hidden.stride(0),
                                   BLOCK_T=BLOCK_TOKENS, BLOCK_C=BLOCK_COLS)
        return sums
    sums = torch.zeros(rows + 1, hidden.shape[1], dtype=torch.float32, device=hidden.device)
    sums.index_add_(0, span_index, hidden.to(torch.float32))
    return sums[:rows] / span_count[:, None]


def int8_tanh(pooled: torch.Tensor) -> torch.Tensor:
    """pplx-embed's native output: round(127 * tanh(x)), kept as float32 values."""
    return torch.round(127.0 * torch.tanh(pooled))


def output_transform(native_int8: bool):
    """The family's transform of the pooled rows (identity for float families)."""
    return int8_tanh if native_int8 else (lambda x: x)


if triton is not None:
    import triton.language as tl

    @triton.jit
    def _segment_mean_kernel(h_ptr, index_ptr, count_ptr, sums_ptr, tokens, cols, rows, h_stride,
                             BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr):
        """A block of BLOCK_T tokens by BLOCK_C columns: each token's row over its span's count, added into its
        span's row of sums (float32 [rows, cols], zeroed); tokens past the rows (the dummy span) add nothing."""
        t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
        c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
        span = tl.load(index_ptr + t, mask=t < tokens, other=rows).to(tl.int64)
        pooled = span < rows
        count = tl.load(count_ptr + span, mask=pooled, other=1.0)
        keep = pooled[:, None] & (c < cols)[None, :]
        x = tl.load(h_ptr + t.to(tl.int64)[:, None] * h_stride + c[None, :], mask=keep, other=0.0).to(tl.float32)
        x = x / count[:, None]
        first = tl.min(tl.where(pooled, span, rows), axis=0)
        last = tl.max(tl.where(pooled, span, -1), axis=0)
        if first == last:  # the whole block in one span: its sum, one add a column
            tl.atomic_add(sums_ptr + first * cols + c, tl.sum(x, axis=0), mask=c < cols, sem="relaxed")
        elif first < last:  # several spans: a token's row at a time (a block of dummies only adds nothing)
            tl.atomic_add(sums_ptr + span[:, None] * cols + c[None, :], x, mask=keep, sem="relaxed")
