"""Cross-encoder rerankers (issue 16) on the CPU in fp32: BERT / XLM-R sequence classification against
sentence-transformers' CrossEncoder.predict (its tokenization of pairs and its activation), Qwen3-Reranker's
yes/no head against the model card's recipe on the transformers model; scores within 1e-4. Pairs are packed
ragged like any batch, the head runs inside the captured forward, and folders ROSE would score differently
from sentence-transformers are refused by name."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from fake_cuda import attach_graphs
from rose_cross_models import (PAIRS, build_all_cross, cross_encoder_scores, qwen3_recipe_ids, qwen3_yes_probability,
                               random_pair_ids)

from rose import Batch
from rose.graph_checks import GraphVerificationError, check_replay
from rose.meta import BatchError
from rose.spec import ModelFolderError, load_spec

pytest.importorskip("sentence_transformers")
CLASSIFIERS = ("bert-ce", "bert-ce-identity", "xlmr-ce")
YES_NO = ("qwen3-reranker", "qwen3-reranker-tied")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    return build_all_cross(tmp_path_factory.mktemp("cross-encoders"))


def pair_scores(engine, pairs, output: str | None = None) -> np.ndarray:
    encoded = engine.tokenizer.encode_pairs(pairs)
    return engine.embed([p.ids for p in encoded], token_types=[p.type_ids for p in encoded], output=output)[:, 0]


@pytest.mark.parametrize("name", CLASSIFIERS)
def test_classifier_scores_match_cross_encoder_predict(name, folders, engines):
    engine = engines[name]
    assert max(len(p.ids) for p in engine.tokenizer.encode_pairs(PAIRS)) == engine.spec.max_length  # one is cut
    got, ref = pair_scores(engine, PAIRS), cross_encoder_scores(folders[name], PAIRS)
    assert np.abs(got - ref).max() <= 1e-4, (got, ref)
    assert np.ptp(ref) > 1e-3  # the pairs score differently: a constant output would not pass


@pytest.mark.parametrize("name", ("bert-ce", "xlmr-ce"))
def test_a_sigmoid_rerankers_logit_output_is_cross_encoder_predict_without_its_activation(name, folders, engines):
    """The raw scores vLLM's use_activation false and TEI's raw_scores ask for: the logit beside the score."""
    engine = engines[name]
    assert [o.name for o in engine.info.outputs] == ["score", "logit"]
    got, ref = pair_scores(engine, PAIRS, "logit"), cross_encoder_scores(folders[name], PAIRS, raw=True)
    assert np.abs(got - ref).max() <= 1e-4, (got, ref)
    np.testing.assert_allclose(1 / (1 + np.exp(-got)), pair_scores(engine, PAIRS), atol=1e-6)
    assert np.abs(got - pair_scores(engine, PAIRS)).min() > 1e-2  # not the score again


def test_no_logit_output_where_the_score_is_raw_already(engines):
    assert engines["bert-ce-identity"].info.outputs == ()
    with pytest.raises(ValueError, match="output 'logit'"):
        pair_scores(engines["bert-ce-identity"], PAIRS, "logit")


def test_activation_comes_from_the_folder(folders, engines):
    raw = pair_scores(engines["bert-ce-identity"], PAIRS)  # equal to CrossEncoder's (the test above), and
    assert np.abs(1 / (1 + np.exp(-raw)) - raw).min() > 1e-2  # a sigmoid would have failed it
    assert engines["bert-ce-identity"].spec.score_head.activation == "identity"
    assert engines["bert-ce"].spec.score_head.activation == "sigmoid"  # saved by CrossEncoder 6: Sigmoid
    assert engines["xlmr-ce"].spec.score_head.activation == "sigmoid"  # no ST files, one label: Sigmoid


@pytest.mark.parametrize("name", ("bert-ce", "xlmr-ce"))
@pytest.mark.parametrize("side", ("right", "left"))
def test_pair_tokenization_equals_hf_longest_first(name, side, folders, engines):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(folders[name]))
    hf.truncation_side = side
    for limit in (5, 9, 16, 33, 64):
        ours = engines[name].tokenizer.encode_pairs(PAIRS, max_length=limit, side=side)
        for (a, b), enc in zip(PAIRS, ours):
            theirs = hf(a, b, truncation=True, max_length=limit)
            assert enc.ids == theirs["input_ids"]
            assert enc.type_ids == theirs.get("token_type_ids", [0] * len(enc.ids))
            assert enc.truncated == (enc.original_length > limit)


@pytest.mark.parametrize("name", YES_NO)
def test_yes_no_head_is_p_yes_of_the_last_token(name, folders, engines):
    engine = engines[name]
    seqs = [qwen3_recipe_ids(folders[name], q, d) for q, d in PAIRS]
    got, ref = engine.embed(seqs)[:, 0], qwen3_yes_probability(folders[name], seqs)
    assert np.abs(got - ref).max() <= 1e-4, (got, ref)
    assert np.ptp(ref) > 1e-3
    raw = engine.embed(seqs, output="logit")[:, 0]
    assert np.abs(raw - qwen3_yes_probability(folders[name], seqs, raw=True)).max() <= 1e-4
    rows = engine.runner.score_head[0].rows
    assert tuple(rows.shape) == (2, engine.spec.config["hidden_size"])  # only "yes" and "no" of the lm_head


@pytest.mark.parametrize("name", ("bert-ce", "qwen3-reranker"))
def test_a_pair_scores_the_same_alone_and_packed_ragged(name, engines):
    engine = engines[name]
    rng = np.random.default_rng(5)
    seqs = random_pair_ids(rng, (7, 30, 2, 19, 11))
    types = [[0] * (n // 2) + [1] * (n - n // 2) for n in map(len, seqs)] if name == "bert-ce" else None
    batch = Batch.from_sequences(seqs, engine.spec.pooling, token_types=types)
    assert batch.num_tokens == sum(map(len, seqs))  # back to back: no padding between pairs
    together = engine.runner.step(batch).result()[:, 0]
    alone = [engine.embed([s], token_types=None if types is None else [t])[0, 0]
             for s, t in zip(seqs, types or [None] * len(seqs))]
    np.testing.assert_allclose(together, alone, atol=1e-6)
    if types is not None:  # the types reach the model: all-zero types score differently
        assert np.abs(engine.embed(seqs)[:, 0] - together).max() > 1e-4


@pytest.mark.parametrize("name", ("bert-ce", "qwen3-reranker"))
def test_the_head_runs_inside_the_graph_forward(name, engines, monkeypatch):
    engine = engines[name]
    runner = engine.runner
    seqs = random_pair_ids(np.random.default_rng(6), (20, 12, 8))
    types = [[0] * 5 + [1] * (n - 5) for n in map(len, seqs)] if name == "bert-ce" else None
    # eager at the exact size, before graphs are attached: the native row is the score, then its logit
    ref = np.hstack([engine.embed(seqs, token_types=types, output=o) for o in ("score", "logit")])
    attach_graphs(runner, monkeypatch)
    before = dict(runner.runs)
    for _ in range(3):
        out = runner.step(Batch.from_sequences(seqs, engine.spec.pooling, token_types=types)).result()
        np.testing.assert_allclose(out, ref, atol=1e-6)
    hows = sorted(how for key, n in runner.runs.items() for how in [key[1]] * (n - before.get(key, 0)))
    assert hows == ["capture", "eager", "replay"]


def test_engine_info_says_rerank(engines):
    bert, xlmr, qwen = engines["bert-ce"].info, engines["xlmr-ce"].info, engines["qwen3-reranker"].info
    assert (bert.tasks, bert.dimensions, bert.pooling, bert.type_vocab_size) == (("rerank",), 1, "cls", 2)
    assert (xlmr.tasks, xlmr.type_vocab_size, qwen.tasks, qwen.pooling) == (("rerank",), 1, ("rerank",), "last")
    assert not bert.normalize_default


def test_token_types_outside_the_model_are_refused(engines):
    with pytest.raises(BatchError, match=r"token types must lie in \[0, 1\)"):
        engines["xlmr-ce"].embed([[5, 6, 7]], token_types=[[0, 1, 1]])
    with pytest.raises(BatchError, match=r"\[0, 2\)"):
        engines["bert-ce"].embed([[5, 6, 7]], token_types=[[0, 2, 2]])


def test_graph_check_compares_scores_by_difference():
    eager = np.array([[0.2], [0.9]], np.float32)
    assert check_replay("t", eager + 1e-4, eager) < 1e-3
    with pytest.raises(GraphVerificationError, match="score error"):
        check_replay("t", eager + np.array([[0.0], [0.05]], np.float32), eager)  # a cosine would see 0


def _edit(src, dst, **config):
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg.update(config)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def _write(path, obj):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))


def test_logit_score_folder_uses_its_token_ids(folders, engines, tmp_path):
    """sentence-transformers 6's layout for a causal reranker: Transformer + LogitScore(true, false)."""
    from rose.engine import Engine

    src = folders["qwen3-reranker"]
    dst = tmp_path / "swapped"  # no "reranker" in the name: the LogitScore marks it
    shutil.copytree(src, dst)
    tok = engines["qwen3-reranker"].tokenizer
    _write(dst / "modules.json", [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.base.modules.transformer.Transformer"},
        {"idx": 1, "name": "1", "path": "1_LogitScore",
         "type": "sentence_transformers.cross_encoder.modules.logit_score.LogitScore"}])
    _write(dst / "1_LogitScore" / "config.json", {"true_token_id": tok.token_id("no"), "false_token_id": tok.token_id("yes")})
    seqs = [qwen3_recipe_ids(src, q, d) for q, d in PAIRS[:3]]
    with Engine.from_pretrained(dst, device="cpu") as swapped:
        np.testing.assert_allclose(swapped.embed(seqs)[:, 0], 1 - qwen3_yes_probability(src, seqs), atol=1e-4)
    _write(dst / "1_LogitScore" / "config.json", {"true_token_id": 7, "false_token_id": None})
    with pytest.raises(ModelFolderError, match="false_token_id"):
        load_spec(dst)


