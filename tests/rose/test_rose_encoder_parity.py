"""ModernBERT, MPNet and DistilBERT on the CPU in float32 through ROSE's Engine (ragged batches) against
transformers (pooled by hand) and sentence-transformers; their tokenizers as Ivy runs them."""

from __future__ import annotations

import copy
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
from rose_parity import cosine, hf_hidden, random_seqs, reference_rows
from rose_tiny_encoders import ENCODER_FAMILIES

LENGTHS = [1, 2, 7, 16, 33, 64]
TEXTS = ["hello world", "The quick brown fox jumps over the lazy dog.", "", "Ünïcødé café 東京 🚀",
         "rose tulip ivy embed model token batch graph span " * 12]
@pytest.mark.parametrize("name", ENCODER_FAMILIES)
def test_embed_matches_transformers(name, encoder_models, engine_of):
    tiny, engine = encoder_models[name], engine_of(name)
    seqs = random_seqs(tiny, LENGTHS, seed=11)
    ours = engine.embed(seqs)
    assert ours.dtype == np.float32 and ours.shape == (len(seqs), 64)
    assert cosine(ours, reference_rows(tiny, seqs)).min() >= 0.9999


@pytest.mark.parametrize("name", ENCODER_FAMILIES)
@pytest.mark.parametrize("pooling", ["mean", "cls", "last"])
def test_every_pooling_matches_hand_pooled_hidden_states(name, pooling, encoder_models, engine_of):
    tiny, engine = encoder_models[name], engine_of(name)
    seqs = random_seqs(tiny, [3, 12, 30, 57], seed=5)
    assert cosine(engine.embed(seqs, pooling=pooling), reference_rows(tiny, seqs, pooling=pooling)).min() >= 0.9999


@pytest.mark.parametrize("name", ENCODER_FAMILIES)
def test_ragged_batch_matches_sentence_transformers(name, encoder_models, engine_of):
    """sentence-transformers on one right-padded batch with its mask (its pooling and Normalize modules)."""
    st = pytest.importorskip("sentence_transformers")
    tiny, engine = encoder_models[name], engine_of(name)
    model = st.SentenceTransformer(str(tiny.path), device="cpu")
    seqs = random_seqs(tiny, [4, 9, 21, 50], seed=2)
    width = max(map(len, seqs))
    ids = torch.full((len(seqs), width), tiny.pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, s in enumerate(seqs):
        ids[i, : len(s)], mask[i, : len(s)] = torch.tensor(s), 1
    with torch.no_grad():
        ref = model({"input_ids": ids, "attention_mask": mask})["sentence_embedding"].numpy()
    ours = engine.embed(seqs)
    assert cosine(ours, ref).min() >= 0.9999
    assert np.allclose(np.linalg.norm(ours, axis=1), np.linalg.norm(ref, axis=1), rtol=1e-4)  # normalized or not



def test_mpnet_pad_id_inside_a_text_takes_the_padding_position(encoder_models, engine_of):
    """MPNet derives its absolute positions from the ids as RoBERTa does (padding index 1): a text holding "<pad>"."""
    tiny, engine = encoder_models["mpnet"], engine_of("mpnet")
    seqs = random_seqs(tiny, [9, 20, 12], seed=8)
    seqs[0][3] = seqs[1][0] = seqs[1][6] = seqs[1][7] = 1
    assert cosine(engine.embed(seqs), reference_rows(tiny, seqs)).min() >= 0.9999

def test_family_settings_come_from_the_folder(engine_of):
    settings = {n: (engine_of(n).info.family, engine_of(n).info.pooling, engine_of(n).info.normalize_default)
                for n in ENCODER_FAMILIES}
    assert settings == {"modernbert": ("modernbert", "mean", True), "mpnet": ("mpnet", "mean", True),
                        "distilbert": ("distilbert", "cls", False)}


def test_max_length_and_names_from_config_alone(tmp_path):
    """Without sentence-transformers files: mean pooling, MPNet's positions start after its padding index,
    DistilBERT's own field names give the standard ones."""
    import json

    from rose.spec import load_spec

    configs = {"modernbert": {"model_type": "modernbert", "hidden_size": 768, "num_attention_heads": 12,
                              "max_position_embeddings": 8192},
               "mpnet": {"model_type": "mpnet", "hidden_size": 768, "num_attention_heads": 12,
                         "max_position_embeddings": 514},
               "distilbert": {"model_type": "distilbert", "dim": 768, "n_heads": 12, "n_layers": 6,
                              "hidden_dim": 3072, "max_position_embeddings": 512}}
    got = {}
    for name, cfg in configs.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(cfg))
        spec = load_spec(tmp_path / name)
        got[name] = (spec.arch, spec.pooling, spec.max_length, spec.dimensions, spec.config["num_attention_heads"])
    assert got == {"modernbert": ("modernbert", "mean", 8192, 768, 12), "mpnet": ("mpnet", "mean", 512, 768, 12),
                   "distilbert": ("distilbert", "mean", 512, 768, 12)}


