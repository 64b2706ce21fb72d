"""The zoo's GTE v1.5 and NomicBERT folders (benchmarks/model_zoo_remote.py), built here at a fraction of
their widths: ROSE reads them as those families and embeds as the test suite's references do, and
benchmarks.rose_gpu runs them without an HF baseline (there is none offline)."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from benchmarks import model_zoo, model_zoo_remote


@pytest.fixture
def small_remote(monkeypatch):
    small = {"gte-base-en-v1.5": ("gte", dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                              intermediate_size=96, vocab_size=30528)),
             "nomic-embed-text-v1.5": ("nomic", dict(n_embd=64, n_layer=2, n_head=4, n_inner=96, vocab_size=30528))}
    monkeypatch.setattr(model_zoo_remote, "REMOTE_MODELS", small)
    return small


def test_the_zoo_names_match_the_remote_models() -> None:
    assert set(model_zoo.REMOTE_NAMES) == set(model_zoo_remote.REMOTE_MODELS)
    assert model_zoo_remote.REMOTE_MODELS["gte-base-en-v1.5"][1]["hidden_size"] == 768
    assert model_zoo_remote.REMOTE_MODELS["nomic-embed-text-v1.5"][1]["n_layer"] == 12


@pytest.mark.parametrize("name,family,pooling", [("gte-base-en-v1.5", "gte", "cls"),
                                                 ("nomic-embed-text-v1.5", "nomic-bert", "mean")])
def test_rose_serves_the_remote_folders_as_their_family(tmp_path, small_remote, name, family, pooling) -> None:
    from rose.engine import Engine

    path = model_zoo.make_folder(name, tmp_path / name, "float32")  # what benchmarks.rose_gpu builds
    engine = Engine.from_pretrained(path, device="cpu")
    assert engine.info.family == family and engine.info.pooling == pooling
    ids = [[(1000 + 37 * i + j) % 30000 + 1 for j in range(n)] for i, n in enumerate((17, 9))]
    got = engine.embed(ids)
    engine.close()
    tiny = model_zoo_remote.build_remote_model(name, tmp_path / name)  # the same folder, with its reference
    sys.path.insert(0, str(model_zoo_remote.TESTS_ROSE))
    from rose_parity import cosine, reference_rows

    assert np.all(cosine(got, reference_rows(tiny, ids)) > 0.9999)
