"""The SDPA backend's three layouts (per sequence, padded block, block-diagonal mask) against a naive
per-sequence softmax attention, with GQA, causal and not, and bucket padding."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rose import Batch
from rose.attention import make_backend
from rose.attention.sdpa import _BlockMask, _Loop, _Padded, _Uniform, _plan_cpu
from rose.meta import ForwardMeta, MetaLayout, pack_batch


def naive(q, k, v, lens, causal, scale):
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    out, at = [], 0
    for n in lens:
        qs, ks, vs = (x[at:at + n].transpose(0, 1).double() for x in (q, k, v))
        scores = qs @ ks.transpose(1, 2) * scale
        if causal:
            scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        out.append((scores.softmax(-1) @ vs).transpose(0, 1))
        at += n
    return torch.cat(out).float()


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("lens", [[5], [3, 9, 1, 6], [40, 2, 2, 2], [7, 7, 7]])
def test_every_cpu_layout_matches_naive_attention(lens, causal):
    torch.manual_seed(0)
    batch = Batch.from_sequences([[1] * n for n in lens])
    t = batch.num_tokens
    q, k, v = torch.randn(t, 4, 8), torch.randn(t, 2, 8), torch.randn(t, 2, 8)
    expected = naive(q, k, v, lens, causal, 0.3)
    backend = make_backend("sdpa", torch.device("cpu"), torch.float32)
    host = pack_batch(batch)
    meta = ForwardMeta.from_buffer(torch.from_numpy(host.packed), host.layout, host.max_seqlen, host)
    cu = host.cu_seqlens
    states = [backend.prepare(meta, causal), _Loop([(int(a), int(b)) for a, b in zip(cu[:-1], cu[1:])])]
    if len(lens) > 1:
        padded = _plan_cpu(cu, causal)
        padded = padded if isinstance(padded, (_Padded, _Uniform)) else None
        states.append(padded)
    meta_no_host = ForwardMeta.from_buffer(torch.from_numpy(host.packed), host.layout, host.max_seqlen)
    states.append(backend.prepare(meta_no_host, causal))
    assert isinstance(states[-1], _BlockMask)
    for state in filter(None, states):
        out = backend.forward(q, k, v, meta, causal, 0.3, state)
        assert torch.allclose(out, expected, atol=1e-5), type(state).__name__


def test_plan_picks_padding_for_similar_lengths_and_loops_for_uneven_ones():
    assert isinstance(_plan_cpu(np.array([0, 10, 21, 30], np.int32), False), _Padded)
    assert isinstance(_plan_cpu(np.array([0, 500, 501, 502, 503], np.int32), False), _Loop)
    assert isinstance(_plan_cpu(np.array([0, 7], np.int32), True), _Loop)
    assert _plan_cpu(np.array([0, 7, 14, 21], np.int32), True) == _Uniform(3)  # equal lengths: no mask


def test_bucket_padding_tokens_do_not_leak_into_real_tokens():
    torch.manual_seed(1)
    batch = Batch.from_sequences([[1] * 4, [1] * 3])
    host = pack_batch(batch, MetaLayout(tokens=12, seqs=5, rows=2))
    q, k, v = torch.randn(12, 2, 8), torch.randn(12, 2, 8), torch.randn(12, 2, 8)
    expected = naive(q[:7], k[:7], v[:7], [4, 3], False, 0.5)
    backend = make_backend("sdpa", torch.device("cpu"), torch.float32)
    for with_host in (True, False):
        meta = ForwardMeta.from_buffer(torch.from_numpy(host.packed), host.layout, 12, host if with_host else None)
        out = backend.forward(q, k, v, meta, False, 0.5, backend.prepare(meta, False))
        assert torch.allclose(out[:7], expected, atol=1e-5) and torch.isfinite(out).all()
