"""benchmarks.tokenize_words runs end to end on the bundled tokenizer (its ids checked inside) and writes its
records; a tokenizer the word cache does not take is refused with one line."""

from __future__ import annotations

import json
import shutil

import pytest

from benchmarks import tokenize_words
from rose.spec import bundled_model_dir


def test_it_measures_every_variant_and_the_first_sight(tmp_path, capsys) -> None:
    out = tmp_path / "words.json"
    assert tokenize_words.main(["--runs", "3", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert [r["tokens"] for r in data["records"]] == [128, 512, 4096]
    for r in data["records"]:
        assert {"tokenizers_us", "no_cache_us", "cache_warm_us", "cache_cold_us", "cold_1_group_us"} <= set(r)
    sight = data["first_sight"]
    assert sight["documents"] > 1000 and 0.5 < sight["known_share"] < 1.0
    assert "first sight" in capsys.readouterr().out


def test_a_tokenizer_without_a_word_cache_is_refused(tmp_path) -> None:
    folder = tmp_path / "m"
    shutil.copytree(bundled_model_dir(), folder)
    data = json.loads((folder / "tokenizer.json").read_text())
    data["pre_tokenizer"] = {"type": "Whitespace"}
    (folder / "tokenizer.json").write_text(json.dumps(data))
    with pytest.raises(SystemExit, match="not a tokenizer the word cache takes"):
        tokenize_words.main(["--model-dir", str(folder), "--runs", "3"])


def test_it_measures_a_trained_qwen3_style_bpe(tmp_path) -> None:
    out = tmp_path / "bpe.json"
    assert tokenize_words.main(["--train-bpe", "--runs", "3", "--json", str(out)]) == 0
    assert [r["tokens"] for r in json.loads(out.read_text())["records"]] == [128, 512, 4096]
