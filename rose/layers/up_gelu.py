"""The BERT family's MLP up projection with its bias and exact GELU in the GEMM's epilogue, for many tokens.

Why (issue 14, benchmarks/NOTES.md "The encoders' up projection with GELU in its epilogue"): the layers' up GEMM writes
[M, I] in bf16 (cuBLAS adds the bias in its epilogue) and GELU reads it back and writes [M, I] again: at all-MiniLM's
100 documents (14 660 tokens, I = 1 536) that pass moves ~90 MB a layer, ~30 µs at an H100's copy rate beside a
~30 µs GEMM. Applying the bias and GELU to the accumulators writes [M, I] once.

Rounding follows the unfused path: the product plus the bias rounded to the activations' dtype (as F.linear's output),
GELU (erf, HF's "gelu") in float32 rounded once. The accumulation order is Triton's, not cuBLAS's, so a value may
differ from F.linear's by a rounding step; the tests bound that.

Opt-in until a GPU run has measured it: ROSE_UP_GELU names a configuration (rose.layers.gate_up_act.GateUpConfig's
labels, DEFAULT's for `on`) from ROSE_UP_GELU_MIN tokens (2048), or bands of batch sizes as ROSE_GATE_UP_SILU's; off
by default. The BERT, RoBERTa, XLM-R, MPNet and DistilBERT layers with exact GELU go through `fused_or_none`; a
launch that fails turns the route off for the process.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import nn

from rose.layers import gate_up_act
from rose.layers.gate_up_act import GateUpConfig, Route, _index, _tma_fits, _weight_descriptor, triton
from rose.layers.tma import TensorDescriptor, describable

log = logging.getLogger("rose.up_gelu")

DEFAULT = gate_up_act.DEFAULT_ROUTE  # gate-up's measured tiles (128 x 128 x 64, 8 warps, 3 stages, descriptors)


def engine_route(env: dict[str, str] | None = None) -> Route:
    """ROSE_UP_GELU's bands (rose.layers.gate_up_act.engine_route's rules; `on` is DEFAULT's label; off by default)."""
    import os

    env = os.environ if env is None else env
    value = env.get("ROSE_UP_GELU", "off").strip()
    if value.lower() in ("1", "on", "true"):
        env = {**env, "ROSE_UP_GELU": DEFAULT.label()}
    route = gate_up_act.engine_route(env, var="ROSE_UP_GELU", default="off")
    if any(config.load == "tma-sms" for _, config in route):
        log.warning("ROSE_UP_GELU: %r: the up + GELU kernel runs a program a tile (no -tma-sms); F.linear and GELU "
                    "serve", value)
        return ()
    return route


ROUTE = engine_route()  # read once, at import; give_up() turns it off


def give_up(exc: BaseException) -> None:
    """Turn the route off for this process after a launch failed: logged once; the unfused pair serves from here on."""
    global ROUTE
    if ROUTE:
        log.warning("the fused up + GELU kernel failed (%s: %s); F.linear and GELU serve from here on",
                    type(exc).__name__, exc)
    ROUTE = ()


def fits(x: torch.Tensor, dense: nn.Linear, config: GateUpConfig) -> bool:
    """Whether `config` tiles x [M, K] through dense (weight [I, K], a bias): bf16 or fp16 alike, contiguous, I whole
    column blocks and K whole K steps, and (the tensor-descriptor form) both `describable`."""
    weight, bias = dense.weight, dense.bias
    if x.dim() != 2 or weight.dim() != 2 or weight.shape[1] != x.shape[1] or bias is None:
        return False
    if x.dtype not in (torch.bfloat16, torch.float16) or weight.dtype != x.dtype or bias.dtype != x.dtype:
        return False
    if weight.shape[0] % config.block_n or weight.shape[1] % config.block_k or config.load == "tma-sms":
        return False
    if not (x.is_contiguous() and weight.is_contiguous() and bias.is_contiguous()):
        return False
    return config.load == "ptr" or (describable(x) and describable(weight))


def routed(x: torch.Tensor, dense: nn.Linear) -> GateUpConfig | None:
    """The configuration for x, or None for the unfused pair: a CUDA batch in one of ROUTE's bands that fits."""
    config = gate_up_act.band_for(ROUTE, x.shape[0])
    return config if config is not None and launchable(x, dense, config) else None


def launchable(x: torch.Tensor, dense: nn.Linear, config: GateUpConfig) -> bool:
    """Whether `config` can run x through the kernel here: Triton present, a CUDA batch, a GPU the tensor-descriptor
    form fits (rose.layers.gate_up_act's rule), shapes it `fits`."""
    if triton is None or not x.is_cuda or (config.load != "ptr" and not _tma_fits(_index(x.device))):
        return False
    return fits(x, dense, config)


def dense_act(dense: nn.Linear, act, x: torch.Tensor) -> torch.Tensor:
    """act(dense(x)): through the fused kernel where act is exact GELU and x is routed, else the pair."""
    if ROUTE and act is F.gelu:
        out = fused_or_none(x, dense)
        if out is not None:
            return out
    return act(dense(x))


def precompile_layer(dense: nn.Linear, act) -> int:
    """`precompile` for a layer whose MLP goes through dense_act (0 unless its act is exact GELU)."""
    return precompile(dense) if act is F.gelu else 0


