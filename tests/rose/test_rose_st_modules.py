"""sentence-transformers pipelines past Transformer + Pooling (issue 16): Dense and Normalize applied in the
classic layout and the one sentence-transformers 6 writes, on the CPU in fp32 against sentence-transformers
on the same weights; a module or setting ROSE does not apply is refused at load, naming it."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from fake_cuda import attach_graphs
from rose_parity import cosine
from rose_st_folders import build_classic_dense, build_st6, edit_config, st_rows, with_module

from rose import Batch
from rose.spec import ModelFolderError, load_spec

st = pytest.importorskip("sentence_transformers")
ST6 = int(st.__version__.split(".")[0]) >= 6


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("st-layouts")
    out = {"classic": build_classic_dense(root)}
    if ST6:
        out["st6"] = build_st6(root, "st6-dense", "cls", [(64, 32, True, "Tanh")], normalize=True)
        out["st6-chain"] = build_st6(root, "st6-chain", "lasttoken", [(64, 48, False, "Identity"), (48, 24, True, "GELU")],
                                     normalize=False, seed=23)
    return out


def seqs(seed=4, lengths=(1, 3, 9, 21, 40)):
    rng = np.random.default_rng(seed)
    return [[int(x) for x in rng.integers(5, 256, size=n)] for n in lengths]


CASES = [("classic", "mean", 32, True), ("st6", "cls", 32, True), ("st6-chain", "last", 24, False)]


@pytest.mark.parametrize("name,pooling,dims,normalize", CASES)
def test_dense_and_normalize_match_sentence_transformers(name, pooling, dims, normalize, folders, engines):
    if name not in folders:
        pytest.skip("the installed sentence-transformers is not 6.x: no ST6 layout to save")
    engine, sequences = engines[name], seqs()
    assert (engine.info.pooling, engine.info.dimensions, engine.info.normalize_default) == (pooling, dims, normalize)
    ours, ref = engine.embed(sequences), st_rows(folders[name], sequences)
    assert ours.shape == ref.shape == (len(sequences), dims)
    assert cosine(ours, ref).min() >= 0.9999
    if normalize:
        assert np.allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)
    else:  # nothing rescales the Dense output: the values themselves match
        assert np.allclose(ours, ref, rtol=1e-4, atol=1e-5)


def test_st6_folder_is_the_layout_sentence_transformers_6_writes(folders):
    if "st6" not in folders:
        pytest.skip("the installed sentence-transformers is not 6.x")
    path = folders["st6"]
    types = [m["type"] for m in json.loads((path / "modules.json").read_text())]
    assert types[0].startswith("sentence_transformers.base.modules.") and types[2].endswith(".Dense")
    assert types[1].startswith("sentence_transformers.sentence_transformer.modules.")
    pooling = json.loads((path / "1_Pooling" / "config.json").read_text())
    assert pooling["pooling_mode"] == "cls" and "embedding_dimension" in pooling
    assert not any(k.startswith("pooling_mode_") for k in pooling)
    assert (path / "2_Dense" / "model.safetensors").is_file()


def test_dense_runs_inside_the_graph_forward(folders, engines, monkeypatch):
    """The captured forward includes Dense: eager warm-up, capture and replay all give the ST rows."""
    name = "st6" if "st6" in folders else "classic"
    engine = engines[name]
    runner = engine.runner
    attach_graphs(runner, monkeypatch)
    sequences = seqs(seed=9, lengths=(20, 12, 8))
    ref = st_rows(folders[name], sequences)
    before = dict(runner.runs)
    for _ in range(3):
        native = runner.step(Batch.from_sequences(sequences, engine.spec.pooling)).result()
        assert native.shape == (3, 32) and cosine(native, ref).min() >= 0.9999
    hows = sorted(how for key, n in runner.runs.items() for how in [key[1]] * (n - before.get(key, 0)))
    assert hows == ["capture", "eager", "replay"]


def test_classic_pooling_keys_and_defaults(folders, tmp_path):
    classic = folders["classic"]
    cls = edit_config(classic, tmp_path / "cls", "1_Pooling", pooling_mode_mean_tokens=False, pooling_mode_cls_token=True)
    assert load_spec(cls).pooling == "cls"
    none_set = edit_config(classic, tmp_path / "none", "1_Pooling", pooling_mode_mean_tokens=False)
    assert load_spec(none_set).pooling == "mean"  # sentence-transformers' default when no mode is on
    st6_keys = edit_config(classic, tmp_path / "st6keys", "1_Pooling", pooling_mode="lasttoken", embedding_dimension=64)
    assert load_spec(st6_keys).pooling == "last"  # pooling_mode wins over the legacy booleans, as in ST6
    spec = load_spec(classic)
    assert spec.dimensions == 32 and spec.normalize and [d.activation for d in spec.dense] == ["tanh"]



def test_max_seq_length_is_the_length_sentence_transformers_cuts_at(folders, tmp_path):
    """sentence_bert_config.json's max_seq_length becomes the tokenizer's model_max_length in sentence-transformers
    (tokenizer_config.json's is then not read): a smaller one there does not cut the texts shorter."""
    from rose.tokenizer import Tokenizer

    path = tmp_path / "longer"
    shutil.copytree(folders["classic"], path)
    config = json.loads((path / "tokenizer_config.json").read_text())
    (path / "tokenizer_config.json").write_text(json.dumps({**config, "model_max_length": 32}))
    (path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 48, "do_lower_case": False}))
    model = st.SentenceTransformer(str(path), device="cpu")
    text = "the quick brown fox jumps over the lazy dog " * 10
    spec = load_spec(path)
    assert spec.max_length == model.max_seq_length == 48
    assert Tokenizer(spec).encode(text).ids == model.tokenizer(text, truncation=True)["input_ids"]

