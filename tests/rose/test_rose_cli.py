"""`rose info` and `rose embed` in-process, and the torch-free import surface."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np

from rose.cli import main


def test_info_prints_the_engine_info(tiny_models, capsys):
    assert main(["info", str(tiny_models["qwen3"].path), "--device", "cpu"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["family"] == "qwen3" and info["pooling"] == "last" and info["dimensions"] == 64
    assert info["attention_backend"] == "sdpa" and info["dtype"] == "float32" and len(info["tokenizer_fingerprint"]) == 64


def test_embed_prints_one_json_line_per_text(tiny_models, capsys):
    from rose.engine import Engine

    path = str(tiny_models["bert"].path)
    assert main(["embed", path, "hello world", "the lazy dog", "--device", "cpu", "--dimensions", "16"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["text"] for line in lines] == ["hello world", "the lazy dog"]
    vec = np.array(lines[0]["embedding"])
    assert vec.shape == (16,) and abs(np.linalg.norm(vec) - 1) < 1e-4
    engine = Engine.from_pretrained(path, device="cpu")
    full = engine.embed([engine.tokenizer.encode("hello world").ids], options=None)[0]
    assert np.allclose(vec, full[:16] / np.linalg.norm(full[:16]), atol=1e-5)



def test_embed_uses_the_default_prompt_as_sentence_transformers(tiny_models, tmp_path, capsys):
    """config_sentence_transformers.json's default_prompt_name: encode() without a prompt prepends it."""
    import shutil

    import pytest

    st = pytest.importorskip("sentence_transformers")
    path = tmp_path / "prompted"
    shutil.copytree(tiny_models["bert"].path, path)
    (path / "config_sentence_transformers.json").write_text(json.dumps(
        {"prompts": {"query": "rose tulip ", "document": ""}, "default_prompt_name": "query"}))
    assert main(["embed", str(path), "hello world", "--device", "cpu"]) == 0
    vec = np.array(json.loads(capsys.readouterr().out)["embedding"])
    ref = st.SentenceTransformer(str(path), device="cpu").encode(["hello world"])[0]
    assert np.allclose(vec, ref, atol=1e-5)

def test_errors_are_one_line_and_nonzero(tmp_path, capsys):
    assert main(["info", str(tmp_path / "missing"), "--device", "cpu"]) == 1
    assert "model folder not found" in capsys.readouterr().err


def test_smoke_help_names_where_its_default_keys_come_from(capsys):
    """Review: `rose smoke --help` said "default: --prewarm", a flag smoke does not take (`rose smoke DIR --prewarm
    128x1` fails); its default is $ROSE_PREWARM, else EngineConfig's prewarm."""
    import pytest

    from rose.cli import EngineConfig

    with pytest.raises(SystemExit):
        main(["smoke", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "default: --prewarm" not in text and "$ROSE_PREWARM" in text and EngineConfig.prewarm in text, text
    with pytest.raises(SystemExit):  # still no such flag: the help must not send anyone to it
        main(["smoke", "some-dir", "--prewarm", "128x1"])
    assert "unrecognized arguments: --prewarm" in capsys.readouterr().err


def test_gateway_imports_stay_torch_free():
    code = ("import rose, rose.tokenizer, rose.spec, rose.head, rose.batch, rose.flags, rose.cli; import sys; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)
