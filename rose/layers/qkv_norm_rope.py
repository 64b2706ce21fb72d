"""The QKV projection with the per-head QK norm and RoPE in its epilogue, for many tokens (Qwen3's attention input at
M in the thousands).

Why (issue 14, benchmarks/NOTES.md "QK-norm and RoPE in the QKV GEMM's epilogue"): at 4096 tokens of the 0.6B the
layers' QKV GEMM writes [M, (Hq + 2 Hkv) D] in bf16 and the QK-norm+RoPE kernel reads q and k back and writes them
again: 0.6 ms of a 4096-token forward (28 calls), 5 % of it. A program here computes one head's D columns of a row
block in one accumulator, splits it into its halves (the RoPE pairs d and d + D/2), normalizes each row over the
head, rotates it, and writes q, k and v as the attention takes them, each contiguous.

Measured on the H200 (0fdb159, NOTES): the first form, two accumulators of D/2 columns (Hopper's 64 x 64 MMAs), ran
154 µs a call against cuBLAS's 54 plus the QK-norm+RoPE kernel's 19, and the 0.6B's bs1-4096 +15 %: off by default.
This form has not run on a GPU: one accumulator of the head (64 x 128 MMAs, as the fused gate-up's), cos and sin
from the persistent decoder's RoPE table made once a call (rope_table; rose.layers.rope_tiles) instead of for every
head in the epilogue (13.6 k → 3.2 k instructions and no stack in the sm_90 SASS), and tiles of 64 rows on 4 warps so
that two CTAs share an SM (BLOCK_M's comment).

Rounding follows the unfused path (rose.layers.fused._norm_rope_heads): each product rounded to the activations'
dtype as the GEMM's output would be, rstd in float32 over the rounded values, the normed value rounded, times the
weight, rounded (Qwen3's RMSNorm), cos and sin rounded, the rotation rounded. The accumulation order is Triton's, not
cuBLAS's, so a product may differ from F.linear's by a rounding step; the tests bound that.

Qwen3's attention runs through it from ROSE_QKV_NORM_ROPE_MIN tokens (4096) on GPUs with TMA that fit its tiles
(rose.layers.tma.gemm_tiles_fit) when ROSE_QKV_NORM_ROPE is on (off by default), without a QKV bias; a launch that
fails turns the route off for the process.
"""

from __future__ import annotations

import logging
import os

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU builds of torch ship without Triton
    triton = None
from rose.layers.tma import (
    DTYPES,
    TensorDescriptor,
    describable,
    device_index,
    gemm_tiles_fit,
    grouped_tile,
    weight_descriptor,
)

log = logging.getLogger("rose.qkv_norm_rope")

# the tile: rows, K step, warps, stages, row blocks grouped. 64 rows on one warpgroup: 199 registers a thread
# (the [rows, D] float32 accumulator and the epilogue's halves), so two CTAs share an SM (2 x 25.5 k of the 64 k
# registers; 74 KB of shared memory each) and one CTA's epilogue overlaps the other's MMAs; 128 rows on 8 warps take
# 255 registers, one CTA filling the register file (sm_90 SASS on a CPU; not yet timed)
BLOCK_M, BLOCK_K, WARPS, STAGES, GROUP_M = 64, 64, 4, 3, 8
ROPE_PROGRAMS = 1024  # programs making the RoPE table, a row at a time each (rope_rows)
NORMS = {None: 0, "rms": 1}  # the QK step's norm -> the kernel's NORM mode (Gemma's (1 + w) form is not routed)


def engine_route(env: dict[str, str] | None = None) -> int | None:
    """The least tokens the layers route through the kernel (ROSE_QKV_NORM_ROPE_MIN, 4096), or None with
    ROSE_QKV_NORM_ROPE off (0 / off / false); a value it cannot read is a warning and the route off."""
    env = os.environ if env is None else env
    if env.get("ROSE_QKV_NORM_ROPE", "0").strip().lower() in ("", "0", "off", "false"):
        return None
    try:
        return int(env.get("ROSE_QKV_NORM_ROPE_MIN", "4096"))
    except ValueError as exc:
        log.warning("ROSE_QKV_NORM_ROPE_MIN: %s; the QKV GEMM and the QK-norm+RoPE kernel serve", exc)
        return None


LEAST = engine_route()  # read once, at import; give_up() turns it off


def give_up(exc: BaseException) -> None:
    """Turn the route off for this process after a launch failed: logged once; the unfused pair serves on."""
    global LEAST
    if LEAST is not None:
        log.warning("the fused QKV kernel failed (%s: %s); the QKV GEMM and QK-norm+RoPE serve from here on",
                    type(exc).__name__, exc)
    LEAST = None


