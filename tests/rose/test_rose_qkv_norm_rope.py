"""The QKV projection with the QK norm and RoPE in its epilogue (rose.layers.qkv_norm_rope; Qwen3's attention from
4096 tokens with ROSE_QKV_NORM_ROPE on) on a CPU: under Triton's interpreter against the unfused path (the product
rounded, then the layers' QK-norm+RoPE kernel), what it refuses, what routes the layers to it, and its compile for
Hopper within shared memory. On the GPU, bf16 against the unfused path: test_rose_qkv_norm_rope_gpu.py."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from tests.rose.interpreter import needs_triton, run_interpreted


@needs_triton
def test_kernel_matches_the_unfused_path_under_the_interpreter():
    run_interpreted("qkv_interpreted.py", cases=15)


class _OnGPU:
    """What fused_or_none reads of a batch, as a CUDA tensor would answer."""

    def __init__(self, tokens: int, dtype=torch.bfloat16) -> None:
        self.is_cuda, self.shape, self.dtype, self.device = True, (tokens, 128), dtype, torch.device("cuda", 0)


def test_what_routes_the_layers_to_it(monkeypatch):
    """ROSE_QKV_NORM_ROPE on (off by default) with its least tokens (4096, or ROSE_QKV_NORM_ROPE_MIN; unreadable:
    off); with the route off nothing runs, the warm-up's launch (least=0) included; never a CPU batch, one under the
    least tokens, a projection with a bias, a norm it lacks (Gemma's), a GPU without TMA, or shapes it does not
    fit (float32, other heads, K not whole steps, halves not whole columns); give_up turns the route off."""
    from torch import nn

    from rose.layers import qkv_norm_rope
    from rose.layers.linear import MergedLinear
    from rose.layers.qkv_norm_rope import engine_route, fits

    assert engine_route({}) is None and engine_route({"ROSE_QKV_NORM_ROPE": "off"}) is None
    assert engine_route({"ROSE_QKV_NORM_ROPE": "1"}) == 4096
    assert engine_route({"ROSE_QKV_NORM_ROPE": "on", "ROSE_QKV_NORM_ROPE_MIN": "2048"}) == 2048
    assert engine_route({"ROSE_QKV_NORM_ROPE": "1", "ROSE_QKV_NORM_ROPE_MIN": "many"}) is None
    x = torch.zeros(8, 128, dtype=torch.bfloat16)
    w = torch.zeros(8 * 32, 128, dtype=torch.bfloat16)  # 4 + 2 x 2 heads of 32
    assert fits(x, w, 4, 2, 32)
    assert not fits(x.float(), w.float(), 4, 2, 32) and not fits(x, w, 4, 1, 32)  # float32; not these heads
    assert not fits(x[:, :96].contiguous(), w[:, :96].contiguous(), 4, 2, 32)  # K not whole steps of 64
    assert not fits(x, torch.zeros(8 * 24, 128, dtype=torch.bfloat16), 4, 2, 24)  # halves of 12 columns
    assert not fits(torch.zeros(8, 512, dtype=torch.bfloat16), torch.zeros(4 * 512, 512, dtype=torch.bfloat16),
                    2, 1, 512)  # a head wider than a TMA box

    # on a "GPU": the kernel and the GPU's checks stubbed, the rules of fused_or_none itself exercised
    ran = []
    monkeypatch.setattr(qkv_norm_rope, "qkv_norm_rope", lambda *a: ran.append(a[0].shape[0]) or ("q", "k", "v"))
    monkeypatch.setattr(qkv_norm_rope, "device_index", lambda device: 0)
    monkeypatch.setattr(qkv_norm_rope, "fits", lambda x, *a: x.dtype == torch.bfloat16)
    tma = {"ok": True}
    monkeypatch.setattr(qkv_norm_rope, "gemm_tiles_fit", lambda index: tma["ok"])
    proj = MergedLinear(128, (128, 64, 64), bias=False)
    args = (None, None, None, None, 4, 2, 32, 1e-6)

    def route(batch, norm="rms", projection=proj, least=None):
        return qkv_norm_rope.fused_or_none(batch, projection, *args, norm, least=least)

    monkeypatch.setattr(qkv_norm_rope, "LEAST", None)
    assert route(_OnGPU(8192)) is None and route(_OnGPU(8192), least=0) is None  # off: even the warm-up's least=0
    monkeypatch.setattr(qkv_norm_rope, "LEAST", 4096)
    assert route(_OnGPU(8), least=0) == ("q", "k", "v")  # on: the warm-up's launch of 8 rows
    assert route(_OnGPU(4096)) == ("q", "k", "v") and ran[-1] == 4096
    assert route(_OnGPU(4095)) is None  # under the least tokens
    assert route(x) is None  # a CPU batch
    assert route(_OnGPU(4096), norm="gemma") is None  # a norm the kernel lacks
    assert route(_OnGPU(4096), projection=nn.Linear(128, 256)) is None  # a bias
    assert route(_OnGPU(4096, torch.float32)) is None  # shapes it does not fit
    tma["ok"] = False
    assert route(_OnGPU(4096)) is None  # no TMA
    assert ran == [8, 4096]
    qkv_norm_rope.give_up(RuntimeError("out of resources"))
    assert qkv_norm_rope.LEAST is None


def test_shapes_it_cannot_tile_are_refused():
    from rose.layers.qkv_norm_rope import qkv_norm_rope

    x = torch.zeros(4, 96)
    with pytest.raises(ValueError, match="K a multiple of 64"):
        qkv_norm_rope(x, torch.zeros(8 * 32, 96), None, None, torch.arange(4), torch.ones(16), 4, 2, 1e-6)


def _ptxas() -> bool:
    spec = importlib.util.find_spec("triton")
    return spec is not None and (Path(spec.origin).parent / "backends" / "nvidia" / "bin" / "ptxas").exists()


@pytest.mark.skipif(not _ptxas(), reason="needs Triton's NVIDIA tools (ptxas) to compile for sm_90")
@pytest.mark.parametrize("heads,kv_heads,k", [(16, 8, 1024), (32, 8, 2560)])  # Qwen3-0.6B's and -4B's
def test_compiles_for_hopper_within_shared_memory_on_whole_head_mmas(heads, kv_heads, k):
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget

    from rose.layers import qkv_norm_rope as mod

    constexprs = {"HQ": heads, "HKV": kv_heads, "HALF": 64, "K": k, "BM": mod.BLOCK_M, "BK": mod.BLOCK_K,
                  "GROUP_M": mod.GROUP_M, "NORM": 1, "DT": tl.bfloat16}
    signature = {"x_desc": f"tensordesc<bf16[{mod.BLOCK_M}, {mod.BLOCK_K}]>",
                 "w_desc": f"tensordesc<bf16[128, {mod.BLOCK_K}]>", "q_ptr": "*bf16", "k_ptr": "*bf16",
                 "v_ptr": "*bf16", "qw_ptr": "*bf16", "kw_ptr": "*bf16", "rope_ptr": "*fp32",
                 "M": "i32", "eps": "fp32", **dict.fromkeys(constexprs, "constexpr")}
    source = triton.compiler.ASTSource(fn=mod._qkv_norm_rope_kernel, constexprs=constexprs, signature=signature)
    kernel = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                            options={"num_warps": mod.WARPS, "num_stages": mod.STAGES})
    assert kernel.metadata.shared <= 227 * 1024
    # the head's columns in one accumulator: Hopper's 64 x 128 MMAs (two accumulators of 64 columns ran m64n64 at a
    # third of cuBLAS's rate on the H200, results/qkv_norm_rope_0fdb159/)
    assert "wgmma.mma_async.sync.aligned.m64n128k16" in kernel.asm["ptx"]
