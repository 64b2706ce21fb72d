"""Clear, typed errors naming the file, the tensor or the unsupported architecture."""

from __future__ import annotations

import json
import shutil

import pytest
from safetensors.torch import load_file, save_file

from rose.attention import AttentionBackendError
from rose.engine import Engine
from rose.loader import WeightLoadError
from rose.spec import ModelFolderError


@pytest.fixture
def bert_copy(tiny_models, tmp_path):
    path = tmp_path / "bert"
    shutil.copytree(tiny_models["bert"].path, path)
    return path


def test_missing_config_json_names_the_file(bert_copy):
    (bert_copy / "config.json").unlink()
    with pytest.raises(ModelFolderError, match=r"config\.json: file not found"):
        Engine.from_pretrained(bert_copy, device="cpu")


def test_missing_folder(tmp_path):
    with pytest.raises(ModelFolderError, match="model folder not found"):
        Engine.from_pretrained(tmp_path / "nope", device="cpu")


def test_unsupported_model_type_names_the_architecture(bert_copy):
    cfg = json.loads((bert_copy / "config.json").read_text())
    cfg.update(model_type="gpt2", architectures=["GPT2Model"])
    (bert_copy / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelFolderError, match=r"unsupported architecture model_type='gpt2' \['GPT2Model'\]"):
        Engine.from_pretrained(bert_copy, device="cpu")


def test_missing_tensor_is_named(bert_copy):
    weights = load_file(str(bert_copy / "model.safetensors"))
    del weights["encoder.layer.1.attention.self.key.weight"]
    save_file(weights, str(bert_copy / "model.safetensors"))
    with pytest.raises(WeightLoadError, match=r"'encoder\.layer\.1\.attention\.self\.key\.weight' not found in model\.safetensors"):
        Engine.from_pretrained(bert_copy, device="cpu")


def test_wrong_shape_is_named(bert_copy):
    weights = load_file(str(bert_copy / "model.safetensors"))
    weights["encoder.layer.0.output.dense.weight"] = weights["encoder.layer.0.output.dense.weight"][:, :64].contiguous()
    save_file(weights, str(bert_copy / "model.safetensors"))
    with pytest.raises(WeightLoadError, match=r"'encoder\.layer\.0\.output\.dense\.weight' has shape \(64, 64\)"):
        Engine.from_pretrained(bert_copy, device="cpu")


def test_missing_weights_file(bert_copy):
    (bert_copy / "model.safetensors").unlink()
    (bert_copy / "tf_model.h5").write_bytes(b"")
    with pytest.raises(WeightLoadError, match=r"no model\.safetensors, model\.safetensors\.index\.json, pytorch_model\.bin "
                                              r"or pytorch_model\.bin\.index\.json \(found tf_model\.h5"):
        Engine.from_pretrained(bert_copy, device="cpu")


def test_missing_shard_is_named(tiny_models, tmp_path):
    path = tmp_path / "qwen3"
    shutil.copytree(tiny_models["qwen3"].path, path)
    (path / "model-00003-of-00008.safetensors").unlink()
    with pytest.raises(WeightLoadError, match=r"model-00003-of-00008\.safetensors: shard named in"):
        Engine.from_pretrained(path, device="cpu")


def test_missing_tokenizer(bert_copy):
    (bert_copy / "tokenizer.json").unlink()
    with pytest.raises(ModelFolderError, match="no tokenizer.json"):
        Engine.from_pretrained(bert_copy, device="cpu")


def test_attention_and_device_choices(tiny_models):
    path = tiny_models["bert"].path
    with pytest.raises(AttentionBackendError, match="unknown attention backend 'flash9'"):
        Engine.from_pretrained(path, device="cpu", attention="flash9")
    with pytest.raises(AttentionBackendError, match="CUDA only"):
        Engine.from_pretrained(path, device="cpu", attention="varlen")
    with pytest.raises(ValueError, match="unsupported dtype"):
        Engine.from_pretrained(path, device="cpu", dtype="int4")
    with pytest.raises(ValueError, match="unsupported device"):
        Engine.from_pretrained(path, device="mps")


def test_closed_engine_refuses_work(tiny_models):
    engine = Engine.from_pretrained(tiny_models["bert"].path, device="cpu")
    engine.close()
    engine.close()
    with pytest.raises(RuntimeError, match="closed"):
        engine.embed([[5, 6]])
