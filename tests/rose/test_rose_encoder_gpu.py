"""ModernBERT, MPNet, DistilBERT and GTE v1.5 on the GPU: bf16 parity with transformers fp32 (divergence <= 0.1 %) per
backend, varlen == SDPA, batch invariance, bucket padding, and the CUDA-graph path (capture, replay, prewarm
verification) against the fp32 reference; ModernBERT's local layers on the backend's own window (varlen,
triton), not the banded path.
Skipped without CUDA; run on the H200 (`pytest -m gpu tests/rose`).
"""

from __future__ import annotations

import pytest
import torch
from rose_tiny_encoders import ENCODER_FAMILIES
from rose_tiny_remote import REMOTE_FAMILIES

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

BAR = 1e-3
FAMILIES = ENCODER_FAMILIES + REMOTE_FAMILIES


@pytest.fixture(scope="module")
def report():
    import gpu_report

    return gpu_report


@pytest.fixture(scope="module")
def base_shapes(tiny_root):
    from rose_tiny_encoders import build_base_shapes

    return build_base_shapes(tiny_root)


@pytest.mark.parametrize("attention", ["sdpa", "varlen"])
@pytest.mark.parametrize("name", FAMILIES)
def test_bf16_parity_with_transformers_fp32(name, attention, encoder_models, report):
    assert report.check_parity(encoder_models[name], attention)["divergence"] <= BAR


@pytest.mark.parametrize("name", FAMILIES)
def test_varlen_equals_sdpa(name, encoder_models, report):
    assert report.check_backends_agree(encoder_models[name])["divergence"] <= BAR


@pytest.mark.parametrize("name", FAMILIES)
def test_batch_invariance_on_gpu(name, encoder_models, report):
    assert report.check_batch_invariance(encoder_models[name])["divergence"] <= BAR


@pytest.mark.parametrize("attention", ["sdpa", "varlen"])
@pytest.mark.parametrize("name", FAMILIES)
def test_bucket_padding_on_gpu(name, attention, encoder_models, report):
    assert report.check_bucket_padding(encoder_models[name], attention)["divergence"] <= BAR


@pytest.mark.parametrize("attention", ["sdpa", "varlen"])
@pytest.mark.parametrize("name", ["modernbert-base-shape", "mpnet-base-shape"])
def test_real_widths_long_sequences(name, attention, base_shapes, report):
    assert report.check_parity(base_shapes[name], attention, lengths=report.LONG_LENGTHS)["divergence"] <= BAR


@pytest.mark.parametrize("name", FAMILIES)
def test_lazy_capture_then_replay_matches_transformers(name, encoder_models, tmp_path):
    """The same layout four times: eager, capture, replay, replay; every run within the bar of HF fp32."""
    from rose_parity import cosine, random_seqs, reference_rows

    from rose import Batch
    from rose.engine import Engine

    tiny = encoder_models[name]
    engine = Engine.from_pretrained(tiny.path, device="cuda", prewarm=(), graph_manifest=tmp_path / "m.json")
    hows = []
    for i in range(4):  # 40 tokens, 3 sequences, longest 20: layout t64s4p4m64
        seqs = random_seqs(tiny, [20, 12, 8], seed=i)
        before = dict(engine.runner.runs)
        rows = engine.step(Batch.from_sequences(seqs, engine.spec.pooling)).result()
        assert 1.0 - cosine(rows, reference_rows(tiny, seqs, device="cuda")).min() <= BAR, i  # cosine: scale-free
        hows += [k[1] for k, v in engine.runner.runs.items() if v > before.get(k, 0) and k[0].startswith("t64s4p4m")]
    assert hows == ["eager", "capture", "replay", "replay"]
    assert engine.stats()["graphs_captured"] == 1 and engine.stats()["captures_failed"] == 0
    engine.close()