@pytest.mark.parametrize("module_type,folder", [
    ("sentence_transformers.models.LayerNorm", "3_LayerNorm"),
    ("sentence_transformers.sentence_transformer.modules.layer_norm.LayerNorm", "3_LayerNorm"),
    ("sentence_transformers.models.WordEmbeddings", "3_WordEmbeddings"),
    ("sentence_transformers.sentence_transformer.modules.cnn.CNN", "3_CNN"),
    ("sentence_transformers.models.WeightedLayerPooling", "1_WeightedLayerPooling"),
    ("my_package.heads.MatryoshkaScaler", "4_Scaler"),
])
def test_a_module_rose_does_not_apply_is_refused_by_name(module_type, folder, folders, tmp_path):
    bad = with_module(folders["classic"], tmp_path / "bad", module_type, folder, {"dim": 32}, at=3)
    with pytest.raises(ModelFolderError) as err:
        load_spec(bad)
    assert module_type in str(err.value) and folder in str(err.value) and "not applied" in str(err.value)
    with pytest.raises(ModelFolderError):  # the engine refuses it too: it reads the same spec
        from rose.engine import Engine

        Engine.from_pretrained(bad, device="cpu")


@pytest.mark.parametrize("changes,named", [
    ({"pooling_mode_mean_tokens": False, "pooling_mode_max_tokens": True}, "'max'"),
    ({"pooling_mode_mean_sqrt_len_tokens": True, "pooling_mode_mean_tokens": False}, "'mean_sqrt_len_tokens'"),
    ({"pooling_mode": "weightedmean"}, "'weightedmean'"),
    ({"pooling_mode": ["cls", "mean"]}, "concatenated"),
    ({"pooling_mode_cls_token": True}, "concatenated"),  # mean and cls both on: ST concatenates them
])
def test_a_pooling_rose_does_not_apply_is_refused_by_name(changes, named, folders, tmp_path):
    bad = edit_config(folders["classic"], tmp_path / "pool", "1_Pooling", **changes)
    with pytest.raises(ModelFolderError, match="unsupported pooling") as err:
        load_spec(bad)
    assert named in str(err.value) and "1_Pooling" in str(err.value)


@pytest.mark.parametrize("changes,named", [
    ({"activation_function": "my_pkg.Swish"}, "my_pkg.Swish"),
    ({"use_residual": True}, "use_residual"),
    ({"in_features": 48}, "in_features=48"),
    ({"module_input_name": "token_embeddings"}, "token_embeddings"),
])
def test_a_dense_setting_rose_does_not_apply_is_refused(changes, named, folders, tmp_path):
    bad = edit_config(folders["classic"], tmp_path / "dense", "2_Dense", **changes)
    with pytest.raises(ModelFolderError) as err:
        load_spec(bad)
    assert named in str(err.value) and "2_Dense" in str(err.value)


def test_dense_without_activation_is_tanh_as_in_sentence_transformers(folders, tmp_path):
    spec = load_spec(edit_config(folders["classic"], tmp_path / "noact", "2_Dense", activation_function=None))
    assert spec.dense[0].activation == "tanh"


def test_module_order_rose_cannot_follow_is_refused(folders, tmp_path):
    after = with_module(folders["classic"], tmp_path / "after", "sentence_transformers.models.Dense", "4_Dense",
                        {"in_features": 32, "out_features": 16})
    with pytest.raises(ModelFolderError, match="after Normalize"):
        load_spec(after)
    prompts = edit_config(folders["classic"], tmp_path / "prompt", "1_Pooling", include_prompt=False)
    (prompts / "config_sentence_transformers.json").write_text(json.dumps({"prompts": {"query": "query: "}}))
    with pytest.raises(ModelFolderError, match="include_prompt"):
        load_spec(prompts)


def test_truncate_dim_serves_the_width_sentence_transformers_encodes(folders, tmp_path):
    """config_sentence_transformers.json's truncate_dim (sentence-transformers' Matryoshka default) is the width
    served: ST's encode() cuts its vectors there, ROSE did not (16 wide where ST gave 8). ROSE's rows are ST's
    re-normalized (ST cuts after its Normalize module, so its cut vectors are shorter than 1): the same direction,
    what a cosine or a dot product of unit vectors reads; a bad value is refused at load, naming it."""
    from rose.engine import Engine

    name = "st6" if "st6" in folders else "classic"
    path = tmp_path / "truncated"
    shutil.copytree(folders[name], path)
    config_path = path / "config_sentence_transformers.json"
    config = json.loads(config_path.read_text()) if config_path.exists() else {}
    config_path.write_text(json.dumps({**config, "truncate_dim": 8}))
    sequences = seqs(seed=5)
    model = st.SentenceTransformer(str(path), device="cpu")
    assert model.truncate_dim == 8
    ref = model.encode([model.tokenizer.decode(s) for s in sequences[:1]])  # encode() is where ST cuts
    assert ref.shape == (1, 8)
    engine = Engine.from_pretrained(path, device="cpu", dtype=torch.float32)
    assert engine.spec.dimensions == engine.info.dimensions == 8
    ours = engine.embed(sequences)
    full = st_rows(path, sequences)  # the pipeline's rows, before encode() cuts them
    assert ours.shape == (len(sequences), 8)
    assert cosine(ours, full[:, :8]).min() >= 0.9999
    assert np.allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)
    for bad in (0, 33, "8", 2.5):
        config_path.write_text(json.dumps({**config, "truncate_dim": bad}))
        with pytest.raises(ModelFolderError, match="truncate_dim"):
            load_spec(path)
