"""The gate-up projection with SiLU·mul in its epilogue (rose.layers.gate_up_act, an issue-14 experiment) on a CPU:
under Triton's interpreter against the unfused path's rounding steps (float32 and float16; one row, rows past a
block, partial row groups), and the shapes it refuses before launching. On the GPU, bf16 against F.linear +
silu_mul: test_rose_gate_up_act_gpu.py."""

from __future__ import annotations

import pytest

from tests.rose.interpreter import needs_triton, run_interpreted


@needs_triton
def test_kernel_matches_the_unfused_rounding_under_the_interpreter():
    run_interpreted("gate_up_interpreted.py", cases=24)


@needs_triton
def test_shapes_it_cannot_tile_are_refused():
    import torch

    from rose.layers.gate_up_act import GateUpConfig, gate_up_silu

    x = torch.zeros(4, 64)
    for weight, match in ((torch.zeros(96, 64), "whole blocks"), (torch.zeros(128, 32), r"not \[2I, K\]"),
                          (torch.zeros(128, 64).t().contiguous().t(), "contiguous")):
        with pytest.raises(ValueError, match=match):
            gate_up_silu(x, weight, GateUpConfig(block_n=64, block_k=32))


def test_the_layers_route_only_when_a_configuration_is_named():
    """ROSE_GATE_UP_SILU names a configuration by its label (the measured fastest by default, or off) and
    ROSE_GATE_UP_SILU_MIN the least tokens; a CPU batch never routes."""
    import torch

    from rose.layers.gate_up_act import GateUpConfig, engine_route, routed

    config = GateUpConfig(block_m=64, block_n=128, block_k=64, warps=8, stages=3, group_m=4)
    assert GateUpConfig.parse(config.label()) == config and config.label() == "m64n128k64w8p3g4"
    tma = GateUpConfig(load="tma-sms")
    assert tma.label() == "m128n64k64w4p4g8-tma-sms" and GateUpConfig.parse(tma.label()) == tma
    assert engine_route({}) == (GateUpConfig(block_n=128, warps=8, stages=3, load="tma-sms"), 4096)  # on by default
    assert engine_route({"ROSE_GATE_UP_SILU": "off"})[0] is None
    assert engine_route({"ROSE_GATE_UP_SILU": "m64n128k64w8p3g4", "ROSE_GATE_UP_SILU_MIN": "512"}) == (config, 512)
    for bad in ("on", "m64n128", "m64n128k64w8p3g4x", "m64n128k64w8p3g4-sms"):
        with pytest.raises(ValueError, match="not a gate-up configuration"):
            engine_route({"ROSE_GATE_UP_SILU": bad})
    assert routed(torch.zeros(8192, 64, dtype=torch.bfloat16), torch.zeros(256, 64, dtype=torch.bfloat16)) is None
