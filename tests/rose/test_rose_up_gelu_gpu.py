"""The BERT family's up projection with its bias and exact GELU in the GEMM's epilogue (rose.layers.up_gelu) against
the layers' pair (F.linear, then F.gelu) in bf16 on all-MiniLM's and BERT-base's MLP shapes: as accurate against a
float64 reference, within the rounding steps a different summation order allows where the values are not tiny, the
same bits in a CUDA-graph replay as called eagerly, and a BERT layer routed through it as its unfused self."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from rose.layers import up_gelu
from rose.layers.gate_up_act import GateUpConfig
from rose.layers.up_gelu import DEFAULT
from tests.rose.persistent_phases import assert_within_a_step

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available() or up_gelu.triton is None,
                                                  reason="needs CUDA and Triton")]

SHAPES = {"minilm": (384, 1536), "bert-base": (768, 3072)}  # hidden (K), intermediate (I)
CONFIGS = [DEFAULT, GateUpConfig(block_n=128, warps=8, stages=3), GateUpConfig(block_m=64, block_n=128, load="tma")]


def _operands(m: int, k: int, inner: int):
    g = torch.Generator("cuda").manual_seed(m * 5 + inner)
    dense = nn.Linear(k, inner, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        dense.weight.copy_(torch.randn(inner, k, device="cuda", generator=g) * k ** -0.5)
        dense.bias.copy_(torch.randn(inner, device="cuda", generator=g) * 0.5)
    return torch.randn(m, k, device="cuda", generator=g).bfloat16(), dense


def _error(y: torch.Tensor, x: torch.Tensor, dense: nn.Linear) -> float:
    ref = F.gelu(x.double() @ dense.weight.double().t() + dense.bias.double())
    return ((y.double() - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("model", list(SHAPES))
@pytest.mark.parametrize("m", [1, 300, 14660])
@pytest.mark.parametrize("config", CONFIGS, ids=GateUpConfig.label)
def test_as_accurate_as_the_pair_and_within_its_rounding(model, m, config):
    k, inner = SHAPES[model]
    x, dense = _operands(m, k, inner)
    with torch.inference_mode():
        got = up_gelu.up_gelu(x, dense.weight, dense.bias, config)
        pair = F.gelu(dense(x))
    assert _error(got, x, dense) <= 1.5 * _error(pair, x, dense) + 1e-6
    # an input a step apart moves GELU by ~1 step where |GELU| is not tiny (its far negative tail is ~0)
    assert_within_a_step(got, pair, f"{model} m={m}", share=2e-3, steps=2, where=pair.float().abs() > 2 ** -4)


def test_a_graph_replay_gives_the_eager_bits():
    x, dense = _operands(4096, *SHAPES["minilm"])
    with torch.inference_mode():
        eager = up_gelu.up_gelu(x, dense.weight, dense.bias).clone()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            up_gelu.up_gelu(x, dense.weight, dense.bias)  # compiled and its descriptors made before the capture
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = up_gelu.up_gelu(x, dense.weight, dense.bias)
        graph.replay()
        torch.cuda.synchronize()
    assert torch.equal(out, eager)


def test_a_layer_routed_through_it_is_its_unfused_self(monkeypatch):
    x, dense = _operands(3000, *SHAPES["minilm"])
    with torch.inference_mode():
        monkeypatch.setattr(up_gelu, "ROUTE", ())  # off, whatever ROSE_UP_GELU says (the device script turns it on)
        pair = up_gelu.dense_act(dense, F.gelu, x)
        assert torch.equal(pair, F.gelu(dense(x)))
        monkeypatch.setattr(up_gelu, "ROUTE", ((2048, DEFAULT),))
        assert up_gelu.routed(x, dense) == DEFAULT and up_gelu.routed(x[:2000], dense) is None
        assert up_gelu.precompile_layer(dense, F.gelu) == 1
        got = up_gelu.dense_act(dense, F.gelu, x)
    assert_within_a_step(got, pair, "routed", share=2e-3, steps=2, where=pair.float().abs() > 2 ** -4)
