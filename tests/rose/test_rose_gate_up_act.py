"""The gate-up projection with SiLU·mul in its epilogue (rose.layers.gate_up_act, an issue-14 experiment) on a CPU:
under Triton's interpreter against the unfused path's rounding steps (float32 and float16; one row, rows past a
block, partial row groups), and the shapes it refuses before launching. On the GPU, bf16 against F.linear +
silu_mul: test_rose_gate_up_act_gpu.py."""

from __future__ import annotations

import pytest

from tests.rose.interpreter import needs_triton, run_interpreted


@needs_triton
def test_kernel_matches_the_unfused_rounding_under_the_interpreter():
    run_interpreted("gate_up_interpreted.py", cases=12)


@needs_triton
def test_shapes_it_cannot_tile_are_refused():
    import torch

    from rose.layers.gate_up_act import GateUpConfig, gate_up_silu

    x = torch.zeros(4, 64)
    for weight, match in ((torch.zeros(96, 64), "whole blocks"), (torch.zeros(128, 32), r"not \[2I, K\]"),
                          (torch.zeros(128, 64).t().contiguous().t(), "contiguous")):
        with pytest.raises(ValueError, match=match):
            gate_up_silu(x, weight, GateUpConfig(block_n=64, block_k=32))
