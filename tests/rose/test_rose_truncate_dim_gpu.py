"""A Matryoshka folder's truncate_dim on the GPU: eager runs, lazy captures and graph replays copy out only the
served width (the runner's copy-out slices the device rows), re-normalized, matching the same folder's fp32 rows
on the CPU. Skipped without CUDA; run on the device (`pytest -m gpu tests/rose`)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from rose_parity import cosine
from rose_st_folders import build_classic_dense

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_truncate_dim_rows_from_graph_replays_match_the_cpu(tmp_path_factory) -> None:
    from rose.engine import Engine

    root = tmp_path_factory.mktemp("truncate-dim-gpu")
    path = root / "truncated"
    shutil.copytree(build_classic_dense(root), path)
    config_path = path / "config_sentence_transformers.json"
    config = json.loads(config_path.read_text()) if config_path.exists() else {}
    config_path.write_text(json.dumps({**config, "truncate_dim": 8}))
    rng = np.random.default_rng(3)
    sequences = [[int(x) for x in rng.integers(5, 256, size=n)] for n in (3, 9, 21, 40)]

    cpu = Engine.from_pretrained(path, device="cpu", dtype=torch.float32)
    gpu = Engine.from_pretrained(path, device="cuda", graph_manifest=None, kernel_manifest=None)
    try:
        ref = cpu.embed(sequences)
        rounds = [gpu.embed(sequences) for _ in range(4)]  # eager, the capture (2nd occurrence), then replays
        hows = {how for (_, how), n in gpu.stats()["runs"].items() if n}
        assert "replay" in hows, gpu.stats()["runs"]
        for rows in rounds:
            assert rows.shape == (len(sequences), 8)
            assert cosine(rows, ref).min() >= 0.999
            assert np.allclose(np.linalg.norm(rows, axis=1), 1.0, atol=1e-3)
    finally:
        gpu.close()
        cpu.close()
