"""SPLADE and BGE-M3 outputs on the device in bf16 through the CUDA-graph path, against the same folders on the
CPU in fp32 (which test_rose_retrieval checks against sentence-transformers / BGE-M3's math)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from rose_retrieval_models import TEXTS, build_bge_m3, build_splade_files

from rose.retrieval_rows import token_vector_spans

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _cos(a, b):
    return (a * b).sum(1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-12)


@pytest.mark.parametrize("builder", [build_splade_files, build_bge_m3])
def test_bf16_graphs_match_cpu_fp32(builder, tmp_path):
    from rose.engine import Engine

    folder = builder(tmp_path)
    with Engine.from_pretrained(folder, device="cpu") as cpu, Engine.from_pretrained(folder, device="cuda") as gpu:
        gpu.warmup()
        ids = [e.ids for e in cpu.tokenizer.encode_batch(TEXTS * 4)]
        for output, spans in [(None, None)] + ([("token-vectors", token_vector_spans([len(s) for s in ids])),
                                                ("token-weights", [(s, 0, 1) for s in range(len(ids))])]
                                               if cpu.spec.retrieval.kind == "m3" else []):
            want = cpu.embed(ids, spans=spans, output=output)
            for _ in range(3):  # the first runs capture, later ones replay
                got = gpu.embed(ids, spans=spans, output=output)
            cos = _cos(got, want)
            print(f"{folder.name} {output or 'default'}: min cosine {cos.min():.6f} max abs {np.abs(got - want).max():.4f}")
            if output == "token-weights":  # one weight per row (often 0): compared by value, bf16's error
                assert np.abs(got - want).max() <= 0.02 * max(1.0, float(np.abs(want).max()))
            else:
                assert cos.min() >= 0.999
        assert any(how == "replay" for (_, how) in gpu.runner.runs), gpu.runner.runs
