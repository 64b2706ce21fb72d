"""Banded attention (rose.attention.banded) against dense per-sequence attention with the same window or bias,
on ragged batches with bucket padding; shapes as a CUDA graph sees them (max_seqlen = a bound, no host meta)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rose import Batch
from rose.attention.banded import band_pairs, banded_attention, biased_band, window_band
from rose.meta import ForwardMeta, MetaLayout, pack_batch


def _meta(lengths, layout=None, bound=None):
    batch = Batch.from_sequences([[1] * n for n in lengths])
    host = pack_batch(batch, layout)
    return ForwardMeta.from_buffer(torch.from_numpy(host.packed), host.layout, bound or host.max_seqlen), batch


def _dense(q, k, v, cu, scale, window=None, bias=None):
    """Each real sequence on its own: scores + bias(j - i) [L, L, H], window |i - j| <= window."""
    out = torch.zeros_like(q)
    for a, b in zip(cu[:-1], cu[1:]):
        n = b - a
        idx = torch.arange(n)
        dist = idx[None, :] - idx[:, None]
        s = torch.einsum("ihd,jhd->hij", q[a:b], k[a:b]) * scale
        if bias is not None:
            s = s + bias(dist[None])[0].permute(2, 0, 1)
        if window is not None:
            s = s.masked_fill((dist.abs() > window)[None], float("-inf"))
        out[a:b] = torch.einsum("hij,jhd->ihd", s.softmax(-1), v[a:b])
    return out


def _qkv(tokens, heads=3, dim=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(tokens, heads, dim, generator=gen, dtype=torch.float64) for _ in range(3)]


@pytest.mark.parametrize("lengths,layout", [([1, 7, 40, 3, 90], None), ([5], None),
                                            ([33, 2, 70], MetaLayout(128, 4, 4))])
@pytest.mark.parametrize("window", [0, 4, 16])
def test_window_band_equals_dense_sliding_window(lengths, layout, window):
    meta, batch = _meta(lengths, layout, bound=layout.tokens if layout else None)
    q, k, v = _qkv(meta.input_ids.shape[0])
    band = window_band(meta, window)
    ours = banded_attention(q, k, v, band, 0.3)
    ref = _dense(q, k, v, batch.cu_seqlens, 0.3, window=window)
    t = batch.num_tokens
    assert torch.allclose(ours[:t], ref[:t], atol=1e-10)
    assert torch.isfinite(ours).all()  # the padding pseudo-sequence too


def _bucket_bias(dist):
    table = torch.linspace(-2, 2, 7 * 3, dtype=torch.float64).view(7, 3)
    return table[dist.clamp(-3, 3) + 3]


@pytest.mark.parametrize("lengths,layout", [([1, 7, 40, 3, 90], None), ([33, 2, 70], MetaLayout(128, 4, 4))])
def test_biased_band_equals_dense_attention_with_the_bias(lengths, layout):
    meta, batch = _meta(lengths, layout, bound=layout.tokens if layout else None)
    q, k, v = _qkv(meta.input_ids.shape[0], seed=1)
    reach = max(lengths) - 1
    band = biased_band(meta, reach, _bucket_bias, torch.float64)
    ours = banded_attention(q, k, v, band, 0.5)
    ref = _dense(q, k, v, batch.cu_seqlens, 0.5, bias=_bucket_bias)
    t = batch.num_tokens
    assert torch.allclose(ours[:t], ref[:t], atol=1e-10)
    assert torch.isfinite(ours).all()


def test_a_reach_short_of_the_sequence_is_not_full_attention():
    """The band only covers what `reach` says: the tests above pass because reach spans each sequence."""
    meta, batch = _meta([80])
    q, k, v = _qkv(80, seed=2)
    short = banded_attention(q, k, v, biased_band(meta, 10, _bucket_bias, torch.float64), 0.5)
    ref = _dense(q, k, v, batch.cu_seqlens, 0.5, bias=_bucket_bias)
    assert not torch.allclose(short, ref, atol=1e-3)


def test_band_pairs_see_only_their_own_sequence():
    meta, batch = _meta([3, 5])
    block, width, visible, dist = band_pairs(meta, reach=4)
    seq = np.repeat(np.arange(2), [3, 5])
    rows = visible.reshape(-1, width)[:8].numpy()
    starts = np.arange(8) // block * block - 4
    for i in range(8):
        keys = starts[i] + np.nonzero(rows[i])[0]
        assert sorted(keys) == [j for j in range(8) if seq[j] == seq[i]]
    assert width % 16 == 0 and dist.dtype == torch.int64
