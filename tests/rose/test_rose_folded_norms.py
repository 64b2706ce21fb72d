"""Folded norms (rose.layers.fused, "Folded norms"): each decoder pre-norm's weight folded into the projection
after it, its row scale applied by the QK and gate kernels, the residual adds inside the o and down GEMMs. On
the CPU in float32 the folded model equals the unfolded one and transformers; the Triton kernels' new variants
run under Triton's interpreter against their torch definitions (fused_interpreted.py, a process of its own)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from rose_parity import cosine, random_seqs, reference_rows

from rose.layers import fused

LENGTHS = [1, 5, 16, 33]


def _engine(path, fold: bool, monkeypatch):
    from rose.engine import Engine

    monkeypatch.setenv("ROSE_FOLD_NORMS", "1" if fold else "0")
    return Engine.from_pretrained(path, device="cpu", graph_manifest=None, kernel_manifest=None)


@pytest.mark.parametrize("name", ["qwen3", "pplx-qwen3"])
def test_folded_qwen3_matches_unfolded_and_transformers(name, tiny_models, monkeypatch):
    tiny = tiny_models[name]
    folded, plain = _engine(tiny.path, True, monkeypatch), _engine(tiny.path, False, monkeypatch)
    try:
        assert folded.runner.model.folded and not plain.runner.model.folded
        layer = folded.runner.model.layers[0]
        gamma = plain.runner.model.layers[0].input_layernorm.weight
        assert not torch.allclose(gamma, torch.ones_like(gamma)), "a fold of ones would prove nothing"
        expect = plain.runner.model.layers[0].self_attn.qkv_proj.weight * gamma[None, :]
        assert torch.allclose(layer.self_attn.qkv_proj.weight, expect), "qkv_proj holds W * gamma"
        seqs = random_seqs(tiny, LENGTHS, seed=3)
        ours, theirs = folded.embed(seqs), plain.embed(seqs)
        assert cosine(ours, theirs).min() >= 0.99999
        assert cosine(ours, reference_rows(tiny, seqs)).min() >= 0.9999
    finally:
        folded.close()
        plain.close()


def test_mistral_folds_and_qwen2_with_biases_does_not(tiny_decoders, monkeypatch):
    mistral, qwen2 = _engine(tiny_decoders["mistral"].path, True, monkeypatch), \
        _engine(tiny_decoders["qwen2"].path, True, monkeypatch)
    try:
        assert mistral.runner.model.folded, "no QK-norm: q and k take the row scale themselves"
        assert not qwen2.runner.model.folded, "q/k/v biases come after the row scale: not foldable"
        for tiny, engine in ((tiny_decoders["mistral"], mistral), (tiny_decoders["qwen2"], qwen2)):
            seqs = random_seqs(tiny, LENGTHS, seed=5)
            assert cosine(engine.embed(seqs), reference_rows(tiny, seqs)).min() >= 0.9999
    finally:
        mistral.close()
        qwen2.close()


def test_torch_row_scale_is_the_norm_applied_first():
    """The CPU definitions: scaling the projection's output by rstd(h) equals projecting the normalized h."""
    g = torch.Generator().manual_seed(0)
    t, hidden, heads, kv_heads, d = 9, 48, 4, 2, 16
    h = torch.randn(t, hidden, generator=g) * 3
    w = torch.randn((heads + 2 * kv_heads) * d, hidden, generator=g) * 0.1
    normed = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
    pos, inv_freq = torch.arange(t), 1.0 / (1e4 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    qw, kw = torch.rand(d, generator=g) + 0.5, torch.rand(d, generator=g) + 0.5
    for norm in ("rms", None):
        ref_qkv, qkv = normed @ w.T, h @ w.T
        q_ref, k_ref = fused.qk_norm_rope(ref_qkv, qw, kw, pos, inv_freq, heads, kv_heads, d, 1e-6, norm=norm)
        q, k = fused.qk_norm_rope(qkv, qw, kw, pos, inv_freq, heads, kv_heads, d, 1e-6, norm=norm, row_scale_of=h)
        assert torch.allclose(q, q_ref, atol=1e-5) and torch.allclose(k, k_ref, atol=1e-5), norm
        v0 = (heads + kv_heads) * d
        assert torch.allclose(qkv[:, v0:], ref_qkv[:, v0:], atol=1e-5), "v scaled in place"
    gu = torch.randn(2 * 32, hidden, generator=g) * 0.1
    assert torch.allclose(fused.silu_mul(h @ gu.T, row_scale_of=h, eps=1e-6), fused.silu_mul(normed @ gu.T),
                          atol=1e-5)
    residual = torch.randn(t, 2 * 32, generator=g)
    lin = torch.nn.Linear(hidden, 2 * 32, bias=True)
    assert torch.allclose(fused.residual_linear(h, lin, residual), residual + lin(h), atol=1e-5)


def test_fold_norms_off_by_environment(monkeypatch):
    for value, on in (("0", False), ("false", False), ("off", False), ("1", True), ("", True)):
        monkeypatch.setenv("ROSE_FOLD_NORMS", value)
        assert fused.fold_norms_enabled() is on, value


@pytest.mark.skipif(fused.triton is None, reason="needs Triton")
def test_row_scale_kernels_under_the_interpreter():
    script = Path(__file__).with_name("fused_interpreted.py")
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.count(": ok") == 10 and "FAIL" not in done.stdout
