"""torch scaled_dot_product_attention over a ragged batch, in one of three layouts chosen per batch.

- CUDA (and any run without host metadata, e.g. inside a graph): the whole packed batch at once with a
  block-diagonal (and causal) boolean mask built from seq_ids on the device. Quadratic in the batch's
  tokens, but capturable in a CUDA graph. The portable reference; varlen is the fast path on CUDA.
- CPU, equal lengths: a [S, L] view of the packed batch, no mask (torch's fused kernel), one call per layer.
- CPU, similar lengths: the sequences gathered into a padded [S, Lmax] block with a key-padding mask, one
  SDPA call per layer (CPU runs are never captured, so the host may plan the gather).
- CPU, very uneven lengths: one SDPA call per sequence, so the padding does not cost Lmax^2 per sequence.
Per-call overhead dominates short sequences on a CPU, hence the padded block when it wastes little.
A sliding window is one more band in the mask (a CPU batch whose sequences all fit inside it needs none).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from rose.attention.base import FULL, AttentionBackend
from rose.meta import ForwardMeta

LOOP_CALL_COST = 64 * 64  # one SDPA call's overhead, in units of score-matrix entries (rough, CPU)


@dataclass
class _BlockMask:
    mask: torch.Tensor  # bool [1, 1, T, T]


@dataclass
class _Padded:
    gather: torch.Tensor  # int64 [S, Lmax] token index (0 where padded)
    scatter: torch.Tensor  # int64 [T] position of each token in the flattened [S * Lmax] block
    mask: torch.Tensor  # bool [S, 1, Lmax, Lmax]


@dataclass
class _Loop:
    bounds: list[tuple[int, int]]
    window: int = FULL


@dataclass
class _Uniform:
    seqs: int  # S sequences of one length, back to back: a [S, L] view, no gather
    mask: torch.Tensor | None = None  # bool [L, L] for a sliding window, else none


class SdpaBackend(AttentionBackend):
    name = "sdpa"
    bidirectional_window = True  # every layout's mask is |i - j| <= window, causal only when asked

    def __init__(self, device: torch.device) -> None:
        self.host_planned = device.type != "cuda"
        self.graph_safe = not self.host_planned

    def prepare(self, meta: ForwardMeta, causal: bool, window: int = FULL) -> Any:
        if self.host_planned and meta.host is not None:
            return _plan_cpu(meta.host.cu_seqlens, causal, window)
        ids = meta.seq_ids
        mask = ids[:, None] == ids[None, :]
        if causal:
            pos = torch.arange(ids.shape[0], device=ids.device)
            mask = mask & (pos[:, None] >= pos[None, :])
        if window != FULL:  # within a sequence, positions differ as the token offsets do
            mask = mask & ((meta.positions[:, None] - meta.positions[None, :]).abs() <= window)
        return _BlockMask(mask[None, None])

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: ForwardMeta,
                causal: bool, scale: float, state: Any = None, window: int = FULL) -> torch.Tensor:
        gqa = k.shape[1] != q.shape[1]
        if isinstance(state, _Loop):
            return _per_sequence(q, k, v, state.bounds, causal, scale, gqa, state.window)
        if isinstance(state, _Uniform):  # maskless: torch's fused CPU kernel, as a padding-free HF batch gets
            t, h, d = q.shape
            view = lambda x: x.view(state.seqs, t // state.seqs, x.shape[1], d).transpose(1, 2)  # noqa: E731
            o = F.scaled_dot_product_attention(view(q), view(k), view(v), attn_mask=state.mask,
                                               is_causal=causal and state.mask is None, scale=scale, enable_gqa=gqa)
            return o.transpose(1, 2).reshape(t, h, d)
        if isinstance(state, _Padded):
            s, width = state.gather.shape
            o = F.scaled_dot_product_attention(
                q[state.gather].transpose(1, 2), k[state.gather].transpose(1, 2), v[state.gather].transpose(1, 2),
                attn_mask=state.mask, scale=scale, enable_gqa=gqa)
            return o.transpose(1, 2).reshape(s * width, q.shape[1], q.shape[2])[state.scatter]
        if gqa:  # the masked CUDA kernels take no enable_gqa: repeat the K/V heads
            rep = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
            attn_mask=state.mask, scale=scale)
        return out[0].transpose(0, 1)


def _band(width: int, window: int, causal: bool) -> np.ndarray:
    """bool [W, W]: key j visible from query i (|i - j| <= window; j <= i when causal)."""
    offset = np.arange(width)[:, None] - np.arange(width)[None, :]
    return (np.abs(offset) <= window) & ((offset >= 0) if causal else True)


def _plan_cpu(cu_seqlens: np.ndarray, causal: bool, window: int = FULL) -> _Loop | _Padded | _Uniform:
    cu = cu_seqlens.astype(np.int64)
    starts, lens = cu[:-1], np.diff(cu)
    if window != FULL and int(lens.max(initial=0)) - 1 <= window:
        window = FULL  # every key of every sequence lies inside the window: nothing to mask
    if len(lens) > 1 and lens.min() == lens.max() > 0 and cu[0] == 0:
        band = None if window == FULL else torch.from_numpy(_band(int(lens[0]), window, causal))
        return _Uniform(len(lens), band)
    keep = lens > 0
    starts, lens = starts[keep], lens[keep]
    s, width = len(lens), int(lens.max())
    if s == 1 or s * width * width > 2 * (int((lens * lens).sum()) + s * LOOP_CALL_COST):
        return _Loop([(int(a), int(a + n)) for a, n in zip(starts, lens)], window)
    cols = np.arange(width, dtype=np.int64)
    valid = cols[None, :] < lens[:, None]
    gather = np.where(valid, starts[:, None] + cols[None, :], 0)
    scatter = (np.arange(s, dtype=np.int64)[:, None] * width + cols[None, :])[valid]
    mask = valid[:, None, None, :]  # [S, 1, 1, W]: key padding, broadcast over the queries
    if causal or window != FULL:
        mask = mask & _band(width, width if window == FULL else window, causal)[None, None]
    return _Padded(torch.from_numpy(gather), torch.from_numpy(scatter), torch.from_numpy(np.ascontiguousarray(mask)))


def _per_sequence(q, k, v, bounds: list[tuple[int, int]], causal: bool, scale: float, gqa: bool,
                  window: int = FULL) -> torch.Tensor:
    def attend(a: int, b: int) -> torch.Tensor:
        # 4-D inputs: torch's fused CPU flash kernel takes them; 3-D ones fall back to the math path.
        band = None if window == FULL or b - a - 1 <= window else torch.from_numpy(_band(b - a, window, causal))
        o = F.scaled_dot_product_attention(
            q[a:b].transpose(0, 1)[None], k[a:b].transpose(0, 1)[None], v[a:b].transpose(0, 1)[None],
            attn_mask=band, is_causal=causal and band is None, scale=scale, enable_gqa=gqa)
        return o[0].transpose(0, 1)

    if len(bounds) == 1:
        return attend(*bounds[0])
    out = torch.empty_like(q)
    for a, b in bounds:
        out[a:b] = attend(a, b)
    return out
