"""Banded attention over the packed batch: sliding windows and additive position biases, on any device.

Why: torch's varlen, FlashInfer and FA4 take no additive bias (MPNet's relative position buckets), and not
every backend has a symmetric sliding window (ModernBERT's local layers). This path is torch SDPA on fixed
shapes, so it runs on a CPU and inside a CUDA graph alike, with no padding between sequences.

The packed tokens [T] are cut into blocks of `block` queries; block b attends the keys at packed offsets
[b*block - reach, b*block + block + reach): a band of fixed width W (rounded up to a multiple of 16, the
alignment the fused SDPA kernels want of a mask). A key of the band takes part when it is in the query's own
sequence (seq_ids) and, with a window, at most `window` positions away. That is exact whenever `reach` covers
every key a query may see: reach = window for a sliding window, the longest sequence - 1 for full attention.
Every query sees itself (distance 0), so no row is fully masked, padding tokens included. The mask (or bias)
is built once per forward from seq_ids and positions and shared by the layers that use it.

Cost: each query scores W = block + 2*reach keys. A window of 64 (ModernBERT): 192 keys for at most 129
useful (1.5x). Full attention with a bias (MPNet, reach up to 511): about 1100 keys per query whatever its
sequence's length: a batch of 128-token sequences pays ~8x varlen's attention FLOPs (for MPNet-base still
below its linear layers' FLOPs), and the bias is [T/block, heads, block, W] in the model dtype, about
T x heads x 1100 x 2 bytes (430 MB at 16384 tokens in bf16). Each layer also copies its keys and values
into the bands: W / block times their size (3x for a window of 64, 17x at MPNet's reach).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from rose.meta import ForwardMeta

BLOCK = 64  # queries per block: smaller blocks waste fewer keys per query, larger ones make fewer SDPA batches
ALIGN = 16


@dataclass
class Band:
    """One forward's band geometry and its mask: bool [nb, 1, B, W] or additive float [nb, H, B, W]."""

    block: int
    reach: int
    width: int
    mask: torch.Tensor


def _geometry(tokens: int, reach: int) -> tuple[int, int, int]:
    block = min(BLOCK, -(-tokens // 8) * 8)
    blocks = -(-tokens // block)
    width = -(-(block + 2 * reach) // ALIGN) * ALIGN
    return block, blocks, width


def band_pairs(meta: ForwardMeta, reach: int, window: int | None = None) -> tuple[int, int, torch.Tensor, torch.Tensor]:
    """(block, width, visible bool [nb, B, W], key position - query position int64 [nb, B, W]) for the
    packed batch of `meta`. Query slots past the last token repeat the last token (their rows are dropped)."""
    seq, pos = meta.seq_ids, meta.positions
    tokens = seq.shape[0]
    block, blocks, width = _geometry(tokens, reach)
    dev = seq.device
    q_at = torch.arange(blocks * block, device=dev).view(blocks, block).clamp(max=tokens - 1)
    k_at = (torch.arange(blocks, device=dev) * block - reach)[:, None] + torch.arange(width, device=dev)[None, :]
    inside = (k_at >= 0) & (k_at < tokens)
    k_at = k_at.clamp(0, tokens - 1)
    visible = (seq[q_at][:, :, None] == seq[k_at][:, None, :]) & inside[:, None, :]
    dist = pos[k_at][:, None, :] - pos[q_at][:, :, None]
    if window is not None:
        visible = visible & (dist.abs() <= window)
    return block, width, visible, dist


def window_band(meta: ForwardMeta, window: int) -> Band:
    """Keys at most `window` positions away in the query's sequence (|i - j| <= window)."""
    reach = max(0, min(window, meta.max_seqlen - 1))
    block, width, visible, _ = band_pairs(meta, reach, window)
    return Band(block, reach, width, visible[:, None])


def biased_band(meta: ForwardMeta, reach: int, bias: Callable[[torch.Tensor], torch.Tensor],
                dtype: torch.dtype) -> Band:
    """Every key of the query's sequence within `reach`, with the additive bias(key pos - query pos)
    ([nb, B, W] int64 -> [nb, B, W, heads]) on its score."""
    block, width, visible, dist = band_pairs(meta, reach)
    mask = bias(dist).to(dtype).permute(0, 3, 1, 2).contiguous()  # contiguous: what the fused kernels expect
    return Band(block, reach, width, mask.masked_fill_(~visible[:, None], float("-inf")))


def banded_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, band: Band, scale: float) -> torch.Tensor:
    """q, k, v [T, H, D] (packed) -> [T, H, D]: softmax(q k^T * scale + mask) v over each block's band."""
    tokens, heads, dim = q.shape
    block, reach, width = band.block, band.reach, band.width
    blocks = -(-tokens // block)
    queries = F.pad(q, (0, 0, 0, 0, 0, blocks * block - tokens)).view(blocks, block, heads, dim).transpose(1, 2)
    back = (blocks - 1) * block + width - reach - tokens

    def keys(x: torch.Tensor) -> torch.Tensor:
        # [nb, W, H, D] copied out of the overlapping windows, then viewed [nb, H, W, D]: the layout every HF
        # model hands SDPA. Fused SDPA kernels have returned wrong results for unusual strides (pytorch#112577),
        # and an overlapping view is as unusual as strides get.
        bands = F.pad(x, (0, 0, 0, 0, reach, back)).unfold(0, width, block)  # [nb, H, D, W] view
        return bands.permute(0, 3, 1, 2).contiguous().transpose(1, 2)

    out = F.scaled_dot_product_attention(queries, keys(k), keys(v), attn_mask=band.mask, scale=scale)
    return out.transpose(1, 2).reshape(blocks * block, heads, dim)[:tokens]
