"""The benchmark zoo's decoder folders (EmbeddingGemma, gte-Qwen2, e5-mistral), built here at a fraction of
their widths: ROSE reads them as those models (family, pooling, Dense, windows) and embeds as transformers
does, so the device run of benchmarks.rose_gpu meets no surprise."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from benchmarks import model_zoo

SMALL = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128, vocab_size=30600)


@pytest.fixture
def small_zoo(monkeypatch):
    configs = {}
    for name, (cls, cfg, pooling, dense, max_seq) in model_zoo.DECODER_CONFIGS.items():
        small = {**cfg, **SMALL, "num_hidden_layers": 2}
        if "layer_types" in cfg:
            small.update(layer_types=["sliding_attention", "full_attention"], head_dim=16, sliding_window=64)
        configs[name] = (cls, small, pooling, (128, 64) if dense else (), max_seq)
    monkeypatch.setattr(model_zoo, "DECODER_CONFIGS", configs)
    return configs


@pytest.mark.parametrize("name,family,pooling,windows", [
    ("embeddinggemma-300m", "gemma3", "mean", (32, -1)),  # sliding_window 64, bidirectional: |q - k| <= 32
    ("gte-qwen2-1.5b", "qwen2", "last", (-1, -1)),
    ("e5-mistral-7b", "mistral", "last", (-1, -1)),  # its 4096 window covers its 4096-token inputs
])
def test_zoo_decoder_folders_load_as_their_models(name, family, pooling, windows, small_zoo, tmp_path):
    st = pytest.importorskip("sentence_transformers")
    from rose.engine import Engine

    path = model_zoo.make_folder(name, tmp_path / name, dtype="float32")
    engine = Engine.from_pretrained(path, device="cpu")
    spec = engine.spec
    assert (spec.family, spec.pooling, spec.normalize, spec.layer_windows) == (family, pooling, True, windows)
    assert spec.dimensions == 64 and bool(spec.dense) == (family == "gemma3")
    rng = np.random.default_rng(0)
    seqs = [rng.integers(1000, 30000, size=n).astype(np.int32) for n in (100, 7)]
    ours = engine.embed(seqs)
    model = st.SentenceTransformer(str(path), device="cpu")  # the whole pipeline: Pooling, Dense, Normalize
    for seq, row in zip(seqs, ours):
        ids = torch.from_numpy(seq.astype(np.int64))[None]
        with torch.no_grad():
            ref = model({"input_ids": ids, "attention_mask": torch.ones_like(ids)})["sentence_embedding"][0]
        assert float(torch.nn.functional.cosine_similarity(ref.double(), torch.from_numpy(row).double(), dim=0)) >= 0.9999
    engine.close()
