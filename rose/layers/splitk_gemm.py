"""A GEMM for few tokens (Y = X Wᵀ, bf16, M ≤ a few hundred): split-K over the SMs, reduced inside the kernel.

Why (benchmarks/NOTES.md, "GEMMs at small M"): at 128 tokens the Qwen3-0.6B's 112 projections cost 745 µs
in cuBLAS against a 205 µs weight-read floor. An output of 128 x 1024 is 8 tiles of 128 x 128: 8 of 132 SMs
stream the whole weight, each at one SM's bandwidth. Splitting K gives every SM a slice of the weight.

One launch per GEMM (a CUDA-graph node): program (n, s, m) computes tile (m, n) over the s-th slice of K in
float32 and stores it in a workspace; it then takes a ticket on the tile's counter, and the program that
arrives last sums the SPLIT partials in slice order (so the result does not depend on which program ran
first: the same bits every run), writes the bf16 tile and resets the counter for the next call or replay.
No program waits for another, so the grid may be larger than what fits on the GPU at once.

Status: an experiment for issue 14, not wired into the layers. `benchmarks.gemm_small_m` measures it beside
cuBLAS per projection and configuration; its correctness is checked against torch.matmul by the GPU test
(tests/rose/test_rose_splitk_gemm_gpu.py) and, on a CPU, under Triton's interpreter (TRITON_INTERPRET=1).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU builds of torch ship without Triton
    triton = None


@dataclass(frozen=True)
class SplitConfig:
    block_m: int = 128
    block_n: int = 64
    block_k: int = 64
    split: int = 4
    warps: int = 4
    stages: int = 3

    def label(self) -> str:
        return f"m{self.block_m}n{self.block_n}k{self.block_k}s{self.split}w{self.warps}p{self.stages}"


class Workspace:
    """The partials and tile counters of one GEMM shape (reused across calls; counters come back to zero)."""

    def __init__(self, m: int, n: int, config: SplitConfig, device: torch.device | str) -> None:
        self.m, self.n, self.config = m, n, config
        tiles = -(-m // config.block_m) * -(-n // config.block_n)
        self.partials = torch.empty(tiles * config.split * config.block_m * config.block_n, dtype=torch.float32,
                                    device=device)
        self.counters = torch.zeros(tiles, dtype=torch.int32, device=device)


def splitk_linear(x: torch.Tensor, weight: torch.Tensor, config: SplitConfig, workspace: Workspace,
                  out: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] @ weight [N, K]ᵀ -> [M, N] in x's dtype; K must split into `split` slices of whole blocks."""
    m, k = x.shape
    n = weight.shape[0]
    if weight.shape[1] != k:
        raise ValueError(f"x has K = {k}, weight has K = {weight.shape[1]}")
    if k % (config.split * config.block_k):
        raise ValueError(f"K = {k} does not split into {config.split} slices of {config.block_k}-wide blocks")
    if x.stride(1) != 1 or weight.stride(1) != 1:
        raise ValueError("x and weight must be contiguous along K")
    if x.dtype != weight.dtype:
        raise ValueError(f"x is {x.dtype}, weight is {weight.dtype}")
    if (workspace.m, workspace.n, workspace.config) != (m, n, config):
        raise ValueError(f"the workspace is for {workspace.m} x {workspace.n} with {workspace.config.label()}, "
                         f"not {m} x {n} with {config.label()}")  # a smaller one would be written past its end
    out = torch.empty((m, n), dtype=x.dtype, device=x.device) if out is None else out
    if out.shape != (m, n) or out.dtype != x.dtype or out.stride(1) != 1:
        raise ValueError(f"out must be a {m} x {n} {x.dtype} tensor contiguous along N")
    grid = (triton.cdiv(n, config.block_n), config.split, triton.cdiv(m, config.block_m))
    _splitk_kernel[grid](x, weight, out, workspace.partials, workspace.counters, m, n, k // config.split,
                         x.stride(0), weight.stride(0), out.stride(0), ITERS=k // (config.split * config.block_k),
                         BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
                         SPLIT=config.split, num_warps=config.warps, num_stages=config.stages)
    return out


if triton is not None:
    @triton.jit
    def _splitk_kernel(x_ptr, w_ptr, y_ptr, part_ptr, count_ptr, M, N, k_slice, stride_xm, stride_wn, stride_ym,
                       ITERS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT: tl.constexpr):
        pid_n = tl.program_id(0)
        pid_s = tl.program_id(1)
        pid_m = tl.program_id(2)
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = tl.arange(0, BLOCK_K)
        x_ptrs = x_ptr + rm[:, None] * stride_xm + (pid_s * k_slice + rk)[None, :]
        w_ptrs = w_ptr + rn[None, :] * stride_wn + (pid_s * k_slice + rk)[:, None]  # [BLOCK_K, BLOCK_N] of Wᵀ
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for _ in range(ITERS):
            x = tl.load(x_ptrs, mask=rm[:, None] < M, other=0.0)
            w = tl.load(w_ptrs, mask=rn[None, :] < N, other=0.0)
            acc = tl.dot(x, w, acc)
            x_ptrs += BLOCK_K
            w_ptrs += BLOCK_K
        mask = (rm[:, None] < M) & (rn[None, :] < N)
        y_ptrs = y_ptr + rm[:, None] * stride_ym + rn[None, :]
        if SPLIT == 1:
            tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=mask)
        else:
            tile = pid_m * tl.num_programs(0) + pid_n
            tile_elems = BLOCK_M * BLOCK_N
            local = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
            tl.store(part_ptr + (tile * SPLIT + pid_s) * tile_elems + local, acc)
            tl.debug_barrier()  # every thread's partial is written before the ticket is taken (released by it)
            ticket = tl.atomic_add(count_ptr + tile, 1, sem="acq_rel", scope="gpu")
            if ticket == SPLIT - 1:  # the last to arrive: every other partial is visible (acquired)
                total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
                for s in range(SPLIT):  # slice order, whoever finished first: deterministic
                    total += tl.load(part_ptr + (tile * SPLIT + s) * tile_elems + local, cache_modifier=".cg")
                tl.store(y_ptrs, total.to(y_ptr.dtype.element_ty), mask=mask)
                tl.store(count_ptr + tile, 0)  # ready for the next call (a graph replays the same counters)
