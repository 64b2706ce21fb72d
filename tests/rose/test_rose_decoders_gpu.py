"""Decoder embedders on the GPU in bf16 (EmbeddingGemma, gte-Qwen2, e5-mistral; divergence <= 0.1 %): parity
with transformers in float32 per attention backend, varlen == SDPA, batch invariance, bucket padding, the
CUDA-graph path (eager warm-up, capture, replays) against transformers, and the real models' attention
shapes on inputs longer than their sliding windows.

Skipped without CUDA; on the H200: `pytest -m gpu tests/rose/test_rose_decoders_gpu.py`.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from rose_parity import attention_written_out, cosine, random_seqs, reference_rows

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

NAMES = ("gemma3", "qwen2", "mistral")
BAR = 1e-3


@pytest.fixture(scope="module")
def report():
    import gpu_report

    return gpu_report


@pytest.fixture(scope="module")
def real_widths(tiny_root):
    from rose_tiny_decoders import build_real_widths

    return build_real_widths(tiny_root)


def divergence(a: np.ndarray, b: np.ndarray) -> float:
    return float(1.0 - cosine(a, b).min())


@pytest.mark.parametrize("attention", ["sdpa", "varlen"])
@pytest.mark.parametrize("name", NAMES)
def test_bf16_parity_with_transformers_fp32(name, attention, tiny_decoders, report):
    assert report.check_parity(tiny_decoders[name], attention)["divergence"] <= BAR


@pytest.mark.parametrize("name", NAMES)
def test_varlen_equals_sdpa(name, tiny_decoders, report):
    assert report.check_backends_agree(tiny_decoders[name])["divergence"] <= BAR


@pytest.mark.parametrize("name", NAMES)
def test_batch_invariance_on_gpu(name, tiny_decoders, report):
    assert report.check_batch_invariance(tiny_decoders[name])["divergence"] <= BAR


@pytest.mark.parametrize("attention", ["sdpa", "varlen"])
@pytest.mark.parametrize("name", NAMES)
def test_bucket_padding_on_gpu(name, attention, tiny_decoders, report):
    assert report.check_bucket_padding(tiny_decoders[name], attention)["divergence"] <= BAR


@pytest.mark.parametrize("name", NAMES)
def test_cuda_graph_replay_matches_transformers(name, tiny_decoders):
    """One layout four times: eager warm-up, capture, two replays; every result against transformers fp32."""
    from rose.engine import Engine

    tiny = tiny_decoders[name]
    engine = Engine.from_pretrained(tiny.path, device="cuda", prewarm=(), graph_manifest=None)
    assert engine.info.attention_backend == "triton", "auto's default on CUDA, sliding windows included"
    assert engine.runner.graphs is not None
    seqs = random_seqs(tiny, [20, 12, 40, 5], seed=6)  # crosses the tiny models' windows (8 and 15)
    ref = reference_rows(tiny, seqs, device="cuda")
    hows = []
    for _ in range(4):
        before = dict(engine.runner.runs)
        assert divergence(engine.embed(seqs), ref) <= BAR
        hows += [k[1] for k, v in engine.runner.runs.items() if v > before.get(k, 0)]
    assert hows == ["eager", "capture", "replay", "replay"]
    assert engine.stats()["graphs_captured"] == 1 and engine.stats()["graphs_refused"] == 0
    engine.close()


@pytest.mark.parametrize("name", NAMES)
def test_prewarm_verifies_graphs(name, tiny_decoders):
    from rose.engine import Engine

    engine = Engine.from_pretrained(tiny_decoders[name].path, device="cuda", prewarm=[(32, 1), (96, 4)],
                                    graph_manifest=None)
    verified = engine.warmup()  # also precompiles the fused QK kernel in the model's norm mode
    assert len(verified) == 2 and all(v.max_divergence <= BAR for v in verified)
    engine.close()


@pytest.mark.parametrize("name,attention", [(n, a) for n in ("gemma3-300m-shape", "qwen2-1.5b-shape", "mistral-7b-shape")
                                            for a in ("sdpa", "varlen", "triton")]
                         + [("qwen2-1.5b-shape", "fa4"), ("mistral-7b-shape", "fa4")])
def test_real_widths_past_the_window(name, attention, real_widths):
    """Head dims 256 / 128, GQA 3:1 / 6:1 / 4:1, and inputs longer than the local windows (256 and 255); triton:
    ROSE's kernel with its window (causal, and EmbeddingGemma-like both ways where the folder says so)."""
    from rose.attention import AttentionBackendError
    from rose.engine import Engine

    tiny = real_widths[name]
    try:
        engine = Engine.from_pretrained(tiny.path, device="cuda", attention=attention)
    except AttentionBackendError as exc:  # fa4 not installed here; the others must run
        if attention != "fa4":
            raise
        pytest.skip(str(exc))
    assert engine.info.attention_backend == attention
    seqs = random_seqs(tiny, [700, 37, 300, 520], seed=3)
    ref = reference_rows(tiny, seqs, device="cuda")
    hows = []
    for _ in range(3):  # eager, capture, replay
        before = dict(engine.runner.runs)
        assert divergence(engine.embed(seqs), ref) <= BAR
        hows += [k[1] for k, v in engine.runner.runs.items() if v > before.get(k, 0)]
    assert hows == ["eager", "capture", "replay"]
    engine.close()


def test_flashinfer_refuses_sliding_windows_and_serves_the_others(tiny_decoders):
    from rose.attention import AttentionBackendError, make_backend
    from rose.spec import load_spec

    device, dtype = torch.device("cuda"), torch.bfloat16
    for name in ("gemma3", "mistral"):
        with pytest.raises(AttentionBackendError, match="sliding-window"):
            make_backend("flashinfer-fa2", device, dtype, load_spec(tiny_decoders[name].path))
    try:
        make_backend("flashinfer-fa2", device, dtype, load_spec(tiny_decoders["qwen2"].path))
    except AttentionBackendError as exc:
        assert "flashinfer" in str(exc).lower() and "sliding" not in str(exc)  # only a missing package


@pytest.mark.parametrize("attention", ["sdpa", "varlen", "fa4", "triton"])
@pytest.mark.parametrize("causal", [False, True])
def test_windowed_attention_matches_attention_written_out(attention, causal):
    """Each backend's sliding window on a ragged batch (sequences shorter and longer than it), bf16."""
    from rose.attention import AttentionBackendError, AttentionShape, make_backend
    from rose.batch import Batch
    from rose.meta import ForwardMeta, pack_batch

    lengths, window, scale = [300, 40, 700, 1], 255, 128 ** -0.5
    try:
        backend = make_backend(attention, torch.device("cuda"), torch.bfloat16,
                               shape=AttentionShape(8, 2, 128, causal, window))
    except AttentionBackendError as exc:  # fa4 not installed here; the others must run
        if attention != "fa4":
            raise
        pytest.skip(str(exc))
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(sum(lengths), h, 128, generator=gen) for h in (8, 2, 2))
    want = attention_written_out(q, k, v, lengths, causal, window, scale)
    host = pack_batch(Batch.from_sequences([np.ones(n, np.int32) for n in lengths]))
    meta = ForwardMeta.from_buffer(torch.from_numpy(host.packed).cuda(), host.layout, host.max_seqlen, host)
    backend.plan(meta)
    qb, kb, vb = (x.cuda().bfloat16() for x in (q, k, v))
    got = backend.forward(qb, kb, vb, meta, causal, scale, backend.prepare(meta, causal, window), window)
    err = float((got.double().cpu() - want).norm() / want.norm())
    assert err < 1e-2, err
