"""The split-K GEMM (rose.layers.splitk_gemm, an issue-14 experiment) against cuBLAS on the Qwen3-0.6B's four
projections: as accurate against a float32 reference, the same bits on every call whichever program
finishes last, its counters back at zero, and the same under CUDA-graph capture and replay."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from rose.layers import splitk_gemm
from rose.layers.splitk_gemm import SplitConfig, Workspace, splitk_linear

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available() or splitk_gemm.triton is None,
                                                  reason="needs CUDA and Triton")]

SHAPES = {"qkv": (4096, 1024), "o": (1024, 2048), "gate_up": (6144, 1024), "down": (1024, 3072)}
CONFIGS = [SplitConfig(block_m=128, block_n=64, block_k=64, split=4),
           SplitConfig(block_m=64, block_n=32, block_k=128, split=8, warps=4),
           SplitConfig(block_m=128, block_n=128, block_k=64, split=1, warps=8)]


def _operands(m: int, n: int, k: int):
    g = torch.Generator("cuda").manual_seed(m * 7 + n)
    x = torch.randn(m, k, device="cuda", generator=g).bfloat16()
    w = (torch.randn(n, k, device="cuda", generator=g) * 0.02).bfloat16()
    return x, w


def _error(y: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> float:
    ref = x.float() @ w.float().t()
    return ((y.float() - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("proj", list(SHAPES))
@pytest.mark.parametrize("m", [1, 7, 128, 200])
@pytest.mark.parametrize("config", CONFIGS, ids=SplitConfig.label)
def test_as_accurate_as_cublas_and_the_same_bits_every_call(proj, m, config):
    n, k = SHAPES[proj]
    if k % (config.split * config.block_k):
        pytest.skip("K does not split into this configuration's slices")
    x, w = _operands(m, n, k)
    ws = Workspace(m, n, config, "cuda")
    first = splitk_linear(x, w, config, ws)
    cublas = F.linear(x, w)
    assert _error(first, x, w) <= 1.5 * _error(cublas, x, w) + 1e-6
    for _ in range(20):
        assert torch.equal(splitk_linear(x, w, config, ws), first)
    torch.cuda.synchronize()
    assert int(ws.counters.abs().sum()) == 0


def test_captured_and_replayed_like_the_model_graphs():
    config = SplitConfig(block_m=128, block_n=64, block_k=64, split=4)
    n, k = SHAPES["o"]
    x, w = _operands(128, n, k)
    ws = Workspace(128, n, config, "cuda")
    eager = splitk_linear(x, w, config, ws)
    out = torch.empty_like(eager)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        splitk_linear(x, w, config, ws, out=out)  # warm (compiled already; the allocator's first touch)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        splitk_linear(x, w, config, ws, out=out)
    for scale in (1.0, -0.5, 2.0):
        x.copy_(_operands(128, n, k)[0] * scale)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, splitk_linear(x, w, config, ws))
    assert int(ws.counters.abs().sum()) == 0


def test_refuses_a_k_that_does_not_split():
    x, w = _operands(4, 64, 96)
    with pytest.raises(ValueError, match="does not split"):
        splitk_linear(x, w, SplitConfig(block_k=64, split=2), Workspace(4, 64, SplitConfig(split=2), "cuda"))


def test_refuses_a_workspace_of_another_shape():
    config = SplitConfig(split=2)
    x, w = _operands(128, 64, 256)
    with pytest.raises(ValueError, match="workspace is for 64 x 64"):
        splitk_linear(x, w, config, Workspace(64, 64, config, "cuda"))
