"""The persistent decoder's heads and attention (rose.layers.persistent_kernels runs them as its phases): the QKV's
split-K partials summed, QK-norm and RoPE (the table once a forward), the heads step, and attention either over the
heads step's ready heads or computing its heads itself."""

import triton
import triton.language as tl


@triton.jit
def _softmax_step(logits, v, best, total, acc, seq_ptr, q_seq, rq, keys, key_ok, CAUSAL: tl.constexpr):
    """One key block of an online softmax: the scores masked to each query's own sequence (and no later key when
    causal), the running max and sum rescaled, v's weighted sum added. Returns (best, total, acc)."""
    key_seq = tl.load(seq_ptr + keys, mask=key_ok, other=-1)
    allowed = (q_seq[:, None] == key_seq[None, :]) & key_ok[None, :]
    if CAUSAL:
        allowed = allowed & (keys[None, :] <= rq[:, None])
    new_best = tl.maximum(best, tl.max(tl.where(allowed, logits, -1.0e30), axis=1))
    p = tl.where(allowed, tl.exp(logits - new_best[:, None]), 0.0)
    shrink = tl.exp(best - new_best)
    return new_best, total * shrink + tl.sum(p, axis=1), acc * shrink[:, None] + tl.dot(p.to(v.dtype), v)


@triton.jit
def _summed(part_ptr, b_ptr, like_ptr, cols, rm, ok, T, QKV_N: tl.constexpr, SPLIT: tl.constexpr,
            BIAS: tl.constexpr):
    """The QKV output at [rm, cols] from its SPLIT float32 partials and its bias (BIAS), rounded to the
    activations' dtype (like_ptr's) as a GEMM's output is."""
    acc = tl.zeros([rm.shape[0], cols.shape[0]], dtype=tl.float32)
    for s in tl.static_range(SPLIT):
        acc += tl.load(part_ptr + (s * T + rm[:, None]) * QKV_N + cols[None, :], mask=ok[:, None], other=0.0,
                       cache_modifier=".cg")
    if BIAS:
        acc += tl.load(b_ptr + cols).to(tl.float32)[None, :]
    return acc.to(like_ptr.dtype.element_ty).to(tl.float32)

@triton.jit
def _norm_rope(qkv_ptr, like_ptr, col0, w_ptr, rm, ok, c, s, eps, T, QKV_N: tl.constexpr, HALF: tl.constexpr,
               SPLIT: tl.constexpr):
    """One head's [BLOCK_M, D] slice of the QKV output, RMS-normed by w and rotated: its two halves."""
    j = tl.arange(0, HALF)
    n1 = _summed(qkv_ptr, qkv_ptr, like_ptr, col0 + j, rm, ok, T, QKV_N, SPLIT, False)
    n2 = _summed(qkv_ptr, qkv_ptr, like_ptr, col0 + HALF + j, rm, ok, T, QKV_N, SPLIT, False)
    dt = like_ptr.dtype.element_ty
    rstd = tl.rsqrt((tl.sum(n1 * n1, axis=1) + tl.sum(n2 * n2, axis=1)) / (2 * HALF) + eps)[:, None]
    w1 = tl.load(w_ptr + j).to(tl.float32)[None, :]
    w2 = tl.load(w_ptr + HALF + j).to(tl.float32)[None, :]
    n1 = ((n1 * rstd).to(dt).to(tl.float32) * w1).to(dt).to(tl.float32)
    n2 = ((n2 * rstd).to(dt).to(tl.float32) * w2).to(dt).to(tl.float32)
    return (n1 * c - n2 * s).to(dt), (n2 * c + n1 * s).to(dt)


@triton.jit
def _rope_rows(pos_ptr, inv_freq_ptr, rope_ptr, T, pid, nprog, dt, HALF: tl.constexpr):
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
def _rope_table(rope_ptr, rows, ok, T, HALF: tl.constexpr):
    """cos and sin [rows, HALF] from the RoPE table (_rope_rows)."""
    at = rows[:, None] * HALF + tl.arange(0, HALF)[None, :]
    c = tl.load(rope_ptr + at, mask=ok[:, None], other=0.0, cache_modifier=".cg")
    return c, tl.load(rope_ptr + T * HALF + at, mask=ok[:, None], other=0.0, cache_modifier=".cg")


