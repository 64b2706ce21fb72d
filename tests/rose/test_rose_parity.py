"""Parity on CPU in float32 against transformers (pooled by hand) and sentence-transformers."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import FAMILIES
from rose_parity import cosine, hf_hidden, pool, random_seqs, reference_rows

LENGTHS = [1, 2, 7, 16, 33, 64]


@pytest.mark.parametrize("name", FAMILIES)
def test_embed_matches_transformers(name, tiny_models, engine_for):
    tiny, engine = tiny_models[name], engine_for(name)
    seqs = random_seqs(tiny, LENGTHS, seed=11)
    ours = engine.embed(seqs)
    ref = reference_rows(tiny, seqs)
    assert ours.dtype == np.float32 and ours.shape == (len(seqs), 64)
    assert cosine(ours, ref).min() >= 0.9999


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("pooling", ["mean", "cls", "last"])
def test_every_pooling_matches_hand_pooled_hidden_states(name, pooling, tiny_models, engine_for):
    tiny, engine = tiny_models[name], engine_for(name)
    seqs = random_seqs(tiny, [3, 12, 30], seed=5)
    ours = engine.embed(seqs, pooling=pooling)
    ref = reference_rows(tiny, seqs, pooling=pooling)
    assert cosine(ours, ref).min() >= 0.9999



@pytest.mark.parametrize("name", ["roberta", "xlm-roberta"])
def test_a_pad_id_inside_a_text_takes_the_padding_position(name, tiny_models, engine_for):
    """RoBERTa / XLM-R derive positions from the ids: a pad id inside a sequence (a text holding "<pad>", which
    the tokenizer matches as that token) gets the padding position and is not counted by the tokens after it."""
    tiny, engine = tiny_models[name], engine_for(name)
    seqs = random_seqs(tiny, [9, 20, 1, 12], seed=8)
    seqs[0][3] = seqs[1][0] = seqs[1][6] = seqs[1][7] = tiny.pad_id  # one, first, two in a row; then plain ones
    ours = engine.embed(seqs)
    assert cosine(ours, reference_rows(tiny, seqs)).min() >= 0.9999
    assert np.allclose(engine.embed(seqs[:2]), ours[:2], atol=1e-5)  # the same alone as packed

def test_family_settings_come_from_the_folder(engine_for):
    assert engine_for("bert").info.pooling == "mean" and engine_for("bert").info.normalize_default
    assert engine_for("xlm-roberta").info.pooling == "cls"
    qwen = engine_for("qwen3")
    assert (qwen.info.pooling, qwen.info.normalize_default, qwen.spec.causal) == ("last", True, True)
    assert "query" in qwen.spec.prompts
    pplx = engine_for("pplx-qwen3")
    assert (pplx.info.family, pplx.info.pooling, pplx.info.native_int8, pplx.info.normalize_default) == (
        "pplx-qwen3", "mean", True, False)
    assert not pplx.spec.causal


def test_pplx_native_output_is_round_127_tanh_of_the_mean(tiny_models, engine_for):
    from rose import Batch

    tiny, engine = tiny_models["pplx-qwen3"], engine_for("pplx-qwen3")
    seqs = random_seqs(tiny, [5, 20, 48], seed=3)
    native = engine.step(Batch.from_sequences(seqs, "mean")).result()
    expected = np.round(127.0 * np.tanh(np.stack([h.mean(0) for h in hf_hidden(tiny, seqs)])))
    assert np.all(native == np.round(native)) and np.abs(native).max() <= 127
    assert np.abs(native - expected).max() <= 1.0  # a value on a .5 boundary may round either way
    assert np.mean(native == expected) >= 0.99
    assert np.array_equal(engine.embed(seqs), native)  # embed() returns the int8 values, not normalized


def test_bidirectional_qwen3_differs_from_causal(tiny_models, engine_for):
    """The pplx reference really is non-causal: the same weights with a causal mask give other vectors."""
    from rose_parity import hf_hidden as hidden

    tiny = tiny_models["pplx-qwen3"]
    seqs = random_seqs(tiny, [24], seed=9)
    bidir = hidden(tiny, seqs)[0]
    tiny.bidirectional_mask = False
    try:
        causal = hidden(tiny, seqs)[0]
    finally:
        tiny.bidirectional_mask = True
    assert cosine(bidir[:1], causal[:1])[0] < 0.99  # the first token sees only itself when causal
    ours = engine_for("pplx-qwen3").embed(seqs)
    assert cosine(ours, reference_rows(tiny, seqs, hidden=[bidir]))[0] >= 0.9999
    assert cosine(ours, reference_rows(tiny, seqs, hidden=[causal]))[0] < 0.999


def test_tiny_models_match_sentence_transformers(tiny_models, engine_for):
    st = pytest.importorskip("sentence_transformers")
    for name in ("bert", "xlm-roberta", "qwen3"):
        tiny, engine = tiny_models[name], engine_for(name)
        model = st.SentenceTransformer(str(tiny.path), device="cpu")
        seqs = random_seqs(tiny, [4, 9, 21], seed=2)
        for seq, ours in zip(seqs, engine.embed(seqs)):  # one at a time: no padding in the reference
            ids = torch.tensor([seq])
            with torch.no_grad():
                ref = model({"input_ids": ids, "attention_mask": torch.ones_like(ids)})["sentence_embedding"][0]
            assert cosine(ours[None], ref.numpy()[None])[0] >= 0.9999, name


@pytest.mark.slow
def test_bundled_minilm_matches_sentence_transformers(minilm_path):
    st = pytest.importorskip("sentence_transformers")
    from rose.engine import Engine

    texts = ["hello world", "The quick brown fox jumps over the lazy dog.",
             "Embeddings map text to vectors; similar texts land close together.", "ROSE " * 60]
    engine = Engine.from_pretrained(minilm_path, device="cpu")
    assert engine.info.model_id == "sentence-transformers/all-MiniLM-L6-v2"
    ours = engine.embed([e.ids for e in engine.tokenizer.encode_batch(texts)])
    ref = st.SentenceTransformer(minilm_path, device="cpu").encode(texts)
    assert ours.shape == ref.shape == (4, 384)
    assert cosine(ours, ref).min() >= 0.9999
    engine.close()


def test_sentencepiece_only_folder(tiny_spm):
    from rose.engine import Engine

    engine = Engine.from_pretrained(tiny_spm.path, device="cpu")
    assert not (tiny_spm.path / "tokenizer.json").exists()
    ids = [e.ids for e in engine.tokenizer.encode_batch(["hello world", "the quick brown fox jumps"])]
    assert all(i[0] == 0 and i[-1] == 2 for i in ids)  # <s> ... </s> in fairseq numbering
    assert cosine(engine.embed(ids), reference_rows(tiny_spm, ids)).min() >= 0.9999
    engine.close()


def test_hidden_pooling_helper_is_what_the_reference_uses():
    h = np.arange(12, dtype=np.float64).reshape(4, 3)
    assert np.allclose(pool(h, "mean"), [4.5, 5.5, 6.5]) and np.allclose(pool(h, "cls"), h[0])
    assert np.allclose(pool(h, "last"), h[-1])
