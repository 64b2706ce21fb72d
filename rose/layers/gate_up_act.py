"""The gate-up projection with SiLU(gate) * up in its epilogue, for many tokens (Qwen3's MLP at M in the thousands).

Why (issue 14, benchmarks/NOTES.md "SiLU·mul in the gate-up GEMM's epilogue"): at large M the layers' gate-up GEMM
writes [M, 2I] in bf16 and the SiLU·mul kernel reads it back and writes [M, I]: at 4096 tokens of the 0.6B that
pass is 18.6 µs a layer at the copy bandwidth (28 a forward), beside a 72 µs GEMM. Computing both products of a
column block in one program and applying the activation to the accumulators writes only [M, I].

Rounding follows the unfused path: gate and up rounded to the activations' dtype as the GEMM's output would be,
SiLU in float32 rounded once, times up, rounded (rose.layers.fused._act_mul_kernel). The accumulation order is
Triton's, not cuBLAS's, so a product may differ from F.linear's by a rounding step; the tests bound that.

Qwen3's MLP runs through it from ROSE_GATE_UP_SILU_MIN tokens (2048) on Hopper and datacenter Blackwell (its tensor
descriptors need TMA, its tiles ~180 KB of shared memory), with the configuration ROSE_GATE_UP_SILU names
(DEFAULT_ROUTE's by default; `off` for the unfused pair; `label@tokens,label@tokens` gives each band of batch sizes
its own tiles, a batch taking the band with the largest floor it reaches); a launch that fails turns the route off
for the process.
Measured on an H100 (NOTES "SiLU·mul in the gate-up GEMM's epilogue"; `benchmarks.gate_up_silu_ab`): with plain
pointer loads its GEMM ran at ~80 % of cuBLAS's rate, a wash for the 0.6B and 7-8 % slower for the 4B (e508b0d);
through tensor descriptors 0.84-0.89 × the pair for the 0.6B and 0.93-0.98 × for the 4B, the same bits, and the
0.6B's bs1-4096 −2 to −5 %, score-50x512 −4.5 to −5 %, docs-100 +3.4 to +4.4 % in the engine (0cda4a8, one
program an SM; the default is a program a tile, 2 % slower in the kernel table, so that the express lane's kernels
still find SMs between its tiles). From 2048 tokens since 960c350: 45.8 against the pair's 52.7 µs a layer at 2048
tokens, bs1-2048 −3 %; at 512-1024 tokens level or slower with every tile measured (cuBLAS's small-M GEMMs are fast).
"""

from __future__ import annotations

import functools
import logging
import os
import re
from dataclasses import dataclass

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU builds of torch ship without Triton
    triton = None
from rose.layers.tma import TensorDescriptor, describable, has_tma

log = logging.getLogger("rose.gate_up_act")


@dataclass(frozen=True)
class GateUpConfig:
    """Rows and columns (of each of gate and up) a program computes, the K step, warps, pipeline stages, and the
    row blocks taken together (GROUP_M) so that neighbouring programs share weight tiles in L2. load: "ptr" (loads
    Triton pipelines with cp.async), "tma" (tensor descriptors: the copy engine loads the tiles and stores the
    result), "tma-sms" (the same, one program an SM walking the tiles: a persistent grid)."""

    block_m: int = 128
    block_n: int = 64
    block_k: int = 64
    warps: int = 4
    stages: int = 4
    group_m: int = 8
    load: str = "ptr"

    def label(self) -> str:
        tail = "" if self.load == "ptr" else f"-{self.load}"
        return f"m{self.block_m}n{self.block_n}k{self.block_k}w{self.warps}p{self.stages}g{self.group_m}{tail}"

    @classmethod
    def parse(cls, label: str) -> GateUpConfig:
        """label()'s inverse: m128n64k64w4p4g8 -> GateUpConfig(128, 64, 64, 4, 4, 8); ValueError otherwise."""
        found = re.fullmatch(r"m(\d+)n(\d+)k(\d+)w(\d+)p(\d+)g(\d+)(?:-(tma|tma-sms))?", label.strip())
        if not found:
            raise ValueError(f"not a gate-up configuration: {label!r} (e.g. {cls().label()})")
        *numbers, load = found.groups()
        return cls(*(int(v) for v in numbers), load=load or "ptr")


