"""The add + RMSNorm steps folded into the persistent decoder's GEMM phases (Tiles.fold; Qwen3's pre-norm layers).

Without the fold a layer has two steps whose only work is to sum the o and down projections' split-K partials into
the residual and norm it (16 of 132 programs busy at 16 tokens), each behind a grid barrier (~1 µs of release and
~0.5 of skew on an H100: benchmarks/NOTES.md, "What a step of the persistent kernel costs"). With it:
- each o or down item, after storing its partial, counts its arrival on its column tile (an atomic with
  acquire-release order after a bar.sync, the pattern of the grid barrier's counter form); the last of the tile's
  slices to arrive sums the slices in their order (0 + p0 + p1 + ..., as the norm step did: the same residual bits),
  adds the bias, adds it into the residual's columns of the tile, and writes each row's sum of squares over those
  columns into its own slot [tile, row] (no atomic sums: the next reader adds the slots in a fixed order, so every
  run gives the same bits);
- the GEMM after it (gate-up, or the next layer's QKV) reads the residual itself and norms its rows as it loads them:
  rstd from the row's slots, then w * round(x * rstd), rounded, as the norm step rounded h (_normed).
The first layer's QKV reads slots that step 0 writes from the embeddings (sum_squares_rows); the final norm reads the
residual whole. Only rstd's order of summation differs from the norm step's (the tiles' sums, then their sum), so h
can differ from the unfolded kernel's in the last bit of a few elements."""

import triton
import triton.language as tl


@triton.jit
def sum_squares_rows(res_ptr, ss_ptr, T, pid, nprog, H: tl.constexpr, BLOCK_H: tl.constexpr, NT: tl.constexpr):
    """Each row's sum of squares (float32) into ss [NT, T]: the whole row's in slot 0, zeros in the other NT - 1
    (step 0 of a folded forward: the first QKV reads them as it reads the down projection's). A row per program at a
    time."""
    offs = tl.arange(0, BLOCK_H)
    ok = offs < H
    for r in range(pid, T, nprog):
        x = tl.load(res_ptr + r * H + offs, mask=ok, other=0.0).to(tl.float32)
        tl.store(ss_ptr + r, tl.sum(x * x, axis=0))
        for t in tl.static_range(1, NT):
            tl.store(ss_ptr + t * T + r, 0.0)


@triton.jit
def rows_rstd(ss_ptr, rm, row_ok, T, eps, H: tl.constexpr, NT: tl.constexpr):
    """1 / RMS of rows `rm` from their NT slots of sums of squares (ss [NT, T]), added in slot order."""
    total = tl.zeros(rm.shape, dtype=tl.float32)
    for t in tl.static_range(NT):
        total += tl.load(ss_ptr + t * T + rm, mask=row_ok, other=0.0, cache_modifier=".cg")
    return tl.rsqrt(total / H + eps)


@triton.jit
def normed_block(a, rstd, g_ptr, k0, BK: tl.constexpr):
    """A block of residual rows `a` [M, BK] (columns k0.. of K) as RMSNorm's output: w * round(x * rstd), rounded
    (_normed's rounding)."""
    dt = a.dtype
    g = tl.load(g_ptr + k0 + tl.arange(0, BK)).to(tl.float32)
    return ((a.to(tl.float32) * rstd[:, None]).to(dt).to(tl.float32) * g[None, :]).to(dt)


@triton.jit
def fold_tile(part_ptr, b_ptr, res_ptr, ss_ptr, arrivals_ptr, tile, rm, rn, row_ok, T, N: tl.constexpr,
              BLOCK_M: tl.constexpr, BN: tl.constexpr, SPLIT: tl.constexpr, BIAS: tl.constexpr):
    """After an item of column tile `tile` stored its partial (part_ptr [SPLIT, T, N] float32): count its arrival;
    the last of the tile's SPLIT items adds the slices, in order, and the bias into the residual's columns rn (N =
    hidden: the residual's row stride), writes the rows' sums of squares over them into ss[tile, rows], and resets
    the tile's count for the next phase that counts on it."""
    tl.debug_barrier()  # every warp's partial stored before the arrival (released by the atomic)
    arrived = tl.atomic_add(arrivals_ptr + tile, 1, sem="acq_rel", scope="gpu")
    if arrived == SPLIT - 1:
        at = rm[:, None] * N + rn[None, :]
        y = tl.zeros([BLOCK_M, BN], dtype=tl.float32)
        for s in tl.static_range(SPLIT):
            y += tl.load(part_ptr + s * T * N + at, mask=row_ok[:, None], other=0.0, cache_modifier=".cg")
        if BIAS:
            y += tl.load(b_ptr + rn).to(tl.float32)[None, :]
        x = tl.load(res_ptr + at, mask=row_ok[:, None], other=0.0, cache_modifier=".cg")
        dt = x.dtype
        x = (x.to(tl.float32) + y.to(dt).to(tl.float32)).to(dt)
        tl.store(res_ptr + at, x, mask=row_ok[:, None])
        xf = x.to(tl.float32)
        tl.store(ss_ptr + tile * T + rm, tl.sum(xf * xf, axis=1), mask=row_ok)
        tl.atomic_xchg(arrivals_ptr + tile, 0, sem="relaxed", scope="gpu")
