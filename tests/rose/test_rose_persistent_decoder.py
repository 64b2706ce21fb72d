"""The persistent decoder's kernel under Triton's interpreter, against the layer-by-layer forward (the cases are
in persistent_interpreted.py, run in a process of its own: the interpreter is chosen at import), and what it
refuses to serve."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs Triton (pip install triton)")
def test_kernel_matches_the_layer_by_layer_forward_under_the_interpreter():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, str(Path(__file__).with_name("persistent_interpreted.py"))], env=env,
                         capture_output=True, text=True, timeout=600, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.count(" ok") == 20, run.stdout


def test_unsupported_decoders_are_named():
    import torch

    from rose.layers.persistent_decoder import attach, unsupported
    from rose.models.qwen3 import DecoderOptions, Qwen3Model

    cfg = {"vocab_size": 50, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32}
    with torch.device("meta"):
        assert unsupported(Qwen3Model(cfg, causal=True)) is None
        assert "QK-norm" in unsupported(Qwen3Model(cfg, True, DecoderOptions(qk_norm=False)))
        assert "biases" in unsupported(Qwen3Model(cfg, True, DecoderOptions(qkv_bias=True, o_bias=True)))
        assert "windows" in unsupported(Qwen3Model(cfg, True, windows=(64, -1)))
        assert "head_dim" in unsupported(Qwen3Model({**cfg, "head_dim": 24}, causal=True))
        model = Qwen3Model(cfg, causal=True)
    assert attach(model) is None and model.persistent is None  # off unless ROSE_PERSISTENT_DECODER is on


def test_the_flag_reads_off_on_or_a_token_bound():
    from rose.layers.persistent_decoder import MAX_TOKENS, ROUTED_TOKENS, routed_tokens

    assert routed_tokens("") == routed_tokens("off") == routed_tokens("0") == 0
    assert routed_tokens("on") == routed_tokens("1") == routed_tokens("TRUE") == ROUTED_TOKENS
    assert routed_tokens("32") == 32 and routed_tokens(str(MAX_TOKENS)) == MAX_TOKENS
    for bad in ("129", "fast", "-4"):
        with pytest.raises(ValueError, match="ROSE_PERSISTENT_DECODER"):
            routed_tokens(bad)


def test_the_express_lane_turns_the_persistent_decoder_off(monkeypatch):
    """Two persistent kernels on two streams at once would each wait for programs the other holds: the express
    lane (a second stream of forwards) detaches it."""
    from types import SimpleNamespace

    from rose import runner as runner_module

    monkeypatch.setattr(runner_module.ExpressLane, "build", classmethod(lambda cls, runner, tokens: ("lane", tokens)))
    stub = SimpleNamespace(on_cuda=True, express=None, model=SimpleNamespace(persistent=object()))
    assert runner_module.ModelRunner.enable_express(stub, 64) is True
    assert stub.model.persistent is None and stub.express == ("lane", 64)


def test_tiles_that_do_not_divide_a_projection_are_refused():
    from rose.layers.persistent_decoder import Tiles

    Tiles().check(1024, 4096, 2048, 3072)  # Qwen3-0.6B
    Tiles().check(2560, 6144, 4096, 9728)  # Qwen3-4B
    with pytest.raises(ValueError, match="gate-up projection's 3000 columns"):
        Tiles().check(1024, 4096, 2048, 3000)
    with pytest.raises(ValueError, match="o projection's K = 2048 in 8 slices"):
        Tiles(split_od=8, k=512).check(1024, 4096, 2048, 3072)
    with pytest.raises(ValueError, match="under 32 wide"):
        Tiles(o=16).check(1024, 4096, 2048, 3072)