# The fastest tiles measured on an H100 at 0cda4a8 (at 4 096 and 17 920 tokens of both Qwen3 shapes), a program a
# tile: 0.865-0.98 x the unfused pair there, within 2.5 % of one program an SM ("tma-sms"), which holds every SM for
# the whole GEMM (a query's kernels beside a bulk batch would wait for it)
DEFAULT_ROUTE = GateUpConfig(block_n=128, warps=8, stages=3, load="tma")


Route = tuple[tuple[int, GateUpConfig], ...]  # (least tokens, configuration) bands, the largest floor first


def engine_route(env: dict[str, str] | None = None) -> Route:
    """The layers' use of the fused kernel: its bands of batch sizes, each (least tokens, configuration), from
    ROSE_GATE_UP_SILU (a configuration's label, DEFAULT_ROUTE's by default, from ROSE_GATE_UP_SILU_MIN tokens, 2048;
    or labels with their own floors of at least one token, `m128n128k64w8p3g8-tma@4096,m128n64k64w4p4g8-tma@2048`;
    or off: no band); a value it cannot read is a warning and the route off."""
    env = os.environ if env is None else env
    value = env.get("ROSE_GATE_UP_SILU", DEFAULT_ROUTE.label()).strip()
    try:
        if value.lower() in ("", "0", "off", "false"):
            return ()
        bands = []
        for part in filter(None, (p.strip() for p in value.split(","))):
            label, at, floor = part.partition("@")
            least = int(floor if at else env.get("ROSE_GATE_UP_SILU_MIN", "2048"))
            if least < 1:
                raise ValueError(f"a band's floor must be at least one token, not {least}")
            bands.append((least, GateUpConfig.parse(label)))
        if len({floor for floor, _ in bands}) < len(bands):
            raise ValueError(f"two bands share a floor in {value!r}")
        return tuple(sorted(bands, key=lambda band: -band[0]))
    except ValueError as exc:
        log.warning("ROSE_GATE_UP_SILU / ROSE_GATE_UP_SILU_MIN: %s; the unfused gate-up and SiLU·mul serve", exc)
        return ()


ROUTE = engine_route()  # read once, at import (as rose.layers.fused.ENABLED); give_up() turns it off


def give_up(exc: BaseException) -> None:
    """Turn the route off for this process after a launch failed (a GPU whose shared memory the tiles do not fit,
    say): logged once; the unfused pair serves from here on."""
    global ROUTE
    if ROUTE:
        log.warning("the fused gate-up kernel failed (%s: %s); the unfused gate-up and SiLU·mul serve from here on",
                    type(exc).__name__, exc)
    ROUTE = ()


@functools.cache
def _tma_fits(device: int) -> bool:
    """Hopper or datacenter Blackwell: TMA (has_tma), and ~227 KB of shared memory a block (consumer Blackwell,
    sm_120, has ~99 KB)."""
    return has_tma(device) and torch.cuda.get_device_capability(device)[0] <= 10


@functools.cache
def _sms(device: int) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def routed(x: torch.Tensor, weight: torch.Tensor) -> GateUpConfig | None:
    """The configuration to run x through the fused kernel with, or None for the unfused pair: a CUDA batch, in one
    of ROUTE's bands (the one with the largest floor its tokens reach), that it is `launchable` on."""
    band = max(((floor, config) for floor, config in ROUTE if x.shape[0] >= floor), key=lambda b: b[0], default=None)
    return band[1] if band is not None and launchable(x, weight, band[1]) else None


def launchable(x: torch.Tensor, weight: torch.Tensor, config: GateUpConfig) -> bool:
    """Whether `config` can run x through the kernel here: Triton present, a CUDA batch, a GPU the
    tensor-descriptor forms fit (_tma_fits), shapes it `fits`."""
    if triton is None or not x.is_cuda:
        return False
    if config.load != "ptr" and not _tma_fits(_index(x.device)):
        return False
    return fits(x, weight, config)


