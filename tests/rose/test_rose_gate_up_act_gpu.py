"""The gate-up projection with SiLU·mul in its epilogue (rose.layers.gate_up_act; Qwen3's MLP from 2048 tokens)
against the layers' unfused path (F.linear, then rose.layers.fused.silu_mul) in bf16 on Qwen3-0.6B's and -4B's MLP
shapes: as accurate against a float64 reference, within the rounding steps a different summation order allows, the
same bits in a CUDA-graph replay as called eagerly, and the routed MLP as accurate as the unfused one."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from rose.layers import fused, gate_up_act
from rose.layers.gate_up_act import DEFAULT_ROUTE, GateUpConfig, gate_up_silu
from tests.rose.persistent_phases import assert_within_a_step

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available() or gate_up_act.triton is None,
                                                  reason="needs CUDA and Triton")]

SMALL_M = GateUpConfig(block_m=64, block_n=128, warps=4, stages=3, load="tma")  # 64-row tiles (swept, not routed)
SHAPES = {"qwen3-0.6b": (1024, 3072), "qwen3-4b": (2560, 9728)}  # hidden (K), intermediate (I), as the benchmark's
CONFIGS = [GateUpConfig(), GateUpConfig(block_n=128, warps=8, stages=3), DEFAULT_ROUTE,
           GateUpConfig(block_n=128, warps=8, stages=3, load="tma-sms"), GateUpConfig(warps=8, load="tma-sms"),
           SMALL_M]


def _operands(m: int, k: int, inner: int):
    g = torch.Generator("cuda").manual_seed(m * 7 + inner)
    x = torch.randn(m, k, device="cuda", generator=g).bfloat16()
    w = (torch.randn(2 * inner, k, device="cuda", generator=g) * 0.03).bfloat16()
    return x, w


def _error(y: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> float:
    inner = w.shape[0] // 2
    gu = x.double() @ w.double().t()
    ref = F.silu(gu[:, :inner]) * gu[:, inner:]
    return ((y.double() - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("model", list(SHAPES))
@pytest.mark.parametrize("m", [1, 300, 4096])
@pytest.mark.parametrize("config", CONFIGS, ids=GateUpConfig.label)
def test_as_accurate_as_the_unfused_path_and_within_its_rounding(model, m, config):
    k, inner = SHAPES[model]
    x, w = _operands(m, k, inner)
    got = gate_up_silu(x, w, config)
    unfused = fused.silu_mul(F.linear(x, w))
    assert _error(got, x, w) <= 1.5 * _error(unfused, x, w) + 1e-6
    # a gate a step apart moves SiLU(gate) by up to ~4 steps where its slope is steep (persistent_phases.assert_gated)
    assert_within_a_step(got, unfused, f"{model} m={m}", share=1e-3, steps=4)


@pytest.mark.parametrize("config", [CONFIGS[0], DEFAULT_ROUTE, CONFIGS[3]], ids=GateUpConfig.label)
def test_a_graph_replay_gives_the_eager_bits(config):
    k, inner = SHAPES["qwen3-0.6b"]
    x, w = _operands(512, k, inner)
    out = torch.empty(512, inner, dtype=torch.bfloat16, device="cuda")
    eager = gate_up_silu(x, w, config).clone()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        gate_up_silu(x, w, config, out=out)  # compiled before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gate_up_silu(x, w, config, out=out)  # (a tensor descriptor is a launch argument: out's and x's addresses)
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)


def test_qwen3s_mlp_routed_through_it_matches_the_unfused_mlp(monkeypatch):
    """With configurations named (ROSE_GATE_UP_SILU), Qwen3's MLP runs the fused kernel from each band's least tokens on
    with that band's tiles and the unfused pair below them all; the routed MLP is as accurate against a float64 MLP
    as the unfused one."""
    from rose.models.qwen3 import Qwen3MLP

    k, inner = SHAPES["qwen3-0.6b"]
    mlp = Qwen3MLP({"hidden_size": k, "intermediate_size": inner}).cuda().bfloat16()
    with torch.no_grad():
        mlp.gate_up_proj.weight.copy_(_operands(1, k, inner)[1])
        mlp.down_proj.weight.normal_(0, 0.02)
    x = _operands(1024, k, inner)[0]
    with torch.inference_mode():
        plain, plain_short = mlp(x), mlp(x[:499])
        monkeypatch.setattr(gate_up_act, "ROUTE", ((1000, DEFAULT_ROUTE), (500, SMALL_M)))
        calls = []
        monkeypatch.setattr(gate_up_act, "gate_up_silu",
                            lambda x, w, c: calls.append((len(x), c)) or gate_up_silu(x, w, c))
        routed, middle, short = mlp(x), mlp(x[:999]), mlp(x[:499])
    assert calls == [(1024, DEFAULT_ROUTE), (999, SMALL_M)] and torch.equal(short, plain_short)  # 499 not routed
    assert gate_up_act.ROUTE == ((1000, DEFAULT_ROUTE), (500, SMALL_M))  # both launched: none gave the route up
    w_gu, w_d = mlp.gate_up_proj.weight.double(), mlp.down_proj.weight.double()
    gu = x.double() @ w_gu.t()
    exact = (F.silu(gu[:, :inner]) * gu[:, inner:]) @ w_d.t()

    def error(y):
        return ((y.double() - exact).norm() / exact.norm()).item()

    assert error(routed) <= 1.5 * error(plain) + 1e-6, (error(routed), error(plain))
    assert ((middle.double() - exact[:999]).norm() / exact[:999].norm()).item() <= 1.5 * error(plain) + 1e-6