def test_which_causal_folders_are_rerankers(folders, tmp_path):
    src = folders["qwen3-reranker"]
    assert load_spec(_edit(src, tmp_path / "qwen3-embedding")).tasks == ("embed",)  # Qwen3-Embedding's case
    flagged = _edit(src, tmp_path / "plain", is_original_qwen3_reranker=True)  # vLLM's hf_overrides key
    assert load_spec(flagged).tasks == ("rerank",)
    seq_cls = _edit(src, tmp_path / "qwen3-seq-cls", architectures=["Qwen3ForSequenceClassification"])
    with pytest.raises(ModelFolderError, match="Qwen3ForSequenceClassification is not served"):
        load_spec(seq_cls)


@pytest.mark.parametrize("change,match", [
    ({"sentence_transformers": {"activation_fn": "my.module.Scaled"}}, "activation_fn 'my.module.Scaled'"),
])
def test_classifier_folders_rose_would_score_differently_are_refused(change, match, folders, tmp_path):
    dst = tmp_path / "bad"
    shutil.copytree(folders["bert-ce-identity"], dst)
    cfg = json.loads((dst / "config.json").read_text())
    for key, value in change.items():
        cfg.pop(key, None) if value is None else cfg.__setitem__(key, value)
    (dst / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelFolderError, match=match):
        load_spec(dst)


