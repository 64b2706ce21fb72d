"""The encoder families' benchmark folders (benchmarks.model_zoo) and their rose_gpu run, on a CPU at tiny widths:
the published configs' layout with fewer, narrower layers, so the device run finds no folder or suite bug."""

from __future__ import annotations

import json

import numpy as np
import pytest

from benchmarks import model_zoo

TINY = dict(num_hidden_layers=1, hidden_size=64, num_attention_heads=4, intermediate_size=96)
TINY_DISTILBERT = dict(n_layers=1, dim=64, n_heads=4, hidden_dim=96)


@pytest.fixture
def tiny_zoo(monkeypatch):
    shrunk = {name: (cfg, cls, {**values, **(TINY_DISTILBERT if name == "distilbert-base" else TINY)}, max_seq)
              for name, (cfg, cls, values, max_seq) in model_zoo.ENCODER_CONFIGS.items()}
    monkeypatch.setattr(model_zoo, "ENCODER_CONFIGS", shrunk)
    return shrunk


@pytest.mark.parametrize("name", ["modernbert-base", "mpnet-base", "distilbert-base", "bert-large"])
def test_encoder_folders_load_in_rose_and_transformers_alike(name, tiny_zoo, tmp_path):
    import torch
    from transformers import AutoModel

    from rose.engine import Engine

    folder = model_zoo.make_folder(name, tmp_path / name, "float32")
    engine = Engine.from_pretrained(folder, device="cpu")
    assert (engine.info.family, engine.info.pooling, engine.info.normalize_default) == (name.split("-")[0], "mean", True)
    assert engine.info.max_length == tiny_zoo[name][3] and json.loads((folder / "config.json").read_text())
    ids = [e.ids for e in engine.tokenizer.encode_batch(["hello world", "the quick brown fox " * 20])]
    ours = engine.embed(ids)
    hf = AutoModel.from_pretrained(folder).eval()
    for seq, row in zip(ids, ours):
        with torch.no_grad():
            hidden = hf(input_ids=torch.tensor([seq])).last_hidden_state[0].mean(0).numpy()
        assert float(row @ hidden / np.linalg.norm(hidden)) >= 0.9999
    engine.close()


def test_rose_gpu_runs_the_encoder_suites_on_cpu(tiny_zoo, tmp_path, monkeypatch):
    from benchmarks import rose_gpu

    monkeypatch.setattr(rose_gpu, "DEVICE", "cpu")
    monkeypatch.setattr(rose_gpu, "docs_100", lambda max_len, seed=0: [16, 40, 9])  # the suite's shape, smaller
    records: list = []
    rose_gpu.bench_model("mpnet-base", tmp_path, True, records, [], [], {"hf-eager", "rose-eager"})
    assert {(r["suite"], r["variant"]) for r in records} == {
        (s, v) for s in ("bs1-128", "docs-100") for v in ("hf-eager", "rose-eager")}
    assert all(r["p50_ms"] > 0 for r in records)
