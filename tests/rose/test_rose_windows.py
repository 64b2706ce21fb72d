"""Sliding windows: which layers get one and how far it reaches, read from the real configs as transformers
reads them; SDPA's windowed attention (every CPU plan and the device mask) against attention written out."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rose_parity import attention_written_out

from rose.windows import FULL, layer_windows

# The published configs, as their config.json files hold them (the fields that matter here)
EMBEDDINGGEMMA = {"model_type": "gemma3_text", "num_hidden_layers": 24, "sliding_window": 512,
                  "use_bidirectional_attention": True, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
                  "rope_scaling": None, "_sliding_window_pattern": 6,
                  "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 4}
GTE_QWEN2 = {"model_type": "qwen2", "num_hidden_layers": 28, "sliding_window": 131072, "use_sliding_window": False,
             "max_window_layers": 28}
E5_MISTRAL = {"model_type": "mistral", "num_hidden_layers": 32, "sliding_window": 4096}


def test_embeddinggemma_windows_every_five_of_six_layers():
    windows = layer_windows("gemma3", EMBEDDINGGEMMA, causal=False, max_length=2048)
    assert windows == ((256,) * 5 + (FULL,)) * 4  # |q - k| < 512 // 2 + 1
    without_types = {k: v for k, v in EMBEDDINGGEMMA.items() if k != "layer_types"}
    assert layer_windows("gemma3", without_types, causal=False, max_length=2048) == windows  # the pattern
    assert layer_windows("gemma3", EMBEDDINGGEMMA, causal=True, max_length=2048)[0] == 511  # q - k < 512
    assert layer_windows("gemma3", EMBEDDINGGEMMA, causal=False, max_length=200) == (FULL,) * 24  # masks nothing


def test_qwen2_and_mistral_windows():
    assert layer_windows("qwen2", GTE_QWEN2, causal=True, max_length=8192) == (FULL,) * 28  # use_sliding_window off
    on = {**GTE_QWEN2, "use_sliding_window": True, "sliding_window": 64, "max_window_layers": 20}
    assert layer_windows("qwen2", on, causal=True, max_length=8192) == (FULL,) * 20 + (63,) * 8  # from layer 20 on
    assert layer_windows("mistral", E5_MISTRAL, causal=True, max_length=4096) == (FULL,) * 32  # 4096 >= every input
    assert layer_windows("mistral", E5_MISTRAL, causal=True, max_length=32768) == (4095,) * 32
    typed = {**E5_MISTRAL, "layer_types": ["full_attention"] * 32}  # MistralModel ignores layer_types
    assert layer_windows("mistral", typed, causal=True, max_length=32768) == (4095,) * 32
    with pytest.raises(ValueError, match="bidirectional"):
        layer_windows("pplx-qwen3", on, causal=False, max_length=8192)
    with pytest.raises(ValueError, match="layer_types"):
        layer_windows("qwen2", {**on, "layer_types": ["full_attention"]}, causal=True, max_length=8192)


def test_gemma_rope_bases_in_both_config_layouts():
    from rose.models.gemma3 import rope_thetas

    assert rope_thetas(EMBEDDINGGEMMA) == (10000.0, 1000000.0)
    v5 = {"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                              "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}}
    assert rope_thetas(v5) == (1e4, 1e6)
    with pytest.raises(ValueError, match="linear"):
        rope_thetas({**EMBEDDINGGEMMA, "rope_scaling": {"rope_type": "linear", "factor": 8.0}})


def test_a_bidirectional_qwen_with_a_window_is_refused_by_name(tmp_path):
    import json

    from rose.spec import ModelFolderError, load_spec

    cfg = {"model_type": "qwen3", "use_bidirectional_attention": True, "hidden_size": 64, "num_hidden_layers": 2,
           "num_attention_heads": 4, "vocab_size": 256, "use_sliding_window": True, "sliding_window": 8}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelFolderError, match="config.json: sliding-window attention in a bidirectional"):
        load_spec(tmp_path)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("lengths", [[40], [20, 20, 20], [3, 12, 30, 50], [5, 6]])  # loop, uniform, padded, inside
def test_sdpa_window_matches_attention_written_out(lengths, causal):
    from rose.attention.sdpa import SdpaBackend
    from rose.batch import Batch
    from rose.meta import ForwardMeta, pack_batch

    gen = torch.Generator().manual_seed(len(lengths))
    t, window, scale = sum(lengths), 7, 0.3
    q, k, v = (torch.randn(t, h, 16, generator=gen) for h in (4, 2, 2))
    host = pack_batch(Batch.from_sequences([np.ones(n, np.int32) for n in lengths]))
    want = attention_written_out(q, k, v, lengths, causal, window, scale)
    backend = SdpaBackend(torch.device("cpu"))
    for with_host in (True, False):  # the CPU plans, and the device mask a CUDA graph uses
        meta = ForwardMeta.from_buffer(torch.from_numpy(host.packed), host.layout, host.max_seqlen,
                                       host if with_host else None)
        got = backend.forward(q, k, v, meta, causal, scale, backend.prepare(meta, causal, window), window)
        assert torch.allclose(got.double(), want, atol=1e-5), with_host
