"""Pooling (every output row is the mean over one span of tokens) and the family's output transform.

One segment mean serves mean, CLS, last-token and late-chunking spans alike (see rose/batch.py). It sums
in float32 with index_add_ (fixed shapes, no host sync: capturable), then divides by the span's count.
"""

from __future__ import annotations

import torch


def segment_mean(hidden: torch.Tensor, span_index: torch.Tensor, span_count: torch.Tensor) -> torch.Tensor:
    """hidden [Tb, H] -> float32 [Pb, H]; tokens with span_index == Pb fall into a dropped dummy row."""
    rows = span_count.shape[0]
    sums = torch.zeros(rows + 1, hidden.shape[1], dtype=torch.float32, device=hidden.device)
    sums.index_add_(0, span_index, hidden.to(torch.float32))
    return sums[:rows] / span_count[:, None]


def int8_tanh(pooled: torch.Tensor) -> torch.Tensor:
    """pplx-embed's native output: round(127 * tanh(x)), kept as float32 values."""
    return torch.round(127.0 * torch.tanh(pooled))


def output_transform(native_int8: bool):
    """The family's transform of the pooled rows (identity for float families)."""
    return int8_tanh if native_int8 else (lambda x: x)
