"""The verification reference: sentence-transformers and plain transformers agree on the same model."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from benchmarks.stack.reference import ReferenceConfig, ReferenceError, compute, main
from benchmarks.stack.verify import cosine_divergence, default_probes, load_reference


def test_a_folder_without_modules_json_needs_a_pooling(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ReferenceError, match="--pooling"):
        compute(ReferenceConfig(model_dir=str(tmp_path), out=str(tmp_path / "r.json")))


def test_not_a_model_folder_is_refused(tmp_path: Path) -> None:
    assert main(["--model-dir", str(tmp_path), "--out", str(tmp_path / "r.json")]) == 2


def test_probes_are_fixed_and_short() -> None:
    probes = default_probes()
    assert probes == default_probes() and len(probes) == 18
    assert all(0 < len(p) <= 400 for p in probes)


@pytest.mark.slow
def test_sentence_transformers_and_mean_pooling_agree(minilm_dir: Path, tmp_path: Path) -> None:
    st_file, tf_file = tmp_path / "st.json", tmp_path / "tf.json"
    assert main(["--model-dir", str(minilm_dir), "--out", str(st_file)]) == 0
    assert main(["--model-dir", str(minilm_dir), "--out", str(tf_file), "--backend", "transformers",
                 "--pooling", "mean"]) == 0
    probes, st, meta = load_reference(st_file)
    _, tf, _ = load_reference(tf_file)
    assert meta["backend"] == "sentence-transformers" and st.shape == (len(probes), 384)
    assert cosine_divergence(st, tf).max() < 1e-5
    # and CLS pooling is a different embedding: the check can tell poolings apart
    cls = compute(ReferenceConfig(model_dir=str(minilm_dir), out="", backend="transformers", pooling="cls"))[1]
    assert cosine_divergence(st, cls).max() > 1e-3


@pytest.mark.slow
def test_last_token_pooling_on_a_tiny_causal_model(minilm_dir: Path, tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    import torch

    torch.manual_seed(0)
    config = transformers.Qwen3Config(vocab_size=30522, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    transformers.Qwen3Model(config).save_pretrained(tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(minilm_dir / name, tmp_path / name)
    out = tmp_path / "ref.json"
    assert main(["--model-dir", str(tmp_path), "--out", str(out), "--pooling", "last"]) == 0
    probes, matrix, meta = load_reference(out)
    assert meta["pooling"] == "last" and matrix.shape == (len(probes), 32)
    assert np.allclose(np.linalg.norm(matrix, axis=1), 1, atol=1e-5)
    mean = compute(ReferenceConfig(model_dir=str(tmp_path), out="", pooling="mean"))[1]
    assert cosine_divergence(matrix, mean).max() > 1e-3
    assert json.loads(out.read_text())["dimensions"] == 32
