"""Triton device functions of the persistent decoder (rose.layers.persistent_kernels makes the RoPE table once,
rope_rows; its attention step, rose.layers.persistent_attention, reads its tiles back, rope_tile, and RMS-norms and
rotates a head's two halves with them, norm_rotate), each rounding as the layers' unfused
QK-norm+RoPE kernel does (rose.layers.fused._norm_rope_heads)."""

import triton
import triton.language as tl


@triton.jit
def rope_rows(pos_ptr, inv_freq_ptr, rope_ptr, T, pid, nprog, dt, HALF: tl.constexpr):
    """The RoPE table, once per forward: rope[0, t] = cos and rope[1, t] = sin of token t's position times the
    frequencies, rounded to dt as HF's are (float32 [2, T, HALF]). A row at a time: cos and sin of a whole
    [tokens x HALF] tile inside the attention phase unrolled ~15 000 instructions of libdevice code per item,
    spilling, and cost 128 tokens ~38 µs a layer (NOTES)."""
    j = tl.arange(0, HALF)
    inv_freq = tl.load(inv_freq_ptr + j)
    for r in range(pid, T, nprog):
        freq = tl.load(pos_ptr + r).to(tl.float32) * inv_freq
        tl.store(rope_ptr + r * HALF + j, tl.cos(freq).to(dt).to(tl.float32))
        tl.store(rope_ptr + (T + r) * HALF + j, tl.sin(freq).to(dt).to(tl.float32))


@triton.jit
def rope_tile(rope_ptr, rows, ok, T, HALF: tl.constexpr):
    """cos and sin [rows, HALF] from the RoPE table (rope_rows)."""
    at = rows[:, None] * HALF + tl.arange(0, HALF)[None, :]
    c = tl.load(rope_ptr + at, mask=ok[:, None], other=0.0, cache_modifier=".cg")
    return c, tl.load(rope_ptr + T * HALF + at, mask=ok[:, None], other=0.0, cache_modifier=".cg")


@triton.jit
def norm_rotate(n1, n2, w_ptr, c, s, eps, dt, HALF: tl.constexpr, NORM: tl.constexpr):
    """A head's two halves [rows, HALF] (float32 of the rounded products): RMS-normed per row by w (NORM 1, Qwen3's
    w * round(x); 0: no norm), then rotated by the rows' cos and sin (rope_tile); returned rounded to dt."""
    if NORM != 0:
        j = tl.arange(0, HALF)
        rstd = tl.rsqrt((tl.sum(n1 * n1, axis=1) + tl.sum(n2 * n2, axis=1)) / (2 * HALF) + eps)[:, None]
        w1 = tl.load(w_ptr + j).to(tl.float32)[None, :]
        w2 = tl.load(w_ptr + HALF + j).to(tl.float32)[None, :]
        n1 = ((n1 * rstd).to(dt).to(tl.float32) * w1).to(dt).to(tl.float32)
        n2 = ((n2 * rstd).to(dt).to(tl.float32) * w2).to(dt).to(tl.float32)
    return (n1 * c - n2 * s).to(dt), (n2 * c + n1 * s).to(dt)