@pytest.mark.parametrize("change", [{"id2label": {"0": "a", "1": "b", "2": "c"}},
                                    {"id2label": None, "num_labels": None}])  # transformers' default: two labels
def test_more_labels_make_a_classifier_not_a_reranker(change, folders, tmp_path):
    """Two labels or more: task classify (tests/rose/test_rose_classifiers.py), the logits without the
    CrossEncoder activation; one label stays a reranker."""
    dst = tmp_path / "labels"
    shutil.copytree(folders["bert-ce-identity"], dst)
    cfg = json.loads((dst / "config.json").read_text())
    for key, value in change.items():
        cfg.pop(key, None) if value is None else cfg.__setitem__(key, value)
    (dst / "config.json").write_text(json.dumps(cfg))
    spec = load_spec(dst)
    assert spec.tasks == ("classify",) and spec.score_head.activation == "identity"
    assert spec.dimensions == len(spec.score_head.labels) == len(change.get("id2label") or "ab")
    assert load_spec(folders["bert-ce-identity"]).tasks == ("rerank",)


def test_cross_encoder_modules_and_prompts_past_the_transformer_are_refused(folders, tmp_path):
    dst = tmp_path / "extra"
    shutil.copytree(folders["bert-ce"], dst)
    modules = json.loads((dst / "modules.json").read_text())
    _write(dst / "modules.json", modules + [{"idx": 1, "name": "1", "path": "1_Dense",
                                             "type": "sentence_transformers.base.modules.dense.Dense"}])
    with pytest.raises(ModelFolderError, match=r"'sentence_transformers.base.modules.dense.Dense'.*not applied"):
        load_spec(dst)
    _write(dst / "modules.json", modules)
    st_cfg = json.loads((dst / "config_sentence_transformers.json").read_text())
    _write(dst / "config_sentence_transformers.json", {**st_cfg, "prompts": {"query": "query: "}})
    with pytest.raises(ModelFolderError, match=r"prompts \['query'\]"):
        load_spec(dst)
    _write(dst / "config_sentence_transformers.json", {**st_cfg, "activation_fn": "torch.nn.modules.linear.Identity"})
    assert load_spec(dst).score_head.activation == "identity"  # config_sentence_transformers.json wins


def test_sentencepiece_pairs_are_roberta_pairs_cut_longest_first(tiny_spm):
    """XLM-R folders with only a SentencePiece model: <s> a </s></s> b </s>, all type 0, cut as HF cuts."""
    from rose.tokenizer import Tokenizer, longest_first

    tok = Tokenizer(load_spec(tiny_spm.path))
    a, b = "the quick brown fox jumps", "over the lazy dog " * 4
    ids_a, ids_b = (tok.encode(t, max_length=10_000).ids[1:-1] for t in (a, b))
    whole = tok.encode_pairs([(a, b)], max_length=10_000)[0]
    assert whole.ids == [0, *ids_a, 2, 2, *ids_b, 2] and set(whole.type_ids) == {0} and not whole.truncated
    cut = tok.encode_pairs([(a, b)], max_length=16)[0]
    k1, k2 = longest_first(len(ids_a), len(ids_b), 12)
    assert cut.ids == [0, *ids_a[:k1], 2, 2, *ids_b[:k2], 2] and len(cut.ids) == 16 and cut.truncated