def test_modernbert_local_layers_attend_within_the_window(encoder_models, engine_of):
    """The reference without its window (every layer global) is far from ROSE; with it, equal: the tests
    above exercise the sliding window, not only sequences that fit inside it."""
    tiny = encoder_models["modernbert"]
    seqs = random_seqs(tiny, [64, 40], seed=7)
    ours = engine_of("modernbert").embed(seqs)
    unwindowed = copy.deepcopy(tiny)
    unwindowed.hf = copy.deepcopy(tiny.hf)
    unwindowed.hf.config.local_attention = 1024
    assert cosine(ours, reference_rows(unwindowed, seqs)).max() < 0.999
    assert cosine(ours, reference_rows(tiny, seqs)).min() >= 0.9999


def test_mpnet_through_a_backend_that_adds_the_position_bias(encoder_models):
    """The path MPNet takes with attention "triton" (its kernel adds the bias per head and key - query distance,
    rose.attention.triton_varlen): the model's bias table [heads, 257], its orientation and sign, the scale,
    checked on a CPU through a torch backend that meets the same forward_biased contract (the kernel itself
    meets it under Triton's interpreter, test_rose_triton_attention.py), against transformers."""
    import torch.nn.functional as F

    from rose.attention.sdpa import SdpaBackend
    from rose.engine import Engine

    class BiasedSdpa(SdpaBackend):
        position_bias = True
        calls = 0

        def forward_biased(self, q, k, v, meta, scale, bias):
            BiasedSdpa.calls += 1
            reach, out, cu = bias.shape[1] // 2, torch.zeros_like(q), meta.cu_seqlens.tolist()
            for start, end in zip(cu[:-1], cu[1:]):
                n = torch.arange(end - start)
                mask = bias[:, (n[None, :] - n[:, None]).clamp(-reach, reach) + reach]  # key - query
                seq = (x[start:end].transpose(0, 1)[None] for x in (q, k, v))
                out[start:end] = F.scaled_dot_product_attention(*seq, attn_mask=mask[None].to(q.dtype),
                                                                scale=scale)[0].transpose(0, 1)
            return out

    tiny = encoder_models["mpnet"]
    seqs = random_seqs(tiny, [60, 1, 25, 128], seed=8)  # 128: the tiny folder's longest
    engine = Engine.from_pretrained(tiny.path, device="cpu")
    engine.runner.backend = BiasedSdpa(torch.device("cpu"))
    try:
        ours = engine.embed(seqs)
    finally:
        engine.close()
    assert BiasedSdpa.calls == len(tiny.hf.encoder.layer)
    assert cosine(ours, reference_rows(tiny, seqs)).min() >= 0.9999


def test_mpnet_relative_bias_is_applied(encoder_models, engine_of):
    tiny = encoder_models["mpnet"]
    seqs = random_seqs(tiny, [60, 25], seed=8)
    ours = engine_of("mpnet").embed(seqs)
    unbiased = copy.deepcopy(tiny)
    unbiased.hf = copy.deepcopy(tiny.hf)
    with torch.no_grad():
        unbiased.hf.encoder.relative_attention_bias.weight.zero_()
    assert cosine(ours, reference_rows(unbiased, seqs)).max() < 0.999
    assert cosine(ours, reference_rows(tiny, seqs)).min() >= 0.9999


