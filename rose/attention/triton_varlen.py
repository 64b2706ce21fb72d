"""Ragged attention in Triton (attention "triton"): FlashAttention's online softmax over packed sequences.

Why: torch's varlen runs FlashAttention-2, which on Hopper reaches about half of FlashInfer fa3's speed at
4096 tokens (398 vs 204 µs a call for the 0.6B's shape, benchmarks/NOTES.md "Attention backends"), and fa3 and
FA4 are extras with JIT builds of 5-85 s. Triton ships with torch's CUDA builds and lowers `tl.dot` to Hopper's
warpgroup MMAs, so this kernel comes with the default install.

One program per (query block, sequence, query head): it reads its sequence's bounds from cu_seqlens on the
device, so a CUDA graph captured at a layout's shapes (grid = blocks of the layout's max-seqlen bound × Sb ×
heads) serves every later batch of that layout; programs past their sequence's end return at once. Keys are
streamed in blocks with the running max and sum in float32 (exp2, the scale folded into log2 units); causal
programs stop at the diagonal and later query blocks start first. GQA reads each K/V head for its group of
query heads; q, k and v may be strided views (the fused QKV projection's V) as long as the head dim is
contiguous. Head dims that are powers of two from 16 to 256. A sliding window (a query sees keys at most
`window` positions away, on both sides unless causal) bounds each program's key loop to the blocks its rows
can see; MPNet's relative position bias is added to each score. Key blocks that every row of a query block
sees run without masks; the diagonal's and the sequence's last block with them. Block sizes follow the layout
(block_config).

With `rope` the kernel also does the decoder's QK step (rose.layers.fused.qk_norm_rope: the per-head norm of q and k,
then RoPE at each token's position) as it loads q and each key block, straight from the fused QKV projection's
output: one kernel a layer less, the same rounding as the QK kernel's. Each key block is normalized and rotated
by every query block that reads it, so it pays at short bounds, where a layer's kernels are each a few µs
(`forward_roped`, `rope_max_bound`; benchmarks/NOTES.md, "The QK step inside the attention kernel").
"""

from __future__ import annotations

import math
import os
from typing import Any

import torch

from rose.attention.base import FULL, AttentionBackend, AttentionBackendError, QKRope
from rose.attention.shape import AttentionShape
from rose.layers.fused import QK_NORMS
from rose.meta import ForwardMeta

try:  # Triton ships with CUDA builds of torch; CPU builds do without it
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the torch build
    triton = None

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)
HEAD_DIMS = (16, 32, 64, 128, 256)
LOG2E = 1.4426950408889634
# The longest sequence bound up to which the decoder's QK step runs inside the kernel (TritonBackend.fuses_rope)
ROPE_MAX_BOUND = int(os.environ.get("ROSE_ATTENTION_ROPE_MAX_BOUND", "512"))


def block_config(head_dim: int, max_seqlen: int = 512, seqs: int = 1,
                 capability: tuple[int, int] = (9, 0)) -> tuple[int, int, int, int, bool]:
    """(BLOCK_M, BLOCK_N, warps, stages, split) for a layout: its head dim, max-seqlen bound and sequence count
    (both fixed per graph layout) on a GPU of this capability. Swept on the H200 at head dim 128
    (`benchmarks.triton_attention_sweep --split`, `results/triton_attention/triton_attention_split.json`, µs a
    call in a graph, causal):
    - long sequences (a bound of 2048 or more) on Hopper: 128 x 128 blocks, 8 warps, 3 stages, the unmasked key
      blocks split from the masked ones (1 x 4096: 195 us; 64 x 64 split 213, masked 259);
    - many sequences (more than 4): 64 x 32 (100 mixed documents: 140 us split, 143 masked; 64 x 64 159 masked);
    - else 64 x 64, 4 warps, 3 stages, split above a bound of 128 (1 x 512: 11.3 us, masked 12.3; at 1 x 128
      the split's second loop costs more than its masks save: 6.6 vs 5.4 us).
    Head dims above 128 keep 64 x 64 and 2 stages for shared memory. GPUs other than Hopper keep 64 x 64 for
    long sequences too (unmeasured there). Smaller head dims keep 64 x 64: MiniLM's (32) 100 documents ran
    10 % slower on 64 x 32 blocks end to end, one A/B."""
    split = max_seqlen > 128
    if head_dim > 128:
        return 64, 64, 4, 2, split
    if head_dim == 128 and max_seqlen >= 2048 and capability[0] == 9:
        return 128, 128, 8, 3, True
    if head_dim == 128 and seqs > 4:
        return 64, 32, 4, 3, split
    return 64, 64, 4, 3, split


