"""GPU parity (bf16, divergence <= 0.1 %), varlen == SDPA, batch invariance, bucket padding, LazyTensor.

Skipped without CUDA; run on the H200 (`pytest -m gpu tests/rose`, or gpu_report.py for the table).
"""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

FAMILIES = ("bert", "roberta", "xlm-roberta", "qwen3", "pplx-qwen3")
BAR = 1e-3


@pytest.fixture(scope="module")
def report():
    import gpu_report

    return gpu_report


@pytest.mark.parametrize("attention", ["sdpa", "varlen"])
@pytest.mark.parametrize("name", FAMILIES)
def test_bf16_parity_with_transformers_fp32(name, attention, tiny_models, report):
    assert report.check_parity(tiny_models[name], attention)["divergence"] <= BAR


@pytest.mark.parametrize("name", FAMILIES)
def test_varlen_equals_sdpa(name, tiny_models, report):
    assert report.check_backends_agree(tiny_models[name])["divergence"] <= BAR


@pytest.mark.parametrize("name", FAMILIES)
def test_batch_invariance_on_gpu(name, tiny_models, report):
    assert report.check_batch_invariance(tiny_models[name])["divergence"] <= BAR


@pytest.mark.parametrize("attention", ["sdpa", "varlen"])
@pytest.mark.parametrize("name", ["bert", "qwen3", "pplx-qwen3"])
def test_bucket_padding_on_gpu(name, attention, tiny_models, report):
    assert report.check_bucket_padding(tiny_models[name], attention)["divergence"] <= BAR


def test_real_widths_qwen3(tiny_root, report):
    from rose_tiny_models import build_qwen3_06b_shape

    for bidirectional in (False, True):
        tiny = build_qwen3_06b_shape(tiny_root, bidirectional)
        for attention in ("sdpa", "varlen"):
            assert report.check_parity(tiny, attention)["divergence"] <= BAR


def test_lazy_tensor_is_pinned_and_evented(tiny_models, report):
    assert report.check_lazy_tensor(tiny_models["bert"])["divergence"] == 0.0


def test_auto_picks_triton_in_bf16(tiny_models):
    """No profile beside the model: auto's default on CUDA is ROSE's Triton kernel for a shape it runs."""
    from rose.engine import Engine

    engine = Engine.from_pretrained(tiny_models["qwen3"].path)
    assert (engine.info.device.startswith("cuda"), engine.info.dtype, engine.info.attention_backend) == (
        True, "bfloat16", "triton")
    engine.close()
