"""The FlashInfer backend's planning logic on any machine, against a stand-in for FlashInfer's ragged prefill
wrapper that checks the calling contract (int32 host indptrs of Sb + 1 entries, fixed batch size and rows in
CUDA-graph mode, split-KV off) and attends with SDPA. The real kernels are tested on the GPU
(test_rose_attention_backends.py)."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from rose import Batch
from rose.attention import AttentionBackendError, AttentionShape
from rose.meta import ForwardMeta, MetaLayout, pack_batch

MADE: list = []  # every FakeWrapper built, in order


class FakeWrapper:
    def __init__(self, float_ws, kv_layout="NHD", use_cuda_graph=False, qo_indptr_buf=None, kv_indptr_buf=None,
                 backend="auto"):
        assert kv_layout == "NHD" and backend in ("fa2", "fa3")
        self.graph, self.qo_buf, self.rows, self.int_ws, self.cu = use_cuda_graph, qo_indptr_buf, None, None, None
        MADE.append(self)

    def reset_workspace_buffer(self, float_ws, int_ws):
        self.int_ws = int_ws

    def plan(self, qo_indptr, kv_indptr, num_qo_heads, num_kv_heads, head_dim_qk, causal=False, sm_scale=None,
             q_data_type=None, kv_data_type=None, non_blocking=True, disable_split_kv=False):
        assert qo_indptr.dtype == torch.int32 and qo_indptr.device.type == "cpu" and torch.equal(qo_indptr, kv_indptr)
        assert disable_split_kv, "split-KV needs a float workspace ROSE does not size for"
        if self.graph:
            assert len(qo_indptr) == len(self.qo_buf), "CUDA-graph mode fixes the batch size"
            self.rows = self.rows or int(qo_indptr[-1])
            assert int(qo_indptr[-1]) <= self.rows, "CUDA-graph mode fixes the rows of the first plan"
        self.cu, self.causal, self.scale = qo_indptr.clone(), causal, sm_scale

    def run(self, q, k, v):
        out = torch.zeros_like(q)
        for a, b in zip(self.cu[:-1].tolist(), self.cu[1:].tolist()):
            if b > a:
                o = F.scaled_dot_product_attention(q[a:b].transpose(0, 1), k[a:b].transpose(0, 1), v[a:b].transpose(0, 1),
                                                   is_causal=self.causal, scale=self.scale, enable_gqa=True)
                out[a:b] = o.transpose(0, 1)
        return out


@pytest.fixture
def backend(monkeypatch):
    from rose.attention import flashinfer

    class Event:
        def record(self):
            pass

        def synchronize(self):
            pass

    MADE.clear()
    monkeypatch.setitem(sys.modules, "flashinfer", SimpleNamespace(BatchPrefillWithRaggedKVCacheWrapper=FakeWrapper))
    monkeypatch.setattr(flashinfer, "check_supported", lambda *args: None)
    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    return flashinfer.FlashInferBackend(torch.device("cpu"), torch.float32, AttentionShape(4, 2, 16, causal=True))


def meta(lengths, layout=None, graph=True):
    """graph=True: a meta as rose.graphs captures and replays with (bucket layout, max_seqlen = its bound)."""
    host = pack_batch(Batch.from_sequences([[1] * n for n in lengths]), layout)
    bound = host.layout.seqlen_bound if graph else host.max_seqlen
    m = ForwardMeta.from_buffer(torch.from_numpy(host.packed), host.layout, bound, host)
    m.graph = graph  # explicit: graph vs eager is never guessed from the shapes
    return m


def attend(backend, m):
    gen = torch.Generator().manual_seed(m.layout.tokens)
    q, k, v = (torch.randn(m.layout.tokens, h, 16, generator=gen) for h in (4, 2, 2))
    backend.plan(m)
    out = backend.forward(q, k, v, m, True, 0.25, backend.prepare(m, True))
    real = m.host.num_tokens
    lengths = np.diff(m.host.cu_seqlens[: m.host.num_seqs + 1]).tolist()  # read-only for a lone query: numpy
    ref = torch.cat([F.scaled_dot_product_attention(q[a:a + n].transpose(0, 1), k[a:a + n].transpose(0, 1),
                                                    v[a:a + n].transpose(0, 1), is_causal=True, scale=0.25,
                                                    enable_gqa=True).transpose(0, 1)
                     for a, n in zip(m.host.cu_seqlens[:-1].tolist(), lengths)])
    assert torch.allclose(out[:real], ref, atol=1e-5)


def test_graph_layouts_get_fixed_wrappers_and_eager_batches_share_one(backend):
    layout = MetaLayout(64, 4, 4, max_seqlen=32)
    for lengths in ([30, 20], [10, 10, 10], [32, 32]):  # same graph layout, re-planned per batch
        attend(backend, meta(lengths, layout))
    attend(backend, meta([100, 20], MetaLayout(128, 4, 4, max_seqlen=128)))
    attend(backend, meta([7, 9, 3], graph=False))  # exact-size eager batches
    attend(backend, meta([40, 41], graph=False))
    graph = [w for w in MADE if w.graph]
    assert len(graph) == 2 and all(w.int_ws is not None and w.int_ws.numel() >= 1 << 20 for w in graph)
    assert len([w for w in MADE if not w.graph]) == 1


def test_forward_needs_a_plan_for_its_layout_and_the_planned_mask(backend):
    m = meta([5, 6], MetaLayout(16, 4, 2))
    q = torch.zeros(16, 4, 16)
    with pytest.raises(AttentionBackendError, match="plan"):
        backend.forward(q, q[:, :2], q[:, :2], m, True, 0.25)
    backend.plan(m)
    with pytest.raises(AttentionBackendError, match="causal"):
        backend.prepare(m, False)
    with pytest.raises(AttentionBackendError, match="scale"):
        backend.forward(q, q[:, :2], q[:, :2], m, True, 0.5)
    with pytest.raises(AttentionBackendError, match="HostMeta"):
        backend.plan(ForwardMeta.from_buffer(torch.from_numpy(m.host.packed), m.layout, 16))


def test_an_eager_single_sequence_batch_takes_no_graph_wrapper(backend):
    """An exact-size batch of one sequence has max_seqlen == its layout's bound, like a graph meta: it
    must still share the eager wrapper, not take (and fix the shape of) a graph slot."""
    for n in (37, 50, 64):
        attend(backend, meta([n], graph=False))
    assert [w.graph for w in MADE] == [False]


def test_graph_layouts_past_the_cap_refuse_to_plan_and_run_eagerly(backend, monkeypatch):
    from rose.attention import flashinfer

    monkeypatch.setattr(flashinfer, "MAX_GRAPH_WRAPPERS", 3)
    for tokens in (16, 32, 64):
        attend(backend, meta([tokens - 5], MetaLayout(tokens, 2, 2, max_seqlen=tokens)))
    late = MetaLayout(96, 2, 2, max_seqlen=96)
    with pytest.raises(AttentionBackendError, match="graph wrappers are taken"):
        backend.plan(meta([90], late))  # a clear refusal at plan time, which the graph runner turns into eager
    attend(backend, meta([90], late, graph=False))  # the same layout eagerly: the eager wrapper serves it
    attend(backend, meta([20], MetaLayout(32, 2, 2, max_seqlen=32)))  # layouts that have a wrapper keep it
    assert len([w for w in MADE if w.graph]) == 3 and len([w for w in MADE if not w.graph]) == 1
