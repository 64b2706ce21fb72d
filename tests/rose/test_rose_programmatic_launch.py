"""Programmatic dependent launch (rose.layers.launch) for ROSE's Triton kernels.

Without a GPU: each kernel compiled for Hopper (sm90) with PDL waits for its predecessor (griddepcontrol.wait)
before it reads an activation, and lets its dependents launch only after that wait; without PDL it has neither,
and the launch asks for PDL only when it is on. On the GPU (marked `gpu`): the kernels' outputs are the same bits
with PDL as without, eagerly and replayed from a CUDA graph.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from rose.layers import launch

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs Triton")


def _compile(fn, signature: dict, constexprs: dict, capability: int = 90):
    import triton
    from triton.backends.compiler import GPUTarget

    source = triton.compiler.ASTSource(fn=fn, constexprs=constexprs,
                                       signature={**signature, **dict.fromkeys(constexprs, "constexpr")})
    return triton.compile(source, target=GPUTarget("cuda", capability, 32), options={"num_warps": 4})


def _kernels():
    from rose.attention import triton_varlen
    from rose.layers import fused

    bf16 = "*bf16"
    yield "add_rms", fused._add_rms_kernel, {
        "x_ptr": bf16, "res_ptr": bf16, "w_ptr": bf16, "out_ptr": bf16, "res_out_ptr": bf16, "cols": "i32",
        "stride": "i32", "eps": "fp32"}, {"HAS_RES": True, "GEMMA": False, "BLOCK": 1024}
    yield "qk_norm_rope", fused._qk_norm_rope_kernel, {
        "qkv_ptr": bf16, "q_ptr": bf16, "k_ptr": bf16, "qw_ptr": bf16, "kw_ptr": bf16, "pos_ptr": "*i64",
        "inv_freq_ptr": "*fp32", "stride": "i32", "tokens": "i32", "num_heads": "i32", "num_kv_heads": "i32",
        "eps": "fp32"}, {"HALF": 64, "BLOCK_T": 1, "BLOCK_HQ": 16, "BLOCK_HK": 8, "NORM": 1}
    yield "act_mul", fused._act_mul_kernel, {"gu_ptr": bf16, "out_ptr": bf16, "inner": "i32", "stride": "i32"}, \
        {"ACT": 0, "BLOCK": 1024}
    yield "attention", triton_varlen._attention_kernel, {
        "Q": bf16, "K": bf16, "V": bf16, "O": bf16, "CU": "*i32", "BIAS": "*fp32", "scale_log2": "fp32",
        **{name: "i32" for name in ("stride_qt", "stride_qh", "stride_kt", "stride_kh", "stride_vt", "stride_vh",
                                    "stride_ot", "stride_oh", "M_BLOCKS", "window")}}, {
        "GROUP": 2, "HEAD_DIM": 128, "BLOCK_M": 64, "BLOCK_N": 64, "CAUSAL": True, "WINDOWED": False,
        "BIASED": False, "MAX_DISTANCE": 0, "SPLIT": True}


@needs_triton
@pytest.mark.parametrize("name", ["add_rms", "qk_norm_rope", "act_mul", "attention"])
def test_kernel_waits_for_its_predecessor_before_reading(name):
    fn, signature, constexprs = next((f, s, c) for n, f, s, c in _kernels() if n == name)
    with_pdl = _compile(fn, signature, {**constexprs, "PDL": True}).asm["ptx"]
    without = _compile(fn, signature, {**constexprs, "PDL": False}).asm["ptx"]
    assert "griddepcontrol" not in without
    body = with_pdl[with_pdl.index(".entry"):]
    wait, dependents = body.find("griddepcontrol.wait"), body.find("griddepcontrol.launch_dependents")
    assert 0 <= wait < dependents, "the dependents launch only after this kernel's own wait"
    # every global load of an activation comes after the wait: only add_rms's weight row is read before it
    allowed = {_source_line(fn, "w = tl.load(w_ptr")} if name == "add_rms" else set()
    assert _load_lines(body[:wait]) <= allowed


def _source_line(fn, text: str) -> int:
    import inspect

    lines, first = inspect.getsourcelines(fn.fn)
    return first + next(i for i, line in enumerate(lines) if text in line)


def _load_lines(ptx: str) -> set[int]:
    """The source lines (PTX `.loc` directives) of the global loads in `ptx`."""
    lines, current = set(), None
    for row in ptx.splitlines():
        row = row.strip()
        if row.startswith(".loc"):
            current = int(row.split()[2])
        elif "ld.global" in row:
            lines.add(current)
    return lines


def test_programmatic_only_on_cuda_and_when_enabled(monkeypatch):
    cpu = torch.zeros(1)
    monkeypatch.setattr(launch, "ENABLED", True)
    assert not launch.programmatic(cpu)
    assert launch.launch_options(True) == {"launch_pdl": True}
    assert launch.launch_options(False) == {}  # the interpreter and older Tritons take no such keyword


def test_programmatic_needs_hopper(monkeypatch):
    class FakeCuda:
        is_cuda = True
        device = torch.device("cuda", 3)

    monkeypatch.setattr(launch, "ENABLED", True)
    monkeypatch.setattr(launch, "_CAPABLE", {})
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: (8, 0) if index == 3 else (9, 0))
    assert not launch.programmatic(FakeCuda())  # an A100: no griddepcontrol
    monkeypatch.setattr(launch, "_CAPABLE", {})
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: (9, 0))
    assert launch.programmatic(FakeCuda())
    monkeypatch.setattr(launch, "ENABLED", False)
    assert not launch.programmatic(FakeCuda())


def _layer_chain(x, r, w, qkv, pos, inv_freq, gate_up, cu):
    """The fused kernels and the attention one after another, as a decoder layer runs them (no GEMMs)."""
    from rose.attention.triton_varlen import varlen_attention
    from rose.layers import fused

    normed, summed = fused.add_rms_norm(x, r, w, 1e-6)
    q, k = fused.qk_norm_rope(qkv, w[:128], w[128:256], pos, inv_freq, 16, 8, 128, 1e-6)
    v = qkv[:, 3072:].reshape(-1, 8, 128)
    attn = varlen_attention(q, k, v, cu, int(cu[-1]), True, 128 ** -0.5)
    return normed, summed, q, k, attn, fused.silu_mul(gate_up)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9,
                    reason="needs a Hopper GPU")
def test_same_bits_with_and_without_pdl_eager_and_in_a_graph(monkeypatch):
    g = torch.Generator("cuda").manual_seed(0)
    tokens = 200
    x, r = (torch.randn(tokens, 1024, device="cuda", generator=g).bfloat16() for _ in range(2))
    w = (1 + 0.1 * torch.randn(1024, device="cuda", generator=g)).bfloat16()
    qkv = torch.randn(tokens, 4096, device="cuda", generator=g).bfloat16()
    gate_up = torch.randn(tokens, 6144, device="cuda", generator=g).bfloat16()
    pos = torch.cat([torch.arange(120), torch.arange(80)]).cuda()
    inv_freq = 1e6 ** (-torch.arange(0, 128, 2, device="cuda").float() / 128)
    cu = torch.tensor([0, 120, 200], dtype=torch.int32, device="cuda")
    args = (x, r, w, qkv, pos, inv_freq, gate_up, cu)
    results = {}
    for pdl in (False, True):
        monkeypatch.setattr(launch, "ENABLED", pdl)
        eager = _layer_chain(*args)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            _layer_chain(*args)  # compile outside the capture
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = _layer_chain(*args)
        for _ in range(3):
            graph.replay()
        torch.cuda.synchronize()
        results[pdl] = (eager, captured)
    for off, on in zip(results[False][0] + results[False][1], results[True][0] + results[True][1]):
        assert torch.equal(off, on)
    for eager, replayed in zip(*results[True]):
        assert torch.equal(eager, replayed)
