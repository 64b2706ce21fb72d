"""The QK-norm+RoPE kernel's launch geometry (pure Python: runs without a GPU)."""

from __future__ import annotations

import pytest

from rose.layers.fused import qk_block_tokens


@pytest.mark.parametrize("tokens,heads,block", [
    (1, 16, 1), (128, 16, 1), (512, 16, 1),  # few tokens: one token per program keeps every SM busy
    (1024, 16, 2), (2048, 16, 4), (4096, 16, 8), (25600, 16, 8),  # many: 8 tokens x 16 heads per program
    (4096, 32, 4), (4096, 64, 2), (4096, 256, 1),  # wide models: at most 128 head rows per program
])
def test_block_tokens(tokens, heads, block):
    assert qk_block_tokens(tokens, heads) == block


def test_block_tokens_leaves_programs_for_every_sm():
    for tokens in range(1, 20000, 97):
        block = qk_block_tokens(tokens, 16)
        assert block == 1 or -(-tokens // block) >= 264


def test_warmup_precompiles_kernels_and_survives_a_failure(engine_for, caplog, monkeypatch):
    engine = engine_for("qwen3")
    model = engine.runner.model
    assert model.precompile_kernels() == 0  # CPU: nothing to compile
    calls = []

    def failing() -> int:
        calls.append(1)
        raise RuntimeError("no compiler")

    monkeypatch.setattr(model, "precompile_kernels", failing)  # the engine is shared by the session
    engine.warmup()  # the warm-up still passes: variants would compile on first use instead
    assert calls == [1]
    assert "kernel precompile failed" in caplog.text