def tiles(x: torch.Tensor, weight: torch.Tensor, heads: int, kv_heads: int, head_dim: int) -> bool:
    """Whether the kernel tiles x [M, K] @ weight [(Hq + 2 Hkv) D, K]ᵀ: one dtype, contiguous and describable, K
    whole steps, a power-of-two head dim of 32 to 256 (the head is a tile's columns)."""
    if x.dim() != 2 or weight.shape != ((heads + 2 * kv_heads) * head_dim, x.shape[1]) or weight.dtype != x.dtype:
        return False
    if not 32 <= head_dim <= 256 or head_dim & (head_dim - 1) or x.shape[1] % BLOCK_K:  # (a TMA box: <= 256)
        return False
    return x.is_contiguous() and weight.is_contiguous() and describable(x) and describable(weight)


def fits(x: torch.Tensor, weight: torch.Tensor, heads: int, kv_heads: int, head_dim: int) -> bool:
    """What the layers route: bf16 or fp16 activations the kernel `tiles`."""
    return x.dtype in (torch.bfloat16, torch.float16) and tiles(x, weight, heads, kv_heads, head_dim)


def fused_or_none(x: torch.Tensor, proj, q_weight, k_weight, positions: torch.Tensor, inv_freq: torch.Tensor,
                  heads: int, kv_heads: int, head_dim: int, eps: float, norm: str | None,
                  least: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """(q, k, v) through the fused kernel where it is routed (the route on, a CUDA batch of at least `least` tokens,
    LEAST's by default, on a GPU with TMA, no bias on the projection `proj`, a norm it has, shapes it `fits`), else
    None (the caller runs the unfused pair); a launch that fails turns the route off (give_up) and returns None."""
    if LEAST is None:  # the route off (ROSE_QKV_NORM_ROPE), whatever `least` says
        return None
    least = LEAST if least is None else least
    if triton is None or not x.is_cuda or x.shape[0] < least or proj.bias is not None:
        return None
    if norm not in NORMS or not gemm_tiles_fit(device_index(x.device)):
        return None
    if not fits(x, proj.weight, heads, kv_heads, head_dim):
        return None
    try:
        return qkv_norm_rope(x, proj.weight, q_weight, k_weight, positions, inv_freq, heads, kv_heads, eps, norm)
    except Exception as exc:  # noqa: BLE001 - a GPU the kernel cannot launch on: the unfused pair from here on
        give_up(exc)
        return None


def precompile(attn) -> int:
    """Compile the routed variant for this attention module's shapes now (M is not specialized: one launch of 8 rows
    compiles what every batch runs). Returns the launches that ran (0 when nothing would route, the route off
    included)."""
    weight = attn.qkv_proj.weight
    x = torch.zeros(8, weight.shape[1], dtype=weight.dtype, device=weight.device)
    weights = (None, None) if attn.qk_norm is None else (attn.q_norm.weight, attn.k_norm.weight)
    positions = torch.arange(8, device=weight.device)
    inv_freq = torch.ones(attn.head_dim // 2, dtype=torch.float32, device=weight.device)
    return int(fused_or_none(x, attn.qkv_proj, *weights, positions, inv_freq, attn.num_heads, attn.num_kv_heads,
                             attn.head_dim, 1e-6, attn.qk_norm, least=0) is not None)


def qkv_norm_rope(x: torch.Tensor, weight: torch.Tensor, q_weight: torch.Tensor | None, k_weight: torch.Tensor | None,
                  positions: torch.Tensor, inv_freq: torch.Tensor, heads: int, kv_heads: int, eps: float,
                  norm: str | None = "rms") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [M, K] @ weight [(Hq + 2 Hkv) D, K]ᵀ -> q [M, Hq, D], k [M, Hkv, D] (each head normed by `norm`, then
    rotated at its token's position), v [M, Hkv, D], each contiguous in x's dtype; inv_freq float32 [D / 2]."""
    m, k = x.shape
    head_dim = weight.shape[0] // (heads + 2 * kv_heads)
    if not tiles(x, weight, heads, kv_heads, head_dim):
        raise ValueError(f"x {tuple(x.shape)} {x.dtype} and weight {tuple(weight.shape)} {weight.dtype} are not "
                         f"{heads} + 2 x {kv_heads} heads the kernel tiles (contiguous, K a multiple of {BLOCK_K})")
    if norm is None:  # the weight pointers are never read: any tensor will do
        q_weight = k_weight = inv_freq
    half = head_dim // 2
    rope = rope_table(positions, inv_freq, half, x.dtype)  # once a call, not once a head in the epilogue
    q = torch.empty(m, heads, head_dim, dtype=x.dtype, device=x.device)
    kk, v = (torch.empty(m, kv_heads, head_dim, dtype=x.dtype, device=x.device) for _ in range(2))
    programs = triton.cdiv(m, BLOCK_M) * (heads + 2 * kv_heads)
    _qkv_norm_rope_kernel[(programs,)](
        TensorDescriptor.from_tensor(x, [BLOCK_M, BLOCK_K]), weight_descriptor(weight, [head_dim, BLOCK_K]),
        q, kk, v, q_weight, k_weight, rope, m, eps, HQ=heads, HKV=kv_heads, HALF=half, K=k,
        BM=BLOCK_M, BK=BLOCK_K, GROUP_M=GROUP_M, NORM=NORMS[norm], DT=DTYPES[x.dtype],
        num_warps=WARPS, num_stages=STAGES)
    return q, kk, v


def rope_table(positions: torch.Tensor, inv_freq: torch.Tensor, half: int, dtype: torch.dtype) -> torch.Tensor:
    """The RoPE table float32 [2, M, half] (rose.layers.rope_tiles.rope_rows: cos, then sin, of each token's position
    times inv_freq's first `half`, rounded to `dtype` as the unfused QK-norm+RoPE kernel rounds them)."""
    if inv_freq.shape[0] < half:
        raise ValueError(f"inv_freq has {inv_freq.shape[0]} frequencies; the heads' halves need {half}")
    m = positions.shape[0]
    rope = torch.empty(2, m, half, dtype=torch.float32, device=positions.device)
    _rope_table_kernel[(max(1, min(m, ROPE_PROGRAMS)),)](positions, inv_freq, rope, m, DT=DTYPES[dtype], HALF=half)
    return rope


if triton is not None:
    from rose.layers.rope_tiles import norm_rotate, rope_rows, rope_tile

    @triton.jit(do_not_specialize=["M"])  # (one variant whatever the batch: the warm-up's 8 rows compile it)
    def _rope_table_kernel(pos_ptr, inv_freq_ptr, rope_ptr, M, DT: tl.constexpr, HALF: tl.constexpr):
        rope_rows(pos_ptr, inv_freq_ptr, rope_ptr, M, tl.program_id(0), tl.num_programs(0), DT, HALF)

    @triton.jit
    def _store_head(dst_ptr, rows, row_ok, head, heads, o1, o2, HALF: tl.constexpr):
        """A head's two halves into dst [M, heads, 2 HALF] at rows."""
        j = tl.arange(0, HALF)
        at = dst_ptr + (rows.to(tl.int64)[:, None] * heads + head) * (2 * HALF) + j[None, :]
        tl.store(at, o1, mask=row_ok[:, None])
        tl.store(at + HALF, o2, mask=row_ok[:, None])

    @triton.jit(do_not_specialize=["M"])
    def _qkv_norm_rope_kernel(x_desc, w_desc, q_ptr, k_ptr, v_ptr, qw_ptr, kw_ptr, rope_ptr, M, eps,
                              HQ: tl.constexpr, HKV: tl.constexpr, HALF: tl.constexpr, K: tl.constexpr,
                              BM: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr, NORM: tl.constexpr,
                              DT: tl.constexpr):
        """One (row block, head) tile: the head's columns [head D, head D + D) in one accumulator, split into its
        two halves in the epilogue (rows past M read as zeros and are not stored); q heads first, then k's, then
        v's, as the weight's rows."""
        pid_m, head = grouped_tile(tl.program_id(0), M, HQ + 2 * HKV, BM, 1, GROUP_M)
        off_m, col = pid_m * BM, head * 2 * HALF
        acc = tl.zeros([BM, 2 * HALF], dtype=tl.float32)
        for k in range(0, K, BK):
            acc = tl.dot(x_desc.load([off_m, k]), w_desc.load([col, k]).T, acc)
        # rounded as the GEMM's output would be; [BM, D] -> [BM, HALF, 2] -> the halves d < HALF and d >= HALF
        n1, n2 = tl.split(tl.permute(tl.reshape(acc.to(DT).to(tl.float32), [BM, 2, HALF]), (0, 2, 1)))
        rows = off_m + tl.arange(0, BM)
        row_ok = rows < M
        if head < HQ + HKV:
            c, s = rope_tile(rope_ptr, rows, row_ok, M, HALF)
            if head < HQ:
                o1, o2 = norm_rotate(n1, n2, qw_ptr, c, s, eps, DT, HALF, NORM)
                _store_head(q_ptr, rows, row_ok, head, HQ, o1, o2, HALF)
            else:
                o1, o2 = norm_rotate(n1, n2, kw_ptr, c, s, eps, DT, HALF, NORM)
                _store_head(k_ptr, rows, row_ok, head - HQ, HKV, o1, o2, HALF)
        else:
            _store_head(v_ptr, rows, row_ok, head - HQ - HKV, HKV, n1.to(DT), n2.to(DT), HALF)
