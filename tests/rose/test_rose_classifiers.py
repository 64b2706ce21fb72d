"""Sequence classifiers (num_labels >= 2) on the CPU in fp32: BERT, XLM-R and DistilBERT
*ForSequenceClassification logits against transformers' for texts and pairs in padded batches, within 1e-5; the
head runs inside the captured forward and a text scores the same alone and packed ragged; labels come in
index order; what ROSE would not classify as transformers does is refused by name. Rerankers (one label) are
tests/rose/test_rose_cross_encoders.py's."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from fake_cuda import attach_graphs
from rose_classifier_models import LABELS, PAIRS, TEXTS, build_all_classifiers, hf_logits

from rose import Batch
from rose.graph_checks import GraphVerificationError, check_replay
from rose.head import label_scores
from rose.spec import ModelFolderError, load_spec

NAMES = ("bert-cls", "xlmr-cls", "distilbert-cls")
TOL = 1e-5


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    return build_all_classifiers(tmp_path_factory.mktemp("classifiers"))


def engine_logits(engine, inputs) -> np.ndarray:
    """The engine's rows for texts or pairs (a pair's token types where the model reads them)."""
    tok = engine.tokenizer
    if isinstance(inputs[0], tuple):
        enc = tok.encode_pairs(inputs)
        types = [e.type_ids for e in enc] if engine.spec.type_vocab_size > 1 else None
        return engine.embed([e.ids for e in enc], token_types=types)
    return engine.embed([list(e.ids) for e in tok.encode_batch(inputs)])


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("kind", ("texts", "pairs"))
def test_logits_match_transformers(name, kind, folders, engines):
    engine, inputs = engines[name], TEXTS if kind == "texts" else PAIRS
    ref, ref_ids = hf_logits(folders[name], inputs)
    ours = engine.tokenizer.encode_pairs(inputs) if kind == "pairs" else engine.tokenizer.encode_batch(inputs)
    assert [list(e.ids) for e in ours] == ref_ids  # the same ids, one cut to the model's length
    assert max(map(len, ref_ids)) == engine.spec.max_length
    got = engine_logits(engine, inputs)
    assert got.shape == (len(inputs), 3)
    assert np.abs(got - ref).max() <= TOL, (got, ref)
    assert np.ptp(ref, axis=0).min() > 1e-2  # the inputs classify differently: a constant output would not pass


def test_spec_and_info_say_classify_with_the_labels(engines):
    for name in NAMES:
        info, head = engines[name].info, engines[name].spec.score_head
        assert (info.tasks, info.dimensions, info.pooling) == (("classify",), 3, "cls"), name
        assert head.labels == ("joy", "anger", "fear") and head.activation == "identity", name
        assert not info.normalize_default
    assert engines["xlmr-cls"].spec.score_head.multi_label and not engines["bert-cls"].spec.score_head.multi_label
    assert [engines[n].info.type_vocab_size for n in NAMES] == [2, 1, 1]  # BERT's pairs carry types


@pytest.mark.parametrize("name", ("bert-cls", "distilbert-cls"))
def test_an_input_classifies_the_same_alone_and_packed_ragged(name, engines):
    engine = engines[name]
    enc = engine.tokenizer.encode_pairs(PAIRS)
    seqs = [e.ids for e in enc]
    types = [e.type_ids for e in enc] if engine.spec.type_vocab_size > 1 else None
    batch = Batch.from_sequences(seqs, engine.spec.pooling, token_types=types)
    assert batch.num_tokens == sum(map(len, seqs))  # back to back: no padding between inputs
    together = engine.runner.step(batch).result()
    alone = np.concatenate([engine.embed([s], token_types=None if types is None else [t])
                            for s, t in zip(seqs, types or [None] * len(seqs))])
    np.testing.assert_allclose(together, alone, atol=TOL)  # logits, not [0, 1] scores: fp32 sums differ by ~2e-6


@pytest.mark.parametrize("name", ("bert-cls", "xlmr-cls"))
def test_the_head_runs_inside_the_graph_forward(name, engines, monkeypatch):
    engine = engines[name]
    runner = engine.runner
    seqs = [list(e.ids) for e in engine.tokenizer.encode_batch(TEXTS[:4])]
    ref = engine.embed(seqs)  # eager at the exact size, before graphs are attached
    attach_graphs(runner, monkeypatch)
    runner.graphs.scores = True  # what attach_score_head sets on a real runner's graphs
    before = dict(runner.runs)
    for _ in range(3):
        out = runner.step(Batch.from_sequences(seqs, engine.spec.pooling)).result()
        np.testing.assert_allclose(out, ref, atol=1e-6)
        assert out.shape == (4, 3)
    hows = sorted(how for key, n in runner.runs.items() for how in [key[1]] * (n - before.get(key, 0)))
    assert hows == ["capture", "eager", "replay"]


def test_graph_check_compares_logits_by_difference():
    eager = np.array([[0.01, -0.02, 0.005], [2.0, 1.0, -1.0]], np.float32)
    near = eager + np.array([[0.004, 0.0, 0.0], [0.0, 0.0, 0.0]], np.float32)  # a tiny shift, a large angle
    with pytest.raises(GraphVerificationError, match="cosine"):
        check_replay("t", near, eager)
    assert check_replay("t", near, eager, scores=True) < 1e-2
    with pytest.raises(GraphVerificationError, match="score error"):
        check_replay("t", eager + 0.05, eager, scores=True)


def test_label_scores_are_softmax_sigmoid_or_the_logits():
    logits = np.array([[1.0, -2.0, 0.5], [0.0, 3.0, -1.0]], np.float32)
    t = torch.from_numpy(logits)
    np.testing.assert_allclose(label_scores(logits, multi_label=False), torch.softmax(t, 1).numpy(), atol=1e-6)
    np.testing.assert_allclose(label_scores(logits, multi_label=True), torch.sigmoid(t).numpy(), atol=1e-6)
    assert (label_scores(logits, multi_label=True, raw=True) == logits).all()


def _edited(src, dst, **config):
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    for key, value in config.items():
        cfg.pop(key, None) if value is None else cfg.__setitem__(key, value)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def test_labels_come_in_index_order(folders, tmp_path):
    shuffled = {"2": "fear", "0": "joy", "1": "anger"}  # JSON order is not label order
    assert load_spec(_edited(folders["bert-cls"], tmp_path / "a", id2label=shuffled)).score_head.labels == \
        tuple(LABELS.values())
    unnamed = load_spec(_edited(folders["bert-cls"], tmp_path / "b", id2label=None, label2id=None, num_labels=3))
    assert unnamed.score_head.labels == ("LABEL_0", "LABEL_1", "LABEL_2") and unnamed.dimensions == 3
    default = load_spec(_edited(folders["bert-cls"], tmp_path / "c", id2label=None, label2id=None, num_labels=None))
    assert default.tasks == ("classify",) and default.dimensions == 2  # transformers' default: two labels


@pytest.mark.parametrize("change,match", [
    ({"problem_type": "regression"}, "problem_type 'regression' with 3 labels"),
    ({"id2label": {"0": "a", "1": "b", "5": "c"}}, r"indices 0\.\.2, got \[0, 1, 5\]"),
])
def test_classifier_folders_rose_would_serve_differently_are_refused(change, match, folders, tmp_path):
    with pytest.raises(ModelFolderError, match=match):
        load_spec(_edited(folders["bert-cls"], tmp_path / "bad", **change))


def test_a_distilbert_reranker_stays_refused(folders, tmp_path):
    one = _edited(folders["distilbert-cls"], tmp_path / "one", id2label={"0": "LABEL_0"}, label2id={"LABEL_0": 0})
    with pytest.raises(ModelFolderError, match="DistilBertForSequenceClassification is not served"):
        load_spec(one)
