"""Decoder embedders on the CPU in float32: EmbeddingGemma (Gemma 3), gte-Qwen2 (Qwen2), e5-mistral (Mistral)
against transformers (pooled by hand, Dense applied) and sentence-transformers, through ROSE's Engine on
ragged batches; their sliding windows, tokenizers and folder settings."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from rose_parity import cosine, random_seqs, reference_rows

from rose.windows import FULL

NAMES = ("gemma3", "qwen2", "mistral")
LENGTHS = [1, 2, 7, 16, 33, 64]


@pytest.fixture(scope="module")
def engines(tiny_decoders):
    from rose.engine import Engine

    out = {name: Engine.from_pretrained(tiny.path, device="cpu") for name, tiny in tiny_decoders.items()}
    yield out
    for engine in out.values():
        engine.close()


@pytest.mark.parametrize("name", NAMES)
def test_embed_matches_transformers(name, tiny_decoders, engines):
    tiny, engine = tiny_decoders[name], engines[name]
    seqs = random_seqs(tiny, LENGTHS, seed=11)
    ours = engine.embed(seqs)
    assert ours.dtype == np.float32 and ours.shape == (len(seqs), 64)
    assert cosine(ours, reference_rows(tiny, seqs)).min() >= 0.9999


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("lengths", [[40], [20, 20, 20], [3, 12, 30, 50]])  # one / equal / mixed lengths
def test_every_cpu_attention_plan_matches(name, lengths, tiny_decoders, engines):
    """SDPA plans a CPU batch three ways (per sequence, one [S, L] view, a padded block): each with the band."""
    tiny = tiny_decoders[name]
    seqs = random_seqs(tiny, lengths, seed=len(lengths))
    for pooling in ("mean", "last"):
        ours = engines[name].embed(seqs, pooling=pooling)
        assert cosine(ours, reference_rows(tiny, seqs, pooling=pooling)).min() >= 0.9999, pooling


@pytest.mark.parametrize("name", NAMES)
def test_device_mask_path_matches(name, tiny_decoders, engines):
    """The block-diagonal mask a CUDA graph uses (no host metadata; padding to a bucket), band included."""
    from rose import Batch
    from rose.meta import ForwardMeta, MetaLayout

    tiny, engine = tiny_decoders[name], engines[name]
    seqs = random_seqs(tiny, [6, 17, 3, 40], seed=4)
    batch = Batch.from_sequences(seqs, engine.spec.pooling)
    host = engine.runner.pack(batch, MetaLayout(tokens=96, seqs=8, rows=8))
    meta = ForwardMeta.from_buffer(torch.from_numpy(host.packed), host.layout, max_seqlen=96)
    with torch.inference_mode():
        rows = engine.runner.forward(meta)[: batch.num_rows].numpy()
    rows = rows / np.linalg.norm(rows, axis=1, keepdims=True)
    assert cosine(rows, reference_rows(tiny, seqs)).min() >= 0.9999


@pytest.mark.parametrize("name", NAMES)
def test_matches_sentence_transformers(name, tiny_decoders, engines):
    """The folder's whole pipeline (Pooling, Dense, Normalize) on one right-padded batch."""
    st = pytest.importorskip("sentence_transformers")
    tiny = tiny_decoders[name]
    model = st.SentenceTransformer(str(tiny.path), device="cpu")
    seqs = random_seqs(tiny, [4, 9, 21, 50], seed=2)
    ids = torch.zeros(len(seqs), max(map(len, seqs)), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, s in enumerate(seqs):
        ids[i, : len(s)], mask[i, : len(s)] = torch.tensor(s), 1
    with torch.no_grad():
        ref = model({"input_ids": ids, "attention_mask": mask})["sentence_embedding"].numpy()
    assert cosine(engines[name].embed(seqs), ref).min() >= 0.9999


@pytest.mark.parametrize("name", ["gemma3", "mistral"])
def test_the_sliding_window_matters(name, tiny_decoders, engines):
    """The windows cross the test sequences: without them the same engine misses the reference."""
    tiny, engine = tiny_decoders[name], engines[name]
    model = engine.runner.model
    seqs = random_seqs(tiny, [48, 64], seed=8)
    ref = reference_rows(tiny, seqs)
    windows = model.windows
    assert any(w != FULL for w in windows)
    model.windows = (FULL,) * len(windows)
    try:
        assert cosine(engine.embed(seqs), ref).min() < 0.999
    finally:
        model.windows = windows
    assert cosine(engine.embed(seqs), ref).min() >= 0.9999


def test_family_settings_come_from_the_folder(engines):
    gemma, qwen2, mistral = engines["gemma3"].spec, engines["qwen2"].spec, engines["mistral"].spec
    assert (gemma.family, gemma.arch, gemma.causal, gemma.pooling, gemma.normalize) == ("gemma3", "gemma3", False,
                                                                                        "mean", True)
    assert [d.out_features for d in gemma.dense] == [128, 64] and gemma.dimensions == 64
    assert gemma.layer_windows == (8, FULL, 8)  # sliding_window 16, bidirectional: |q - k| < 16 // 2 + 1
    assert gemma.prompts["query"] == "task: search result | query: "
    assert (qwen2.family, qwen2.arch, qwen2.causal, qwen2.pooling, qwen2.layer_windows) == (
        "qwen2", "qwen3", True, "last", (FULL, FULL))
    assert (mistral.family, mistral.causal, mistral.pooling, mistral.layer_windows) == ("mistral", True, "last",
                                                                                       (15, 15))
    attn = engines["qwen2"].runner.model.layers[0].self_attn
    assert attn.qkv_proj.bias is not None and attn.o_proj.bias is None and attn.q_norm is None
    assert engines["mistral"].runner.model.layers[0].self_attn.qkv_proj.bias is None


@pytest.mark.parametrize("name", NAMES)
def test_tokenizer_ids_are_the_models(name, tiny_decoders, engines):
    """Gemma and Qwen2: what transformers makes of tokenizer.json. Mistral: also the EOS its tokenizer_config
    asks for (transformers 5 drops it unless both flags are passed, as mteb does for e5-mistral). The generic
    fast class reads these word-level tokenizer.json files as they are (the model's own class would rebuild
    a BPE from them)."""
    from transformers import PreTrainedTokenizerFast

    tiny, engine = tiny_decoders[name], engines[name]
    flags = {"add_bos_token": True, "add_eos_token": True} if name == "mistral" else {}
    ref = PreTrainedTokenizerFast.from_pretrained(str(tiny.path), **flags)
    texts = ["hello world", "the quick brown fox jumps over the lazy dog", ""]
    ours = [e.ids for e in engine.tokenizer.encode_batch(texts)]
    assert ours == [ref(t)["input_ids"] for t in texts]
    eos = {"gemma3": 1, "qwen2": 0, "mistral": 2}[name]
    assert all(ids[-1] == eos for ids in ours), "last-token and mean pooling read the EOS"
    cut = engine.tokenizer.encode("the quick brown fox jumps over the lazy dog " * 40, max_length=16)
    assert len(cut.ids) == 16 and cut.ids[-1] == eos and cut.truncated


def test_config_flags_only_add_what_is_missing(tiny_decoders, engines):
    gemma, mistral = engines["gemma3"].tokenizer, engines["mistral"].tokenizer
    assert [p.name for p in gemma._files] == ["tokenizer.json"]  # tokenizer.json already adds <bos> and <eos>
    assert [p.name for p in mistral._files] == ["tokenizer.json", "tokenizer_config.json"]  # part of the fingerprint
    assert mistral.num_special == 2 and gemma.num_special == 2