@pytest.mark.parametrize("name", ["mpnet", "mpnet-base-shape"])
def test_mpnet_on_triton_adds_its_bias_in_the_kernel(name, encoder_models, base_shapes, tmp_path):
    """attention "triton": MPNet's relative position bias added inside ROSE's ragged kernel (forward_biased, one
    call per layer), never the banded path; one layout eager, captured, replayed, each within the bar of HF fp32."""
    from rose_parity import cosine, random_seqs, reference_rows

    from rose import Batch
    from rose.engine import Engine
    from rose.models import mpnet

    tiny = {**encoder_models, **base_shapes}[name]
    engine = Engine.from_pretrained(tiny.path, device="cuda", dtype="bfloat16", attention="triton", prewarm=(),
                                    graph_manifest=tmp_path / "m.json")
    backend, calls, layers = engine.runner.backend, [], len(engine.runner.model.encoder.layer)
    forward_biased = backend.forward_biased
    backend.forward_biased = lambda *a, **k: calls.append(1) or forward_biased(*a, **k)
    banded = mpnet.banded_attention
    mpnet.banded_attention = lambda *a, **k: pytest.fail("MPNet took the banded path on triton")
    hows = []
    try:
        for i in range(3):
            longest = 300 if name == "mpnet-base-shape" else 100  # 300: past the buckets' +-128 (the clamp)
            seqs = random_seqs(tiny, [longest, 70, 33, 1], seed=i)
            before = dict(engine.runner.runs)
            rows = engine.step(Batch.from_sequences(seqs, engine.spec.pooling)).result()
            assert 1.0 - cosine(rows, reference_rows(tiny, seqs, device="cuda")).min() <= BAR, i
            hows += [k[1] for k, v in engine.runner.runs.items() if v > before.get(k, 0)]
    finally:
        mpnet.banded_attention = banded
        engine.close()
    assert hows == ["eager", "capture", "replay"]
    assert calls and len(calls) % layers == 0


@pytest.mark.parametrize("name", ["modernbert-base-shape", "mpnet-base-shape"])
def test_prewarm_captures_and_verifies_real_widths(name, base_shapes):
    from rose.engine import Engine

    engine = Engine.from_pretrained(base_shapes[name].path, device="cuda", prewarm=[(128, 1), (1024, 4), (2048, 8)],
                                    graph_manifest=None)
    verified = engine.warmup()
    assert [(v.layout.tokens, v.layout.seqs) for v in verified] == [(128, 1), (1024, 4), (2048, 8)]
    assert all(v.max_divergence <= BAR for v in verified)
    assert engine.stats()["graphs_captured"] == 3
    engine.close()


@pytest.mark.parametrize("attention", ["varlen", "triton"])
@pytest.mark.parametrize("name", ["modernbert", "modernbert-base-shape"])
def test_modernbert_local_layers_take_the_backend_s_window(name, attention, encoder_models, base_shapes,
                                                        local_attention_paths, tmp_path):
    """bf16 on varlen (FlashAttention's window (w, w)) or triton (ROSE's kernel, its window both ways): the local
    layers run the backend's window, never the banded path; one layout eager, captured, replayed, each within
    the bar of HF fp32 (sequences past the window: 8 / 64 each way)."""
    from rose_parity import cosine, random_seqs, reference_rows

    from rose import Batch
    from rose.attention.varlen import VarlenBackend
    from rose.engine import Engine

    if attention == "varlen":
        assert VarlenBackend.bidirectional_window, "this torch's varlen_attn has no window_size"
    tiny = {**encoder_models, **base_shapes}[name]
    engine = Engine.from_pretrained(tiny.path, device="cuda", dtype="bfloat16", attention=attention, prewarm=(),
                                    graph_manifest=tmp_path / "m.json")
    paths = local_attention_paths(engine.runner.backend)
    local = sum(layer.local for layer in engine.runner.model.layers)
    hows = []
    for i in range(3):
        seqs = random_seqs(tiny, [100, 70, 33, 1], seed=i)
        before = dict(engine.runner.runs)
        rows = engine.step(Batch.from_sequences(seqs, engine.spec.pooling)).result()
        assert 1.0 - cosine(rows, reference_rows(tiny, seqs, device="cuda")).min() <= BAR, i
        hows += [k[1] for k, v in engine.runner.runs.items() if v > before.get(k, 0)]
        if i == 0:
            assert paths == ["window"] * local  # the eager run: one windowed call per local layer
    engine.close()
    assert hows == ["eager", "capture", "replay"]
    assert local > 0 and set(paths) == {"window"}  # the capture recorded the window path too, never banded
