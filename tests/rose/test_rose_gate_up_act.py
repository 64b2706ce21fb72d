"""The gate-up projection with SiLU·mul in its epilogue (rose.layers.gate_up_act; Qwen3's MLP from 2048 tokens) on a
CPU: under Triton's interpreter against the unfused path's rounding steps (float32 and float16; one row, rows past a
block, partial row groups; pointer loads and tensor descriptors), the shapes it refuses before launching, and what
routes the layers to it. On the GPU, bf16 against F.linear + silu_mul: test_rose_gate_up_act_gpu.py."""

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


def test_what_routes_the_layers_to_it(monkeypatch):
    """ROSE_GATE_UP_SILU names a configuration by its label (the measured fastest by default, or off; a value it
    cannot read turns it off) and ROSE_GATE_UP_SILU_MIN the least tokens, or bands of batch sizes each with its own
    floor and label; a CPU batch never routes; `fits` refuses
    shapes, dtypes and layouts the configuration cannot tile; a failed launch turns the route off."""
    import torch

    from rose.layers import gate_up_act
    from rose.layers.gate_up_act import DEFAULT_ROUTE, GateUpConfig, engine_route, fits, routed

    config = GateUpConfig(block_m=64, block_n=128, block_k=64, warps=8, stages=3, group_m=4)
    assert GateUpConfig.parse(config.label()) == config and config.label() == "m64n128k64w8p3g4"
    tma = GateUpConfig(load="tma-sms")
    assert tma.label() == "m128n64k64w4p4g8-tma-sms" and GateUpConfig.parse(tma.label()) == tma
    assert engine_route({}) == ((2048, DEFAULT_ROUTE),) and DEFAULT_ROUTE.label() == "m128n128k64w8p3g8-tma"  # on
    assert engine_route({"ROSE_GATE_UP_SILU": "off"}) == ()
    assert engine_route({"ROSE_GATE_UP_SILU": "m64n128k64w8p3g4", "ROSE_GATE_UP_SILU_MIN": "512"}) == ((512, config),)
    banded = "m64n128k64w8p3g4@512, m128n128k64w8p3g8-tma@4096"  # the largest floor first, whatever the order given
    assert engine_route({"ROSE_GATE_UP_SILU": banded}) == ((4096, DEFAULT_ROUTE), (512, config))
    for bad in ("on", "m64n128", "m64n128k64w8p3g4x", "m64n128k64w8p3g4-sms", "m64n128k64w8p3g4@many"):
        if "@" not in bad:
            with pytest.raises(ValueError, match="not a gate-up configuration"):
                GateUpConfig.parse(bad)
        assert engine_route({"ROSE_GATE_UP_SILU": bad}) == ()  # a warning, the unfused pair
    assert engine_route({"ROSE_GATE_UP_SILU_MIN": "many"}) == ()
    assert engine_route({"ROSE_GATE_UP_SILU": "m64n128k64w8p3g4@512,m128n128k64w8p3g8-tma@512"}) == ()  # one floor
    assert engine_route({"ROSE_GATE_UP_SILU": "m64n128k64w8p3g4@0"}) == ()  # a floor under one token
    assert engine_route({"ROSE_GATE_UP_SILU": "m64n128k64w8p3g4@-5"}) == ()
    # every band with its own floor: ROSE_GATE_UP_SILU_MIN is not read; a trailing comma is no band
    assert engine_route({"ROSE_GATE_UP_SILU": banded + ",", "ROSE_GATE_UP_SILU_MIN": "many"}) == (
        (4096, DEFAULT_ROUTE), (512, config))

    def t(rows, cols, dtype=torch.bfloat16):
        return torch.zeros(rows, cols, dtype=dtype)

    x, w = t(8192, 1024), t(6144, 1024)
    assert fits(x, w, DEFAULT_ROUTE) and routed(x, w) is None  # tiled, but a CPU batch
    assert not fits(x.float(), w.float(), DEFAULT_ROUTE) and not fits(x, w.half(), DEFAULT_ROUTE)  # bf16 / fp16 alike
    assert not fits(x, t(6144 - 128, 1024), DEFAULT_ROUTE)  # I = 3008: not whole 128-wide blocks
    assert not fits(x, t(6144, 512), DEFAULT_ROUTE) and not fits(x[None], w, DEFAULT_ROUTE)  # K apart; not 2-D
    assert not fits(t(8192, 2048)[:, ::2], w, DEFAULT_ROUTE)  # not contiguous
    assert not fits(t(8192 * 1024 + 1, 1).view(-1)[1:].view(8192, 1024), w, DEFAULT_ROUTE)  # 2 bytes off 16
    assert fits(t(8192 * 1024 + 1, 1).view(-1)[1:].view(8192, 1024), w, GateUpConfig(block_n=128))  # pointers: any
    monkeypatch.setattr(gate_up_act, "ROUTE", ((4096, DEFAULT_ROUTE),))
    gate_up_act.give_up(RuntimeError("out of resources"))
    assert gate_up_act.ROUTE == ()


