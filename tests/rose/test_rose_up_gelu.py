"""The BERT family's up projection with its bias and exact GELU in the GEMM's epilogue (rose.layers.up_gelu, opt-in
ROSE_UP_GELU) on a CPU: under Triton's interpreter against the unfused path's rounding steps (float32 and float16; one
row, rows past a block, partial row groups; pointer loads and tensor descriptors), what routes a layer to it, the
shapes it refuses, and that only exact GELU goes through it. On the GPU, bf16: test_rose_up_gelu_gpu.py."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.rose.interpreter import needs_triton, run_interpreted


@needs_triton
def test_kernel_matches_the_unfused_rounding_under_the_interpreter():
    run_interpreted("up_gelu_interpreted.py", cases=18)


@needs_triton
def test_what_routes_a_layer_to_it(monkeypatch):
    from rose.layers import up_gelu
    from rose.layers.gate_up_act import GateUpConfig
    from rose.layers.up_gelu import DEFAULT, engine_route, fits, routed

    assert engine_route({}) == () and engine_route({"ROSE_UP_GELU": "off"}) == ()  # opt-in
    assert engine_route({"ROSE_UP_GELU": "on"}) == ((2048, DEFAULT),)
    assert engine_route({"ROSE_UP_GELU": "1", "ROSE_UP_GELU_MIN": "1"}) == ((1, DEFAULT),)
    small = GateUpConfig(block_m=64, block_n=128, warps=4, stages=3)
    assert engine_route({"ROSE_UP_GELU": f"{small.label()}@512,{DEFAULT.label()}@4096"}) == (
        (4096, DEFAULT), (512, small))
    assert engine_route({"ROSE_UP_GELU": "m64n128"}) == () and engine_route({"ROSE_UP_GELU": "on",
                                                                              "ROSE_UP_GELU_MIN": "many"}) == ()
    assert engine_route({"ROSE_UP_GELU": "m128n128k64w8p3g8-tma-sms"}) == ()  # a program a tile only: refused
    dense = nn.Linear(384, 1536).bfloat16()
    x = torch.zeros(4096, 384, dtype=torch.bfloat16)
    assert fits(x, dense, DEFAULT) and fits(x, dense, small)
    assert not fits(x.half(), dense, DEFAULT) and not fits(x.float(), dense.float(), DEFAULT)  # bf16 / fp16 alike
    assert not fits(x, nn.Linear(384, 1536, bias=False).bfloat16(), DEFAULT)  # the bias is in the epilogue
    assert not fits(x, nn.Linear(384, 1536 - 64).bfloat16(), DEFAULT)  # I not whole 128-wide blocks
    assert not fits(torch.zeros(8, 352, dtype=torch.bfloat16), nn.Linear(352, 1536).bfloat16(), DEFAULT)  # K: 5.5 steps
    assert not fits(torch.zeros(4096, 768, dtype=torch.bfloat16)[:, ::2], dense, DEFAULT)  # not contiguous
    assert not fits(x, dense, GateUpConfig(load="tma-sms"))  # one program a tile
    monkeypatch.setattr(up_gelu, "ROUTE", ((2048, DEFAULT),))
    assert routed(x, dense) is None  # a CPU batch never routes


def test_only_exact_gelu_goes_through_it_and_a_cpu_runs_the_pair(monkeypatch):
    from rose.layers import up_gelu
    from rose.layers.activations import get_activation

    dense = nn.Linear(64, 128)
    x = torch.randn(5, 64)
    for name in ("gelu", "gelu_new", "relu"):
        act = get_activation(name)
        assert torch.equal(up_gelu.dense_act(dense, act, x), act(dense(x)))  # the route off, or a CPU batch
    sentinel = torch.zeros(1)
    monkeypatch.setattr(up_gelu, "ROUTE", ((1, up_gelu.DEFAULT),))
    monkeypatch.setattr(up_gelu, "fused_or_none", lambda x, dense: sentinel)
    assert up_gelu.dense_act(dense, F.gelu, x) is sentinel
    tanh = get_activation("gelu_new")
    assert torch.equal(up_gelu.dense_act(dense, tanh, x), tanh(dense(x)))  # the tanh form: never the kernel
    assert up_gelu.precompile_layer(dense, tanh) == 0


@needs_triton
def test_shapes_it_cannot_tile_are_refused():
    from rose.layers.gate_up_act import GateUpConfig
    from rose.layers.up_gelu import up_gelu

    config = GateUpConfig(block_n=64, block_k=32)
    x = torch.zeros(4, 64)
    with pytest.raises(ValueError, match="whole blocks"):
        up_gelu(x, torch.zeros(96, 64), torch.zeros(96), config)
    with pytest.raises(ValueError, match="do not fit"):
        up_gelu(x, torch.zeros(128, 32), torch.zeros(128), config)
    with pytest.raises(ValueError, match="contiguous"):
        up_gelu(torch.zeros(4, 128)[:, ::2], torch.zeros(128, 64), torch.zeros(128), config)
    with pytest.raises(ValueError, match="share a dtype"):
        up_gelu(x, torch.zeros(128, 64), torch.zeros(128, dtype=torch.float16), config)