@triton.jit
def _head(qkv_ptr, b_ptr, like_ptr, col0, w_ptr, rope_ptr, rows, ok, eps, T, QKV_N: tl.constexpr,
          HALF: tl.constexpr, SPLIT: tl.constexpr, BIAS: tl.constexpr, ROPE: tl.constexpr):
    """One head's [rows, D] slice of the QKV output as its two halves: QK-normed and rotated (ROPE, Qwen3), or as
    the projection gives it with its bias (BERT)."""
    if ROPE:
        c, s = _rope_table(rope_ptr, rows, ok, T, HALF)
        return _norm_rope(qkv_ptr, like_ptr, col0, w_ptr, rows, ok, c, s, eps, T, QKV_N, HALF, SPLIT)
    j = tl.arange(0, HALF)
    dt = like_ptr.dtype.element_ty
    return (_summed(qkv_ptr, b_ptr, like_ptr, col0 + j, rows, ok, T, QKV_N, SPLIT, BIAS).to(dt),
            _summed(qkv_ptr, b_ptr, like_ptr, col0 + HALF + j, rows, ok, T, QKV_N, SPLIT, BIAS).to(dt))


@triton.jit
def _attention(qkv_ptr, b_ptr, attn_ptr, qn_ptr, kn_ptr, rope_ptr, seq_ptr, T, pid, nprog, eps, scale,
               NH: tl.constexpr, NKV: tl.constexpr, HALF: tl.constexpr, BLOCK_M: tl.constexpr,
               BQ: tl.constexpr, BKEY: tl.constexpr, CAUSAL: tl.constexpr, SPLIT: tl.constexpr,
               BIAS: tl.constexpr, ROPE: tl.constexpr):
    """Items of a q head and a block of BQ queries: those queries' half-heads (_head), then over the keys of the
    head's kv head BKEY at a time (their half-heads, an online softmax), softmax(q k^T) v over the keys of the
    query's own sequence (and no later ones when causal). q, k, v are summed from the QKV's partials. Keys a block
    at a time keep the phase's registers low: all 128 keys' norm and RoPE at once (float32 [128 x 64] tiles of
    k, cos and sin) made the whole kernel spill, its GEMM loops included (58 local loads at 128 tokens)."""
    D: tl.constexpr = 2 * HALF
    QKV_N: tl.constexpr = (NH + 2 * NKV) * D
    dt = attn_ptr.dtype.element_ty
    dcols = tl.arange(0, D)
    for item in tl.range(pid, NH * tl.cdiv(T, BQ), nprog, num_stages=1):  # unpipelined: q, k, v in smem
        # (blocks of queries past the batch's T skipped: at 85 tokens in a block of 128, a quarter of the items)
        hq = item % NH
        q0 = (item // NH) * BQ
        rq = q0 + tl.arange(0, BQ)
        q_ok = rq < T
        g = hq // (NH // NKV)
        q1, q2 = _head(qkv_ptr, b_ptr, attn_ptr, hq * D, qn_ptr, rope_ptr, rq, q_ok, eps, T, QKV_N, HALF, SPLIT,
                       BIAS, ROPE)
        q_seq = tl.load(seq_ptr + rq, mask=q_ok, other=-2)
        top = tl.minimum(T, q0 + BQ) if CAUSAL else T  # no key after the block's last query when causal
        best = tl.full([BQ], -1.0e30, dtype=tl.float32)
        total = tl.zeros([BQ], dtype=tl.float32)
        acc = tl.zeros([BQ, D], dtype=tl.float32)
        for k0 in tl.range(0, top, BKEY, num_stages=1):
            keys = k0 + tl.arange(0, BKEY)
            key_ok = keys < T
            k1, k2 = _head(qkv_ptr, b_ptr, attn_ptr, (NH + g) * D, kn_ptr, rope_ptr, keys, key_ok, eps, T, QKV_N,
                           HALF, SPLIT, BIAS, ROPE)
            v = _summed(qkv_ptr, b_ptr, attn_ptr, (NH + NKV + g) * D + dcols, keys, key_ok, T, QKV_N, SPLIT,
                        BIAS).to(dt)
            logits = (tl.dot(q1, tl.trans(k1)) + tl.dot(q2, tl.trans(k2))) * scale
            best, total, acc = _softmax_step(logits, v, best, total, acc, seq_ptr, q_seq, rq, keys, key_ok, CAUSAL)
        o = acc / tl.where(total > 0, total, 1.0)[:, None]
        tl.store(attn_ptr + rq[:, None] * (NH * D) + hq * D + dcols[None, :], o.to(dt), mask=q_ok[:, None])

@triton.jit
def _heads(qkv_ptr, b_ptr, heads_ptr, qn_ptr, kn_ptr, rope_ptr, T, pid, nprog, eps, NH: tl.constexpr,
           NKV: tl.constexpr, HALF: tl.constexpr, BR: tl.constexpr, SPLIT: tl.constexpr, BIAS: tl.constexpr,
           ROPE: tl.constexpr):
    """The heads step (HEADS): every head of every row once, into heads [T, QKV_N] in the activations' dtype: q
    and k QK-normed and rotated (ROPE), v summed; or all three summed with their bias (BERT). Items of a head and
    a block of BR rows, over all programs: attention then reads ready heads, where computing them inside its
    items did each key block's norm and RoPE once per q head and query block (up to 8 times at 128 tokens) on a chain
    of dependent loads (NOTES: 15.8 µs a layer at 128 tokens)."""
    HEADS_N: tl.constexpr = NH + 2 * NKV
    D: tl.constexpr = 2 * HALF
    QKV_N: tl.constexpr = HEADS_N * D
    dt = heads_ptr.dtype.element_ty
    j = tl.arange(0, HALF)
    for item in range(pid, HEADS_N * tl.cdiv(T, BR), nprog):
        hh = item % HEADS_N
        rows = (item // HEADS_N) * BR + tl.arange(0, BR)
        ok = rows < T
        if ROPE and hh < NH + NKV:
            w_ptr = kn_ptr
            if hh < NH:
                w_ptr = qn_ptr
            a, b = _head(qkv_ptr, b_ptr, heads_ptr, hh * D, w_ptr, rope_ptr, rows, ok, eps, T, QKV_N, HALF, SPLIT,
                         BIAS, ROPE)
        else:
            a = _summed(qkv_ptr, b_ptr, heads_ptr, hh * D + j, rows, ok, T, QKV_N, SPLIT, BIAS).to(dt)
            b = _summed(qkv_ptr, b_ptr, heads_ptr, hh * D + HALF + j, rows, ok, T, QKV_N, SPLIT, BIAS).to(dt)
        out = heads_ptr + rows[:, None] * QKV_N + hh * D + j[None, :]
        tl.store(out, a, mask=ok[:, None])
        tl.store(out + HALF, b, mask=ok[:, None])


@triton.jit
def _attention_ready(heads_ptr, attn_ptr, seq_ptr, T, pid, nprog, scale, NH: tl.constexpr, NKV: tl.constexpr,
                     D: tl.constexpr, BQ: tl.constexpr, BKEY: tl.constexpr, CAUSAL: tl.constexpr):
    """Attention over the heads step's ready q, k and v: items of a q head and a block of BQ queries, an online
    softmax over its kv head's keys BKEY at a time (at most 128 tokens: one block when BKEY covers them), masked
    to the query's own sequence (and no later key when causal)."""
    QKV_N: tl.constexpr = (NH + 2 * NKV) * D
    dt = attn_ptr.dtype.element_ty
    dcols = tl.arange(0, D)
    for item in tl.range(pid, NH * tl.cdiv(T, BQ), nprog, num_stages=1):
        hq = item % NH
        q0 = (item // NH) * BQ
        rq = q0 + tl.arange(0, BQ)
        q_ok = rq < T
        g = hq // (NH // NKV)
        q = tl.load(heads_ptr + rq[:, None] * QKV_N + hq * D + dcols[None, :], mask=q_ok[:, None], other=0.0,
                    cache_modifier=".cg")
        q_seq = tl.load(seq_ptr + rq, mask=q_ok, other=-2)
        top = tl.minimum(T, q0 + BQ) if CAUSAL else T
        best = tl.full([BQ], -1.0e30, dtype=tl.float32)
        total = tl.zeros([BQ], dtype=tl.float32)
        acc = tl.zeros([BQ, D], dtype=tl.float32)
        for k0 in tl.range(0, top, BKEY, num_stages=1):
            keys = k0 + tl.arange(0, BKEY)
            key_ok = keys < T
            at = heads_ptr + keys[:, None] * QKV_N + dcols[None, :]
            k = tl.load(at + (NH + g) * D, mask=key_ok[:, None], other=0.0, cache_modifier=".cg")
            v = tl.load(at + (NH + NKV + g) * D, mask=key_ok[:, None], other=0.0, cache_modifier=".cg")
            best, total, acc = _softmax_step(tl.dot(q, tl.trans(k)) * scale, v, best, total, acc, seq_ptr, q_seq, rq,
                                             keys, key_ok, CAUSAL)
        o = acc / tl.where(total > 0, total, 1.0)[:, None]
        tl.store(attn_ptr + rq[:, None] * (NH * D) + hq * D + dcols[None, :], o.to(dt), mask=q_ok[:, None])