def test_a_batch_takes_the_band_of_the_largest_floor_it_reaches_and_precompile_compiles_each_once(monkeypatch):
    """Band selection whatever ROUTE's order; precompile launches 8 rows of each distinct configuration once (M is
    not specialized), skips one that cannot launch, and a failed launch turns the route off."""
    import torch

    from rose.layers import gate_up_act
    from rose.layers.gate_up_act import DEFAULT_ROUTE, GateUpConfig, precompile, routed

    small = GateUpConfig(block_n=128, warps=4, load="tma")
    monkeypatch.setattr(gate_up_act, "launchable", lambda x, w, c: True)  # as on a GPU the tiles fit
    monkeypatch.setattr(gate_up_act, "ROUTE", ((512, small), (4096, DEFAULT_ROUTE), (100, small)))  # unsorted
    w = torch.zeros(6144, 1024, dtype=torch.bfloat16)

    def rows(n):
        return torch.zeros(n, 1024, dtype=torch.bfloat16)

    assert routed(rows(4096), w) == DEFAULT_ROUTE and routed(rows(9000), w) == DEFAULT_ROUTE
    assert routed(rows(4095), w) == small and routed(rows(100), w) == small and routed(rows(99), w) is None
    launches = []
    monkeypatch.setattr(gate_up_act, "gate_up_silu", lambda x, w, c: launches.append((x.shape[0], c)))
    assert precompile(w) == 2 and sorted(launches, key=str) == sorted([(8, small), (8, DEFAULT_ROUTE)], key=str)
    monkeypatch.setattr(gate_up_act, "launchable", lambda x, w, c: c == small)  # the other cannot launch here
    launches.clear()
    assert precompile(w) == 1 and launches == [(8, small)]

    def fail(x, w, c):
        raise RuntimeError("out of resources")

    monkeypatch.setattr(gate_up_act, "gate_up_silu", fail)
    assert precompile(w) == 0 and gate_up_act.ROUTE == ()  # given up: the unfused pair serves


def _ptxas() -> bool:
    import importlib.util
    import os

    spec = importlib.util.find_spec("triton")
    return spec is not None and os.path.exists(os.path.join(os.path.dirname(spec.origin), "backends", "nvidia", "bin",
                                                            "ptxas"))


@pytest.mark.skipif(not _ptxas(), reason="needs Triton's NVIDIA tools (ptxas) to compile for sm_90")
def test_a_manifest_entry_of_the_descriptor_kernel_compiles_ahead():
    """The kernel manifest records each variant's specialization, tensor-descriptor arguments included, and a start
    compiles it ahead from that record (rose.kernel_ahead): here for sm_90, on a machine without a GPU."""
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend
    from triton.runtime.jit import serialize_specialization_data

    from rose import kernel_ahead
    from rose.kernel_manifest import cuda_target
    from rose.layers import gate_up_act

    fn = gate_up_act._gate_up_silu_tma_kernel
    signature = {"x_desc": "tensordesc<bf16[128, 64]>", "w_desc": "tensordesc<bf16[128, 64]>",
                 "o_desc": "tensordesc<bf16[128, 128]>", "M": "i32", "programs": "i32", "INNER": "constexpr",
                 "K": "constexpr", "BM": "constexpr", "BN": "constexpr", "BK": "constexpr", "GROUP_M": "constexpr",
                 "DT": "constexpr"}
    constants = {(5,): 3072, (6,): 1024, (7,): 128, (8,): 128, (9,): 64, (10,): 8, (11,): tl.bfloat16}
    target = GPUTarget("cuda", 90, 32)
    options = make_backend(target).parse_options({"num_warps": 8, "num_stages": 3})
    entry = {"module": "rose.layers.gate_up_act", "name": "_gate_up_silu_tma_kernel", "source_key": fn.cache_key,
             "target": cuda_target(9, 0), "spec": serialize_specialization_data(
                 fn.__name__, signature, constants, {}, options, "key", target)}
    counts = kernel_ahead.compile_entries(entry["target"], [entry])
    assert counts["compiled"] == 1 and counts["failed"] == 0, counts