if triton is not None:
    @triton.jit
    def _norm_rope(x1, x2, W, POS, INV_FREQ, token, ok, eps, HALF: tl.constexpr, NORM: tl.constexpr, REF):
        """Rows of heads, as their two halves [rows, HALF] in float32: the QK step's norm (NORM 1: Qwen3's
        `w * round(x)`, 2: Gemma's `(1 + w) * x`, 0: none) and RoPE at each row's position (POS[token]), rounded to
        REF's dtype as rose.layers.fused's QK kernel rounds."""
        j = tl.arange(0, HALF)
        dt = REF.dtype.element_ty
        if NORM != 0:
            rstd = tl.rsqrt((tl.sum(x1 * x1, 1) + tl.sum(x2 * x2, 1)) / (2 * HALF) + eps)[:, None]
            w1 = tl.load(W + j).to(tl.float32)[None, :]
            w2 = tl.load(W + HALF + j).to(tl.float32)[None, :]
            if NORM == 1:
                x1 = ((x1 * rstd).to(dt).to(tl.float32) * w1).to(dt).to(tl.float32)
                x2 = ((x2 * rstd).to(dt).to(tl.float32) * w2).to(dt).to(tl.float32)
            else:
                x1 = (x1 * rstd * (1.0 + w1)).to(dt).to(tl.float32)
                x2 = (x2 * rstd * (1.0 + w2)).to(dt).to(tl.float32)
        pos = tl.load(POS + token, mask=ok, other=0).to(tl.float32)
        freq = pos[:, None] * tl.load(INV_FREQ + j)[None, :]
        c = tl.cos(freq).to(dt).to(tl.float32)
        s = tl.sin(freq).to(dt).to(tl.float32)
        return (x1 * c - x2 * s).to(dt), (x2 * c + x1 * s).to(dt)

    @triton.jit
    def _key_block(acc, l_i, m_i, q, q2, K, V, BIAS, KW, POS, INV_FREQ, eps, start, n, n0, offs_m, offs_d, kv_head,
                   head, scale_log2, stride_kt, stride_kh, stride_vt, stride_vh, window, BLOCK_N: tl.constexpr,
                   CAUSAL: tl.constexpr, WINDOWED: tl.constexpr, BIASED: tl.constexpr, MAX_DISTANCE: tl.constexpr,
                   MASKED: tl.constexpr, ROPE: tl.constexpr, NORM: tl.constexpr, HALF: tl.constexpr):
        """One block of keys [n0, n0 + BLOCK_N) into the running (acc, l_i, m_i). MASKED: the block may hold keys
        past the sequence, past the diagonal or outside the window; unmasked blocks hold only keys every row of
        the query block sees (no compare, no select, no load mask). ROPE: q and q2 are the query rows' two halves,
        normed and rotated, and the keys are normed and rotated here (_norm_rope)."""
        offs_n = n0 + tl.arange(0, BLOCK_N)
        token = (start + offs_n)[:, None].to(tl.int64)
        if ROPE:
            offs_h = tl.arange(0, HALF)
            at = K + token * stride_kt + kv_head * stride_kh + offs_h[None, :]
            if MASKED:
                k1 = tl.load(at, mask=offs_n[:, None] < n, other=0.0).to(tl.float32)
                k2 = tl.load(at + HALF, mask=offs_n[:, None] < n, other=0.0).to(tl.float32)
            else:
                k1 = tl.load(at).to(tl.float32)
                k2 = tl.load(at + HALF).to(tl.float32)
            k1, k2 = _norm_rope(k1, k2, KW, POS, INV_FREQ, start + offs_n, offs_n < n, eps, HALF, NORM, K)
            s = tl.dot(q2, tl.trans(k2), tl.dot(q, tl.trans(k1))) * scale_log2
        else:
            if MASKED:
                k = tl.load(K + token * stride_kt + kv_head * stride_kh + offs_d[None, :], mask=offs_n[:, None] < n,
                            other=0.0)
            else:
                k = tl.load(K + token * stride_kt + kv_head * stride_kh + offs_d[None, :])
            s = tl.dot(q, tl.trans(k)) * scale_log2
        if BIASED:  # BIAS[head, d + MAX_DISTANCE]: the head's bias for key - query = d, clamped (float32)
            d = tl.minimum(tl.maximum(offs_n[None, :] - offs_m[:, None], -MAX_DISTANCE), MAX_DISTANCE)
            s += tl.load(BIAS + head * (2 * MAX_DISTANCE + 1) + d + MAX_DISTANCE) * 1.4426950408889634
        if MASKED:
            valid = offs_n[None, :] < n
            if CAUSAL:
                valid = valid & (offs_m[:, None] >= offs_n[None, :])
            if WINDOWED:
                gap = offs_m[:, None] - offs_n[None, :]
                valid = valid & (gap <= window) & (gap >= -window)
            s = tl.where(valid, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_use = m_new
        if WINDOWED:  # a block may hold no key of a row's window yet: its sums stay 0, its max -inf
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        # without a window key 0 is in the first block and valid for every row (n > m0 >= 0): no row
        # stays at -inf; with one, every real row meets its own key within [lo, hi)
        alpha = tl.exp2(m_i - m_use)
        p = tl.exp2(s - m_use[:, None])
        if MASKED:
            v = tl.load(V + token * stride_vt + kv_head * stride_vh + offs_d[None, :], mask=offs_n[:, None] < n,
                        other=0.0)
        else:
            v = tl.load(V + token * stride_vt + kv_head * stride_vh + offs_d[None, :])
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc)
        l_i = l_i * alpha + tl.sum(p, 1)
        return acc, l_i, m_new

    @triton.jit
    def _attention_kernel(Q, K, V, O, CU, BIAS, QW, KW, POS, INV_FREQ, eps, scale_log2,
                          stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
                          M_BLOCKS, window, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                          BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, WINDOWED: tl.constexpr,
                          BIASED: tl.constexpr, MAX_DISTANCE: tl.constexpr, SPLIT: tl.constexpr,
                          ROPE: tl.constexpr, NORM: tl.constexpr):
        mb = M_BLOCKS - 1 - tl.program_id(0)  # the longest (causal: most work) query blocks first
        seq = tl.program_id(1)
        head = tl.program_id(2)
        start = tl.load(CU + seq)
        n = tl.load(CU + seq + 1) - start
        m0 = mb * BLOCK_M
        if m0 < n:
            kv_head = head // GROUP
            offs_m = m0 + tl.arange(0, BLOCK_M)
            offs_d = tl.arange(0, HEAD_DIM)
            rows = offs_m[:, None] < n
            at = Q + (start + offs_m)[:, None].to(tl.int64) * stride_qt + head * stride_qh
            if ROPE:
                offs_h = tl.arange(0, HEAD_DIM // 2)
                q = tl.load(at + offs_h[None, :], mask=rows, other=0.0).to(tl.float32)
                q2 = tl.load(at + HEAD_DIM // 2 + offs_h[None, :], mask=rows, other=0.0).to(tl.float32)
                q, q2 = _norm_rope(q, q2, QW, POS, INV_FREQ, start + offs_m, offs_m < n, eps, HEAD_DIM // 2, NORM, Q)
            else:
                q = tl.load(at + offs_d[None, :], mask=rows, other=0.0)
                q2 = q
            m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
            l_i = tl.zeros([BLOCK_M], tl.float32)
            acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
            lo = 0
            hi = n
            if CAUSAL:
                hi = tl.minimum(n, m0 + BLOCK_M)
            if WINDOWED:  # keys within `window` of some row of the block: [m0 - window, m0 + BLOCK_M + window)
                lo = tl.maximum(m0 - window, 0) // BLOCK_N * BLOCK_N
                hi = tl.minimum(hi, m0 + BLOCK_M + window)
            full = lo  # keys [lo, full) in whole blocks every row sees: inside the sequence and, causal, <= m0
            if SPLIT and not WINDOWED:
                full = n // BLOCK_N * BLOCK_N
                if CAUSAL:
                    full = tl.minimum(n, m0 + 1) // BLOCK_N * BLOCK_N
            for n0 in range(lo, full, BLOCK_N):
                acc, l_i, m_i = _key_block(acc, l_i, m_i, q, q2, K, V, BIAS, KW, POS, INV_FREQ, eps, start, n, n0,
                                           offs_m, offs_d, kv_head, head, scale_log2, stride_kt, stride_kh, stride_vt,
                                           stride_vh, window, BLOCK_N, CAUSAL, WINDOWED, BIASED, MAX_DISTANCE, False,
                                           ROPE, NORM, HEAD_DIM // 2)
            for n0 in range(full, hi, BLOCK_N):
                acc, l_i, m_i = _key_block(acc, l_i, m_i, q, q2, K, V, BIAS, KW, POS, INV_FREQ, eps, start, n, n0,
                                           offs_m, offs_d, kv_head, head, scale_log2, stride_kt, stride_kh, stride_vt,
                                           stride_vh, window, BLOCK_N, CAUSAL, WINDOWED, BIASED, MAX_DISTANCE, True,
                                           ROPE, NORM, HEAD_DIM // 2)
            out = acc / l_i[:, None]
            tl.store(O + (start + offs_m)[:, None].to(tl.int64) * stride_ot + head * stride_oh + offs_d[None, :],
                     out.to(O.dtype.element_ty), mask=rows)


def varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int,
                     causal: bool, scale: float, config: tuple[int, int, int, int] | None = None,
                     window: int = FULL, position_bias: torch.Tensor | None = None,
                     split: bool | None = None, rope: QKRope | None = None) -> torch.Tensor:
    """q [T, Hq, D], k/v [T, Hkv, D] (head dim contiguous), cu_seqlens int32 [S + 1] on the device, max_seqlen
    an upper bound on every sequence (rows past it are left unset: the caller's bound must hold, as rose.buckets'
    layouts do, padding included) -> [T, Hq, D]. Rows in no sequence (past cu_seqlens[-1]) are left unset.
    config: (BLOCK_M, BLOCK_N, warps, stages) instead of block_config's (benchmarks.triton_attention_sweep).
    window: a query attends keys at most `window` positions away on either side (causal still hides later ones);
    FULL: all. position_bias: float32 [Hq, 2 * D + 1], added to each score (after the scale) by key - query
    position d, clamped to [-D, D] (MPNet's relative position buckets are constant past D = 128).
    split: key blocks every row sees run without masks, the rest (the diagonal, the sequence's tail) with them;
    False masks every block; None: block_config's choice (benchmarks.triton_attention_sweep --split measures
    the two). rope: q and k are taken before the decoder's QK step, which the kernel applies as it loads them
    (module docstring); head dims of 32 and more."""
    tokens, heads, head_dim = q.shape
    if window < FULL or window >= 1 << 30:
        raise ValueError(f"window must be FULL ({FULL}) or 0 .. 2**30 - 1, not {window}")
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    out = torch.empty((tokens, heads, head_dim), dtype=q.dtype, device=q.device)
    seqs = cu_seqlens.shape[0] - 1
    block_m, block_n, warps, stages, default_split = block_config(head_dim, max_seqlen, seqs, _capability(q.device))
    if config is not None:
        block_m, block_n, warps, stages = config
    split = default_split if split is None else split
    m_blocks = max(1, math.ceil(max_seqlen / block_m))
    grid = (m_blocks, seqs, heads)
    max_distance = 0
    if position_bias is not None:
        if position_bias.dtype != torch.float32 or position_bias.shape[0] != heads or position_bias.shape[1] % 2 == 0:
            raise ValueError(f"position_bias must be float32 [{heads}, 2 * D + 1], not {tuple(position_bias.shape)} "
                             f"{position_bias.dtype}")
        position_bias = position_bias.contiguous()
        max_distance = position_bias.shape[1] // 2
    if rope is not None and head_dim < 32:
        raise ValueError(f"rope inside the attention kernel needs a head dim of 32 or more, not {head_dim}")
    none = cu_seqlens  # pointers the kernel never reads in its mode
    qw, kw = (rope.q_weight, rope.k_weight) if rope is not None and rope.norm is not None else (none, none)
    _attention_kernel[grid](q, k, v, out, cu_seqlens, position_bias if position_bias is not None else none,
                            qw, kw, rope.positions if rope else none, rope.inv_freq if rope else none,
                            rope.eps if rope else 0.0, scale * LOG2E,
                            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
                            out.stride(0), out.stride(1), m_blocks, max(window, 0),
                            GROUP=heads // k.shape[1], HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=block_n,
                            CAUSAL=causal, WINDOWED=window != FULL, BIASED=position_bias is not None,
                            MAX_DISTANCE=max_distance, SPLIT=split and window == FULL,  # windows stay masked
                            ROPE=rope is not None, NORM=QK_NORMS[rope.norm] if rope else 0,
                            num_warps=warps, num_stages=stages)
    return out


def _capability(device: torch.device) -> tuple[int, int]:
    """The GPU's compute capability (Hopper's on the CPU, where the interpreter runs the kernel). Asked at eager
    runs and captures only: a graph replay launches the kernel without this function."""
    return torch.cuda.get_device_capability(device) if device.type == "cuda" else (9, 0)


def check_supported(device: torch.device, dtype: torch.dtype, shape: AttentionShape | None) -> None:
    """Raise AttentionBackendError when this kernel cannot run the model here."""
    if device.type != "cuda" or not torch.cuda.is_available():
        raise AttentionBackendError("attention 'triton' runs on CUDA only; use 'sdpa' on a CPU")
    if triton is None:
        raise AttentionBackendError("attention 'triton' needs Triton (it ships with torch's CUDA builds)")
    if dtype not in SUPPORTED_DTYPES:
        raise AttentionBackendError(f"attention 'triton' needs float16 or bfloat16, not {dtype}")
    major, minor = torch.cuda.get_device_capability(device)
    if major < 8:
        raise AttentionBackendError(f"attention 'triton' needs sm80 or newer; this GPU is sm{major}{minor}")
    if shape is None:
        return
    if shape.head_dim not in HEAD_DIMS:
        raise AttentionBackendError(f"attention 'triton' supports head dims {HEAD_DIMS}, not {shape.head_dim}")
    if shape.num_qo_heads % shape.num_kv_heads:
        raise AttentionBackendError(f"{shape.num_qo_heads} query heads are not a multiple of {shape.num_kv_heads} KV heads")


class TritonBackend(AttentionBackend):
    name = "triton"
    graph_safe = True
    bidirectional_window = True  # (a window on both sides: ModernBERT's local layers)
    position_bias = True  # forward_biased: an additive bias per head and relative position (MPNet)

    def __init__(self, device: torch.device, dtype: torch.dtype, shape: AttentionShape | None = None) -> None:
        check_supported(device, dtype, shape)
        self.rope_max_bound = ROPE_MAX_BOUND

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: ForwardMeta,
                causal: bool, scale: float, state: Any = None, window: int = FULL) -> torch.Tensor:
        if q.shape[-1] not in HEAD_DIMS:
            raise AttentionBackendError(f"attention 'triton' supports head dims {HEAD_DIMS}, not {q.shape[-1]}")
        if q.shape[1] % k.shape[1]:
            raise AttentionBackendError(f"{q.shape[1]} query heads are not a multiple of {k.shape[1]} KV heads")
        return varlen_attention(q, k, v, meta.cu_seqlens, meta.max_seqlen, causal, scale, window=window)

    def fuses_rope(self, meta: ForwardMeta, head_dim: int) -> bool:
        """The QK step inside the kernel for forwards whose longest sequence (the layout's bound) is at most
        `rope_max_bound` (ROSE_ATTENTION_ROPE_MAX_BOUND; 0 = never), head dims of 32 and more."""
        return head_dim >= 32 and meta.max_seqlen <= self.rope_max_bound

    def forward_roped(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: ForwardMeta, causal: bool,
                      scale: float, state: Any, window: int, rope: QKRope) -> torch.Tensor:
        return varlen_attention(q, k, v, meta.cu_seqlens, meta.max_seqlen, causal, scale, window=window, rope=rope)

    def forward_biased(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: ForwardMeta, scale: float,
                       position_bias: torch.Tensor) -> torch.Tensor:
        """Bidirectional attention with `position_bias` [Hq, 2 * D + 1] (varlen_attention) on every score."""
        return varlen_attention(q, k, v, meta.cu_seqlens, meta.max_seqlen, False, scale,
                                position_bias=position_bias)