def fused_or_none(x: torch.Tensor, dense: nn.Linear) -> torch.Tensor | None:
    """GELU(dense(x)) through the fused kernel where it is routed, else None (the caller runs the pair)."""
    config = routed(x, dense)
    if config is None:
        return None
    try:
        return up_gelu(x, dense.weight, dense.bias, config)
    except Exception as exc:  # noqa: BLE001 - a GPU the kernel cannot launch on: the pair from here on
        give_up(exc)
        return None


def up_gelu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, config: GateUpConfig = DEFAULT) -> torch.Tensor:
    """GELU(x @ weightᵀ + bias) (erf) -> [M, I] in x's dtype; I whole column blocks and K whole K steps."""
    m, k = x.shape
    inner = weight.shape[0]
    if weight.shape != (inner, k) or bias.shape != (inner,):
        raise ValueError(f"weight {tuple(weight.shape)} and bias {tuple(bias.shape)} do not fit x {tuple(x.shape)}")
    if inner % config.block_n or k % config.block_k or config.load == "tma-sms":
        raise ValueError(f"I = {inner} and K = {k} must be whole blocks of {config.block_n} and {config.block_k}, "
                         "one program a tile")
    if not (x.is_contiguous() and weight.is_contiguous() and bias.is_contiguous()):
        raise ValueError("x, weight and bias must be contiguous")
    if not x.dtype == weight.dtype == bias.dtype:
        raise ValueError(f"x, weight and bias must share a dtype, not {x.dtype}, {weight.dtype}, {bias.dtype}")
    out = torch.empty(m, inner, dtype=x.dtype, device=x.device)
    tiles = triton.cdiv(m, config.block_m) * (inner // config.block_n)
    meta = {"INNER": inner, "K": k, "BM": config.block_m, "BN": config.block_n, "BK": config.block_k,
            "GROUP_M": config.group_m, "num_warps": config.warps, "num_stages": config.stages}
    if config.load == "ptr":
        _up_gelu_kernel[(tiles,)](x, weight, bias, out, m, **meta)
    else:
        _up_gelu_tma_kernel[(tiles,)](
            TensorDescriptor.from_tensor(x, [config.block_m, config.block_k]),
            _weight_descriptor(weight, [config.block_n, config.block_k]), bias,
            TensorDescriptor.from_tensor(out, [config.block_m, config.block_n]), m, DT=gate_up_act._DTYPES[x.dtype],
            **meta)
    return out


def precompile(dense: nn.Linear) -> int:
    """Compile every band's variant for this layer now (M is not specialized), so the first long batch in serving does
    not pay Triton's compile; returns the launches that ran."""
    x = torch.zeros(8, dense.weight.shape[1], dtype=dense.weight.dtype, device=dense.weight.device)
    launched = 0
    for config in dict.fromkeys(config for _, config in ROUTE):
        if not launchable(x, dense, config):
            continue
        try:
            up_gelu(x, dense.weight, dense.bias, config)
        except Exception as exc:  # noqa: BLE001 - as fused_or_none
            give_up(exc)
            return launched
        launched += 1
    return launched


if triton is not None:
    import triton.language as tl

    from rose.layers.gate_up_act import _pointer_tile, _tile

    @triton.jit
    def _bias_gelu(acc, bias, dt: tl.constexpr):
        """GELU(acc + bias) as the unfused path rounds it: the linear's output rounded to dt, GELU in float32."""
        y = (acc + bias[None, :]).to(dt).to(tl.float32)
        return (0.5 * y * (1.0 + tl.math.erf(y * 0.7071067811865476))).to(dt)

    @triton.jit(do_not_specialize=["M"])
    def _up_gelu_tma_kernel(x_desc, w_desc, b_ptr, o_desc, M, INNER: tl.constexpr, K: tl.constexpr,
                            BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
                            DT: tl.constexpr):
        pid_m, pid_n = _tile(tl.program_id(0), M, INNER, BM, BN, GROUP_M)
        off_m, off_n = pid_m * BM, pid_n * BN
        acc = tl.zeros([BM, BN], dtype=tl.float32)
        for k in range(0, K, BK):
            acc = tl.dot(x_desc.load([off_m, k]), w_desc.load([off_n, k]).T, acc)
        bias = tl.load(b_ptr + off_n + tl.arange(0, BN)).to(tl.float32)
        o_desc.store([off_m, off_n], _bias_gelu(acc, bias, DT))

    @triton.jit(do_not_specialize=["M"])
    def _up_gelu_kernel(x_ptr, w_ptr, b_ptr, out_ptr, M, INNER: tl.constexpr, K: tl.constexpr, BM: tl.constexpr,
                        BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr):
        rm, rn, row_ok, a_ptrs, w_ptrs = _pointer_tile(x_ptr, w_ptr, M, INNER, K, BM, BN, BK, GROUP_M)
        acc = tl.zeros([BM, BN], dtype=tl.float32)
        for _ in range(0, K, BK):
            acc = tl.dot(tl.load(a_ptrs, mask=row_ok[:, None], other=0.0), tl.load(w_ptrs), acc)
            a_ptrs += BK
            w_ptrs += BK
        bias = tl.load(b_ptr + rn).to(tl.float32)
        tl.store(out_ptr + rm.to(tl.int64)[:, None] * INNER + rn[None, :],
                 _bias_gelu(acc, bias, out_ptr.dtype.element_ty), mask=row_ok[:, None])
