"""The benchmark zoo's rerankers, SPLADE and BGE-M3 (benchmarks.model_zoo_heads) at tiny widths on the CPU: ROSE
reads each folder as that model (its tasks), its native row matches the HF baseline rose_gpu times beside it
(benchmarks.hf_heads, fp32 here), and rose_gpu's suites run through each, so the device run meets no surprise."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from benchmarks import model_zoo_heads

TINY = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=96)
TASKS = {"ms-marco-minilm-l6": ("rerank",), "bge-reranker-v2-m3": ("rerank",), "qwen3-reranker-0.6b": ("rerank",),
         "splade-cocondenser": ("sparse",), "bge-m3": ("embed", "multi-vector", "sparse")}
QWEN3_TINY = dict(num_key_value_heads=2, head_dim=16)  # Qwen3's grouped heads at TINY's width


@pytest.fixture
def tiny_heads(monkeypatch):
    shrunk = {name: (cfg, cls, {**values, **TINY, **(QWEN3_TINY if cfg == "Qwen3Config" else {}), "vocab_size": 30600,
                                "max_position_embeddings": min(values.get("max_position_embeddings", 512), 514)}, seq)
              for name, (cfg, cls, values, seq) in model_zoo_heads.HEAD_CONFIGS.items()}
    monkeypatch.setattr(model_zoo_heads, "HEAD_CONFIGS", shrunk)
    return shrunk


def _seqs() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.integers(1000, 30000, size=n).astype(np.int32) for n in (40, 7, 100)]


@pytest.mark.parametrize("name", list(TASKS))
def test_head_folders_load_as_their_models_and_match_the_hf_baseline(name, tiny_heads, tmp_path):
    from benchmarks import hf_heads, model_zoo
    from rose import Batch
    from rose.engine import Engine

    folder = model_zoo.make_folder(name, tmp_path / name, "float32")
    seqs = _seqs()
    with Engine.from_pretrained(folder, device="cpu") as engine:
        spec = engine.spec
        assert engine.info.tasks == TASKS[name]
        ours = engine.step(Batch.from_sequences(seqs, spec.pooling)).result()
    if spec.score_head is not None:
        assert spec.score_head.activation == ("identity" if name == "ms-marco-minilm-l6" else "sigmoid")
        assert spec.score_head.kind == ("yes_no" if name == "qwen3-reranker-0.6b" else spec.score_head.kind)
        hf = hf_heads.hf_cross_runner(folder, spec.score_head, "cpu", torch.float32)(seqs)
        assert np.ptp(hf) > 1e-3, "the pairs' scores do not differ: the comparison would show nothing"
        np.testing.assert_allclose(ours[:, 0], hf, atol=1e-4)
        return
    if name == "splade-cocondenser":
        hf = hf_heads.hf_splade_runner(folder, "cpu", torch.float32)(seqs)
        assert ours.shape == hf.shape == (3, 30600) and (hf > 0).any()
        np.testing.assert_allclose(ours, hf, atol=1e-4)
        return
    from transformers import XLMRobertaModel

    model = XLMRobertaModel.from_pretrained(folder).eval()
    assert spec.retrieval.kind == "m3" and ours.shape == (3, 64 + 64 + 1)
    for seq, row in zip(seqs, ours):
        with torch.no_grad():
            cls = model(input_ids=torch.from_numpy(seq.astype(np.int64))[None]).last_hidden_state[0, 0].numpy()
        assert float(row[:64] @ cls / np.linalg.norm(cls)) >= 0.9999  # the dense output: normalized CLS


@pytest.mark.parametrize("name", ["ms-marco-minilm-l6", "qwen3-reranker-0.6b", "splade-cocondenser", "bge-m3"])
def test_rose_gpu_runs_the_head_suites_on_cpu(name, tiny_heads, tmp_path, monkeypatch):
    from benchmarks import rose_gpu

    monkeypatch.setattr(rose_gpu, "DEVICE", "cpu")
    monkeypatch.setattr(rose_gpu, "docs_100", lambda max_len, seed=0: [16, 40, 9])  # the suite's shape, smaller
    records: list = []
    rose_gpu.bench_model(name, tmp_path, True, records, [], [], {"hf-eager", "rose-eager"})
    assert {(r["suite"], r["variant"]) for r in records} == {
        (s, v) for s in ("bs1-128", "docs-100") for v in ("hf-eager", "rose-eager")}
    assert all(r["p50_ms"] > 0 for r in records)
