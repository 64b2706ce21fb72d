"""Sparse and multi-vector outputs (issue 16) on the CPU in fp32: SPLADE against sentence-transformers'
SparseEncoder, BGE-M3's dense, ColBERT and sparse outputs against its math typed out on the transformers model
(rose_retrieval_models); values within 1e-4. The heads run inside the captured forward; folders ROSE would
serve differently are refused by name."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from fake_cuda import attach_graphs
from rose_retrieval_models import TEXTS, M3Reference, build_bge_m3, build_splade, splade_reference

from rose import Batch
from rose.retrieval_rows import (m3_excluded_ids, maxsim, sparse_from_row, sparse_from_tokens, token_vector_spans,
                                 token_weight_spans)
from rose.spec import ModelFolderError, load_spec

pytest.importorskip("sentence_transformers")
SPLADES = (("relu", "max"), ("log1p_relu", "sum"))


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    root = tmp_path_factory.mktemp("retrieval")
    made = {f"splade-{a}-{s}": build_splade(root, activation=a, strategy=s) for a, s in SPLADES}
    made["bge-m3"] = build_bge_m3(root)
    return made


@pytest.mark.parametrize("activation,strategy", SPLADES)
def test_splade_matches_sparse_encoder(activation, strategy, folders, engines):
    name = f"splade-{activation}-{strategy}"
    engine = engines[name]
    ids = [e.ids for e in engine.tokenizer.encode_batch(TEXTS)]
    rows = engine.embed(ids)
    ref = splade_reference(folders[name], TEXTS)
    assert rows.shape == ref.shape == (len(TEXTS), 256)
    np.testing.assert_allclose(rows, ref, atol=1e-4, rtol=1e-4)
    assert (rows > 0).sum() == (ref > 0).sum()  # the same entries are zero
    indices, values = sparse_from_row(rows[1])
    assert indices == sorted(indices) and np.allclose(values, ref[1][indices], atol=1e-4) and len(indices) == (ref[1] > 0).sum()


def test_splade_info_and_alone_equals_batched(engines):
    engine = engines["splade-relu-max"]
    info = engine.info
    assert (info.tasks, info.dimensions, info.normalize_default) == (("sparse",), 256, False)
    assert [(o.name, o.start, o.width) for o in info.outputs] == [("vocab-weights", 0, 256)]
    ids = [e.ids for e in engine.tokenizer.encode_batch(TEXTS)]
    together = engine.embed(ids)
    for i, seq in enumerate(ids):
        np.testing.assert_allclose(engine.embed([seq])[0], together[i], atol=1e-5)


def test_bge_m3_outputs_match_its_reference(folders, engines):
    engine, ref = engines["bge-m3"], M3Reference(folders["bge-m3"])
    assert engine.info.tasks == ("embed", "multi-vector", "sparse")
    assert [(o.name, o.start, o.width, o.normalize) for o in engine.info.outputs] == [
        ("embed", 0, 64, True), ("token-vectors", 64, 64, True), ("token-weights", 128, 1, False)]
    ids = [e.ids for e in engine.tokenizer.encode_batch(TEXTS)]
    dense = engine.embed(ids)
    for i, seq in enumerate(ids):
        np.testing.assert_allclose(dense[i], ref.dense(seq), atol=1e-4)

    spans = token_vector_spans([len(s) for s in ids])
    vectors = engine.embed(ids, spans=spans, output="token-vectors")
    assert vectors.shape == (sum(len(s) - 1 for s in ids), 64)
    excluded = m3_excluded_ids(folders["bge-m3"], engine.tokenizer)
    assert excluded == {0, 1, 2, 3}
    weight_spans = token_weight_spans(ids, excluded)
    weights = engine.embed(ids, spans=weight_spans, output="token-weights")
    at, wat = 0, 0
    for i, seq in enumerate(ids):
        mine = vectors[at:at + len(seq) - 1]
        at += len(seq) - 1
        np.testing.assert_allclose(mine, ref.colbert_vectors(seq), atol=1e-4)
        kept = [seq[t] for (s, t, _) in weight_spans if s == i]
        indices, values = sparse_from_tokens(kept, weights[wat:wat + len(kept)])
        wat += len(kept)
        expected = ref.lexical_weights(seq)
        assert indices == sorted(expected)
        np.testing.assert_allclose(values, [expected[k] for k in indices], atol=1e-4)
    q, d = ref.colbert_vectors(ids[0]), ref.colbert_vectors(ids[1])
    assert maxsim(vectors[: len(ids[0]) - 1], vectors[len(ids[0]) - 1: len(ids[0]) + len(ids[1]) - 2]) == \
        pytest.approx(float((q @ d.T).max(axis=1).sum() / q.shape[0]), abs=1e-4)


def test_output_names_are_checked(engines):
    with pytest.raises(ValueError, match="token-vectors"):
        engines["bge-m3"].embed([[0, 5, 2]], output="colbert")
    with pytest.raises(ValueError, match="vocab-weights"):
        engines["splade-relu-max"].embed([[2, 5, 3]], output="token-vectors")


@pytest.mark.parametrize("name", ["splade-relu-max", "bge-m3"])
def test_the_heads_run_inside_the_graph_forward(name, engines, monkeypatch):
    engine = engines[name]
    runner = engine.runner
    ids = [e.ids for e in engine.tokenizer.encode_batch(TEXTS[:3])]
    spans = token_vector_spans([len(s) for s in ids]) if name == "bge-m3" else None
    batch = (Batch.from_sequences(ids, spans=spans) if spans else Batch.from_sequences(ids, engine.spec.pooling))
    ref = runner.step(batch, use_graphs=False).result()
    attach_graphs(runner, monkeypatch)
    before = dict(runner.runs)
    for _ in range(3):
        np.testing.assert_allclose(runner.step(batch).result(), ref, atol=1e-5)
    hows = sorted(how for key, n in runner.runs.items() for how in [key[1]] * (n - before.get(key, 0)))
    assert hows == ["capture", "eager", "replay"]


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def test_refused_folders_name_the_file(folders, tmp_path):
    bad = _copy(folders["splade-relu-max"], tmp_path / "splade-extra")
    modules = json.loads((bad / "modules.json").read_text())
    modules.append({"idx": 2, "name": "2", "path": "", "type": "sentence_transformers.sparse_encoder.modules.SparseAutoEncoder"})
    (bad / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(ModelFolderError, match="modules.json.*SpladePooling"):
        load_spec(bad)
    bad = _copy(folders["splade-relu-max"], tmp_path / "splade-mean")
    (bad / "1_SpladePooling" / "config.json").write_text(json.dumps({"pooling_strategy": "mean"}))
    with pytest.raises(ModelFolderError, match="1_SpladePooling.*pooling_strategy='mean'"):
        load_spec(bad)
    half = _copy(folders["bge-m3"], tmp_path / "m3-half")
    (half / "sparse_linear.pt").unlink()
    with pytest.raises(ModelFolderError, match="colbert_linear.pt"):
        load_spec(half)


def test_a_head_file_that_would_run_code_is_refused_naming_it(folders, tmp_path):
    """BGE-M3's colbert_linear.pt is read as the model's weights are (rose.checkpoint: weights_only=True): a pickle
    that names a callable is refused naming the file, and nothing of it runs."""
    from test_rose_pickle_checkpoints import write_malicious

    from rose.engine import Engine

    bad = _copy(folders["bge-m3"], tmp_path / "m3-payload")
    marker = tmp_path / "payload-ran"
    write_malicious(bad / "colbert_linear.pt", marker, "zip")
    with pytest.raises(ModelFolderError, match="colbert_linear.pt: refused"):
        Engine.from_pretrained(bad, device="cpu", dtype=torch.float32)
    assert not marker.exists()