def fits(x: torch.Tensor, weight: torch.Tensor, config: GateUpConfig) -> bool:
    """Whether `config` tiles x [M, K] @ weight [2I, K]ᵀ: bf16 or fp16 alike, both contiguous, I whole column blocks
    and K whole K steps, and (the tensor-descriptor forms) both `describable`."""
    if x.dim() != 2 or weight.dim() != 2 or weight.shape[1] != x.shape[1] or weight.shape[0] % 2:
        return False
    if x.dtype not in (torch.bfloat16, torch.float16) or weight.dtype != x.dtype:
        return False
    inner, k = weight.shape[0] // 2, weight.shape[1]
    if inner % config.block_n or k % config.block_k or not (x.is_contiguous() and weight.is_contiguous()):
        return False
    return config.load == "ptr" or (describable(x) and describable(weight))


def fused_or_none(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor | None:
    """SiLU(gate) * up through the fused kernel where it is routed (`routed`), else None (the caller runs the unfused
    pair); a launch that fails turns the route off (give_up) and returns None."""
    config = routed(x, weight)
    if config is None:
        return None
    try:
        return gate_up_silu(x, weight, config)
    except Exception as exc:  # noqa: BLE001 - a GPU the kernel cannot launch on: the unfused pair from here on
        give_up(exc)
        return None


def precompile(weight: torch.Tensor) -> int:
    """Compile every band's variant for this gate-up weight now (M is not specialized: one launch of 8 rows compiles
    what every batch of that band runs), so that the first long batch in serving does not pay Triton's compile; a
    failure turns the route off (give_up). Returns the launches that ran (0 when nothing would route)."""
    x = torch.zeros(8, weight.shape[1], dtype=weight.dtype, device=weight.device)
    launched = 0
    for config in dict.fromkeys(config for _, config in ROUTE):  # each configuration once
        if not launchable(x, weight, config):
            continue
        try:
            gate_up_silu(x, weight, config)
        except Exception as exc:  # noqa: BLE001 - a GPU the kernel cannot launch on: the unfused pair from here on
            give_up(exc)
            return launched
        launched += 1
    return launched


_WEIGHT_DESCRIPTORS: dict[tuple, object] = {}  # a weight's descriptor by (address, shape, dtype, block)


def _weight_descriptor(weight: torch.Tensor, block: list[int]):
    """The weight's tensor descriptor, made once per address, shape and block (a descriptor holds only those: one
    cached for a freed tensor is right for the next tensor of that shape at that address)."""
    key = (weight.data_ptr(), tuple(weight.shape), weight.dtype, *block)
    desc = _WEIGHT_DESCRIPTORS.get(key)
    if desc is None:
        if len(_WEIGHT_DESCRIPTORS) >= 1024:
            _WEIGHT_DESCRIPTORS.clear()
        desc = _WEIGHT_DESCRIPTORS[key] = TensorDescriptor.from_tensor(weight, block)
    return desc


def gate_up_silu(x: torch.Tensor, weight: torch.Tensor, config: GateUpConfig = DEFAULT_ROUTE,
                 out: torch.Tensor | None = None) -> torch.Tensor:
    """SiLU(x @ gateᵀ) * (x @ upᵀ) -> [M, I] in x's dtype, weight [2I, K] (gate rows, then up rows: MergedLinear's
    layout). I must be whole column blocks and K whole K steps."""
    m, k = x.shape
    inner = weight.shape[0] // 2
    if weight.shape != (2 * inner, k):
        raise ValueError(f"weight {tuple(weight.shape)} is not [2I, K] for x {tuple(x.shape)}")
    if inner % config.block_n or k % config.block_k:
        raise ValueError(f"I = {inner} and K = {k} must be whole blocks of {config.block_n} and {config.block_k}")
    if not (x.is_contiguous() and weight.is_contiguous()):
        raise ValueError("x and weight must be contiguous")
    if out is None:
        out = torch.empty(m, inner, dtype=x.dtype, device=x.device)
    tiles = triton.cdiv(m, config.block_m) * (inner // config.block_n)
    meta = {"INNER": inner, "K": k, "BM": config.block_m, "BN": config.block_n, "BK": config.block_k,
            "GROUP_M": config.group_m, "num_warps": config.warps, "num_stages": config.stages}
    if config.load == "ptr":
        _gate_up_silu_kernel[(tiles,)](x, weight, out, m, **meta)
        return out
    programs = tiles
    if config.load == "tma-sms":  # (3 under Triton's interpreter, so that a program walks several tiles)
        programs = min(tiles, _sms(_index(x.device)) if x.is_cuda else 3)
    _gate_up_silu_tma_kernel[(programs,)](
        TensorDescriptor.from_tensor(x, [config.block_m, config.block_k]),
        _weight_descriptor(weight, [config.block_n, config.block_k]),
        TensorDescriptor.from_tensor(out, [config.block_m, config.block_n]), m, programs, DT=_DTYPES[x.dtype], **meta)
    return out


if triton is not None:
    _DTYPES = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}

    @triton.jit
    def _tile(tile, M, INNER: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, GROUP_M: tl.constexpr):
        """(row block, column block) of a tile: GROUP_M row blocks together, column block by column block."""
        blocks_m = tl.cdiv(M, BM)
        in_group = GROUP_M * (INNER // BN)
        first_m = (tile // in_group) * GROUP_M
        rows_here = tl.minimum(blocks_m - first_m, GROUP_M)
        return first_m + (tile % in_group) % rows_here, (tile % in_group) // rows_here

    @triton.jit
    def _silu_times(acc_g, acc_u, dt: tl.constexpr):
        """SiLU(gate) * up as the unfused path rounds it: each product rounded to dt, SiLU rounded, the product."""
        gate = acc_g.to(dt).to(tl.float32)
        act = (gate / (1.0 + tl.exp(-gate))).to(dt).to(tl.float32)
        return (act * acc_u.to(dt).to(tl.float32)).to(dt)

    @triton.jit(do_not_specialize=["M", "programs"])
    def _gate_up_silu_tma_kernel(x_desc, w_desc, o_desc, M, programs, INNER: tl.constexpr, K: tl.constexpr,
                                 BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
                                 DT: tl.constexpr):
        """The same tiles through tensor descriptors (rows past M read as zeros and are not stored); each of
        `programs` programs walks the tiles a grid's width apart (one each when there are as many as tiles)."""
        tiles = tl.cdiv(M, BM) * (INNER // BN)
        for tile in range(tl.program_id(0), tiles, programs):
            pid_m, pid_n = _tile(tile, M, INNER, BM, BN, GROUP_M)
            off_m, off_n = pid_m * BM, pid_n * BN
            acc_g = tl.zeros([BM, BN], dtype=tl.float32)
            acc_u = tl.zeros([BM, BN], dtype=tl.float32)
            for k in range(0, K, BK):
                a = x_desc.load([off_m, k])
                acc_g = tl.dot(a, w_desc.load([off_n, k]).T, acc_g)
                acc_u = tl.dot(a, w_desc.load([INNER + off_n, k]).T, acc_u)
            o_desc.store([off_m, off_n], _silu_times(acc_g, acc_u, DT))

    @triton.jit(do_not_specialize=["M"])
    def _gate_up_silu_kernel(x_ptr, w_ptr, out_ptr, M, INNER: tl.constexpr, K: tl.constexpr, BM: tl.constexpr,
                             BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr):
        pid_m, pid_n = _tile(tl.program_id(0), M, INNER, BM, BN, GROUP_M)
        rm = pid_m * BM + tl.arange(0, BM)
        rn = pid_n * BN + tl.arange(0, BN)
        rk = tl.arange(0, BK)
        row_ok = rm < M
        a_ptrs = x_ptr + rm.to(tl.int64)[:, None] * K + rk[None, :]
        g_ptrs = w_ptr + rn[None, :] * K + rk[:, None]  # [BK, BN]: gate rows read as Wᵀ
        u_ptrs = g_ptrs + INNER * K
        acc_g = tl.zeros([BM, BN], dtype=tl.float32)
        acc_u = tl.zeros([BM, BN], dtype=tl.float32)
        for _ in range(0, K, BK):
            a = tl.load(a_ptrs, mask=row_ok[:, None], other=0.0)
            acc_g = tl.dot(a, tl.load(g_ptrs), acc_g)
            acc_u = tl.dot(a, tl.load(u_ptrs), acc_u)
            a_ptrs += BK
            g_ptrs += BK
            u_ptrs += BK
        tl.store(out_ptr + rm.to(tl.int64)[:, None] * INNER + rn[None, :],
                 _silu_times(acc_g, acc_u, out_ptr.dtype.element_ty), mask=row_ok[:, None])