@pytest.mark.parametrize("name,prefix", [("mpnet", "mpnet."), ("distilbert", "distilbert."), ("modernbert", "model.")])
def test_checkpoints_under_a_wrapper_prefix_load(name, prefix, encoder_models, engine_of, tmp_path):
    """Masked-LM checkpoints (microsoft/mpnet-base, distilbert-base-uncased, ModernBERT-base) keep the encoder
    under a prefix and carry heads ROSE ignores."""
    import shutil

    from safetensors.torch import load_file, save_file

    from rose.engine import Engine

    tiny = encoder_models[name]
    folder = tmp_path / name
    shutil.copytree(tiny.path, folder)
    weights = {prefix + k: v for k, v in load_file(str(folder / "model.safetensors")).items()}
    weights["head.dense.weight"] = torch.zeros(4, 4)
    save_file(weights, str(folder / "model.safetensors"))
    seqs = random_seqs(tiny, [9, 30], seed=4)
    engine = Engine.from_pretrained(folder, device="cpu")
    assert np.array_equal(engine.embed(seqs), engine_of(name).embed(seqs))
    engine.close()


@pytest.mark.parametrize("name", ENCODER_FAMILIES)
def test_tokenizer_matches_transformers_and_ivy_split_encoding(name, encoder_models):
    """ROSE's Tokenizer (what Ivy runs) gives transformers' ids, specials included; truncation keeps them;
    Ivy's split encoder gives the same ids on a long text."""
    from transformers import AutoTokenizer

    from ivy.split_encode import SplitEncoder
    from rose.tokenizer import Tokenizer

    tiny = encoder_models[name]
    ours, ref = Tokenizer.from_dir(tiny.path), AutoTokenizer.from_pretrained(str(tiny.path))
    for text in TEXTS:
        full = ref(text)["input_ids"]
        assert ours.encode(text, max_length=10**6).ids == full, text
        assert ours.encode(text, max_length=8).ids == ref(text, truncation=True, max_length=8)["input_ids"], text
    assert all(i < tiny.hf.config.vocab_size for t in TEXTS for i in ours.encode(t).ids)
    long = " ".join(TEXTS * 40)
    with ThreadPoolExecutor(4) as pool:
        split = SplitEncoder(ours, pool, threads=4, split_chars=200, piece_chars=100, mode="pool")
        assert split.encode_batch([long], max_length=10**6)[0].ids == ours.encode(long, max_length=10**6).ids


def test_hidden_states_reference_sees_padding(encoder_models):
    """The padded reference batch equals each sequence run alone (the masks in hf_hidden are right)."""
    for tiny in encoder_models.values():
        seqs = random_seqs(tiny, [5, 31], seed=1)
        batched = hf_hidden(tiny, seqs)
        alone = [hf_hidden(tiny, [s])[0] for s in seqs]
        assert all(np.allclose(a, b, atol=1e-5) for a, b in zip(batched, alone)), tiny.name


@pytest.mark.parametrize("name", ENCODER_FAMILIES)
def test_bucket_padded_forward_as_a_graph_runs_it(name, encoder_models, engine_of):
    """Padded to a bucket layout, max_seqlen the layout's bound and no host metadata (what a CUDA graph
    captures; SDPA takes its device-side block mask): the rows of the exact batch."""
    from rose import Batch
    from rose.meta import ForwardMeta, MetaLayout

    tiny, engine = encoder_models[name], engine_of(name)
    seqs = random_seqs(tiny, [6, 17, 3, 40], seed=4)
    batch = Batch.from_sequences(seqs, engine.spec.pooling)
    exact = engine.step(batch).result()
    host = engine.runner.pack(batch, MetaLayout(tokens=96, seqs=8, rows=8, max_seqlen=96))
    meta = ForwardMeta.from_buffer(torch.from_numpy(host.packed), host.layout, host.layout.seqlen_bound)
    with torch.inference_mode():
        padded = engine.runner.forward(meta)[: batch.num_rows].numpy()
    assert cosine(exact, padded).min() >= 0.99999
