"""GTE v1.5 (`NewModel`) and NomicBERT (trust_remote_code models) on the CPU in float32 through ROSE's Engine
(ragged batches) against the references in rose_tiny_remote / rose_tiny_nomic (the published math on padded
batches); their position encodings checked directly; folder rules."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from rose_parity import cosine, random_seqs, reference_rows
from rose_tiny_remote import REMOTE_FAMILIES, gte_config

from rose.engine import Engine

@pytest.mark.parametrize("name", REMOTE_FAMILIES)
def test_embed_matches_the_reference(name, encoder_models, engine_of):
    tiny, engine = encoder_models[name], engine_of(name)
    seqs = random_seqs(tiny, [n for n in (1, 2, 7, 16, 33, 64, 128) if n <= engine.info.max_length], seed=11)
    ours = engine.embed(seqs)
    family, pooling = ("gte", "cls") if name.startswith("gte") else ("nomic-bert", "mean")
    assert ours.shape == (len(seqs), 64) and (engine.info.family, engine.info.pooling) == (family, pooling)
    assert cosine(ours, reference_rows(tiny, seqs)).min() >= 0.9999


@pytest.mark.parametrize("name", REMOTE_FAMILIES)
@pytest.mark.parametrize("pooling", ["mean", "last"])
def test_every_pooling_matches_the_reference(name, pooling, encoder_models, engine_of):
    tiny, engine = encoder_models[name], engine_of(name)
    seqs = random_seqs(tiny, [3, 12, 30, 60], seed=5)
    assert cosine(engine.embed(seqs, pooling=pooling), reference_rows(tiny, seqs, pooling=pooling)).min() >= 0.9999


@pytest.mark.parametrize("name", ["gte", "gte-variant"])
def test_rope_tables_equal_the_published_ntk_tables(name, encoder_models, engine_of):
    """The NTK-scaled cos/sin (fixed, and mixed with mixed_b) ROSE computes per token are the reference's
    table rows: the parity above alone would let a small frequency error through."""
    tiny, model = encoder_models[name], engine_of(name).runner.model
    positions = torch.arange(128)
    cos, sin = model.rotary(positions, torch.float32)
    assert torch.allclose(cos, tiny.hf.cos[:128], atol=1e-6) and torch.allclose(sin, tiny.hf.sin[:128], atol=1e-6)
    plain = 1.0 / 500.0 ** (torch.arange(0, 16, 2).float() / 16)
    assert not torch.allclose(model.rotary.inv_freq, plain)  # the scaling is in effect


def test_a_masked_lm_checkpoint_loads(encoder_models, engine_of, tmp_path):
    """NewForMaskedLM keeps the encoder under `new.` beside its head."""
    from safetensors.torch import load_file, save_file

    tiny = encoder_models["gte"]
    folder = tmp_path / "gte-mlm"
    shutil.copytree(tiny.path, folder)
    weights = {"new." + k: v for k, v in load_file(str(folder / "model.safetensors")).items()}
    weights["lm_head.dense.weight"] = torch.zeros(4, 4)
    save_file(weights, str(folder / "model.safetensors"))
    seqs = random_seqs(tiny, [9, 30], seed=4)
    engine = Engine.from_pretrained(folder, device="cpu")
    assert np.array_equal(engine.embed(seqs), engine_of("gte").embed(seqs))
    engine.close()


def test_missing_fields_take_newconfig_defaults(tmp_path):
    """A config.json without the optional fields builds NewConfig's model: one token type, LayerNorm 1e-12,
    RoPE at 10000 unscaled, packed qkv."""
    from rose.models import build_model
    from rose.spec import load_spec

    cfg = {k: v for k, v in gte_config().items() if k in (
        "architectures", "model_type", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
        "intermediate_size", "max_position_embeddings")}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    spec = load_spec(tmp_path)
    with torch.device("meta"):
        model = build_model(spec)
    names = set(model.state_dict())
    assert "embeddings.token_type_embeddings.weight" in names and "encoder.layer.0.attention.qkv_proj.weight" in names
    assert model.encoder.layer[0].attn_ln.eps == 1e-12
    assert torch.allclose(model.rotary.inv_freq, 1.0 / 10000.0 ** (torch.arange(0, 16, 2).float() / 16))
    assert (spec.family, spec.pooling, spec.max_length) == ("gte", "mean", 128)


@pytest.mark.parametrize("field,value,message", [
    ("logn_attention_scale", True, "logn_attention_scale"),
    ("rope_scaling", {"type": "linear", "factor": 2.0}, "rope_scaling"),
    ("layer_norm_type", "batch_norm", "layer_norm_type"),
    ("position_embedding_type", "alibi", "position_embedding_type"),
    ("prenorm", True, "prenorm"),
    ("rotary_emb_scale_base", 512, "rotary_emb_scale_base"),
])
def test_unsupported_options_are_refused_by_name(field, value, message, encoder_models, tmp_path):
    from rose.spec import ModelFolderError

    name = "nomic" if field in ("prenorm", "rotary_emb_scale_base") else "gte"
    folder = tmp_path / name
    shutil.copytree(encoder_models[name].path, folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg[field] = value
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelFolderError, match=message):
        Engine.from_pretrained(folder, device="cpu")


@pytest.mark.parametrize("name", ["nomic", "nomic-variant"])
def test_nomic_rotation_equals_the_reference(name, encoder_models, engine_of):
    """The rotation of every head at every position (whole head in NeoX halves; half the head in GPT-J pairs)
    equals the reference's: mean pooling over short sequences would let a small error through."""
    tiny, model = encoder_models[name], engine_of(name).runner.model
    x = torch.randn(1, 64, 4, 16, generator=torch.Generator().manual_seed(0))
    ours = model._rotation(torch.arange(64), torch.float32)(x[0])
    ref = tiny.hf._rope(x, tiny.hf.cos[:64], tiny.hf.sin[:64])[0]
    assert torch.allclose(ours, ref, atol=1e-6) and not torch.allclose(ours, x[0], atol=1e-3)
    if name == "nomic-variant":
        assert torch.equal(ours[..., 8:], x[0][..., 8:])  # rotary_emb_fraction 0.5: the rest untouched


def test_nomic_max_length_rules(tmp_path):
    """Plain RoPE (rotary_scaling_factor null) up to n_positions; the dynamic NTK one (set, or absent: its
    default 1.0) only up to max_trained_positions; learned positions (fraction 0) up to n_positions."""
    from rose.spec import load_spec
    from rose_tiny_nomic import nomic_config

    cases = {"plain": ({"n_positions": 8192}, 8192),
             "dynamic": ({"n_positions": 8192, "rotary_scaling_factor": 2.0}, 2048),
             "default": ({"n_positions": 8192}, 2048),
             "learned": ({"rotary_emb_fraction": 0.0, "n_positions": 512}, 512)}
    got = {}
    for case, (overrides, _) in cases.items():
        cfg = nomic_config(**overrides)
        if case == "default":
            del cfg["rotary_scaling_factor"]
        (tmp_path / case).mkdir()
        (tmp_path / case / "config.json").write_text(json.dumps(cfg))
        spec = load_spec(tmp_path / case)
        got[case] = spec.max_length
        assert (spec.family, spec.dimensions, spec.config["num_attention_heads"]) == ("nomic-bert", 64, 4)
    assert got == {case: want for case, (_, want) in cases.items()}
