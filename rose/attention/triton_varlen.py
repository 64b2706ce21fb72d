"""Ragged attention in Triton (attention "triton"): FlashAttention's online softmax over packed sequences.

Why: torch's varlen runs FlashAttention-2, which on Hopper reaches about half of FlashInfer fa3's speed at
4096 tokens (398 vs 204 µs a call for the 0.6B's shape, benchmarks/NOTES.md "Attention backends"), and fa3 and
FA4 are extras with JIT builds of 5-85 s. Triton ships with torch's CUDA builds and lowers `tl.dot` to Hopper's
warpgroup MMAs, so this kernel comes with the default install.

One program per (query block, sequence, query head, or `pack` query heads of one KV head): it reads its sequence's
bounds from cu_seqlens on the device, so a CUDA graph captured at a layout's shapes (grid = blocks of the layout's
max-seqlen bound × Sb × heads / pack) serves every later batch of that layout; programs past their sequence's end
return at once. Keys are streamed in blocks with the running max and sum in float32 (exp2, the scale folded into
log2 units); causal programs stop at the diagonal and later query blocks start first. GQA reads each K/V head for
its group of query heads; q, k and v may be strided views (the fused QKV projection's V) as long as the head dim is
contiguous. Head dims that are powers of two from 16 to 256. A sliding window (a query sees keys at most `window`
positions away, on both sides unless causal) bounds each program's key loop to the blocks its rows can see; MPNet's
relative position bias is added to each score. Key blocks that every row of a query block sees run without masks;
the diagonal's and the sequence's last block with them. Block sizes follow the layout (rose.attention.triton_blocks'
block_config), and so does `tma`: K and V loaded through tensor descriptors (Hopper's copy engine) instead of
per-thread pointer loads, where block_config's sweep found it faster (head dim 128 on Hopper past a bound of 128;
ROSE_TRITON_ATTENTION_TMA: auto, the default, or 0 / 1 to force it). A configuration may pack the query heads of one
KV group into a program (`pack`: its rows share each K and V block), as block_config chooses for causal GQA models
on Hopper with ROSE_TRITON_ATTENTION_PACK=1 (off by default: 1.5-4 % faster a call, level end to end).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from rose.attention.base import FULL, AttentionBackend, AttentionBackendError
from rose.attention.shape import AttentionShape
from rose.meta import ForwardMeta

try:  # Triton ships with CUDA builds of torch; CPU builds do without it
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the torch build
    triton = None
from rose.attention import triton_blocks
from rose.attention.triton_blocks import block_config
from rose.layers.tma import TensorDescriptor, describable, has_tma

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)
HEAD_DIMS = (16, 32, 64, 128, 256)
LOG2E = 1.4426950408889634


if triton is not None:
    @triton.jit
    def _key_block(acc, l_i, m_i, q, K, V, BIAS, start, n, n0, offs_m, offs_d, kv_head, heads, scale_log2,
                   stride_kt, stride_kh, stride_vt, stride_vh, window, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
                   WINDOWED: tl.constexpr, BIASED: tl.constexpr, MAX_DISTANCE: tl.constexpr, MASKED: tl.constexpr,
                   TMA: tl.constexpr, HEAD_DIM: tl.constexpr):
        """One block of keys [n0, n0 + BLOCK_N) into the running (acc, l_i, m_i). MASKED: the block may hold keys
        past the sequence, past the diagonal or outside the window; unmasked blocks hold only keys every row of
        the query block sees (no compare, no select, no load mask). TMA: K and V are tensor descriptors over
        [T, Hkv * D]; a masked block's rows past the sequence are the next sequence's (or zeros past T): their
        scores are masked as ever, and their values zeroed (a row nobody wrote may hold NaN)."""
        offs_n = n0 + tl.arange(0, BLOCK_N)
        token = (start + offs_n)[:, None].to(tl.int64)
        if MASKED:
            cols = offs_n[:, None] < n
        if TMA:
            k = K.load([start + n0, kv_head * HEAD_DIM])
        elif MASKED:
            k = tl.load(K + token * stride_kt + kv_head * stride_kh + offs_d[None, :], mask=cols, other=0.0)
        else:
            k = tl.load(K + token * stride_kt + kv_head * stride_kh + offs_d[None, :])
        # the raw scores; the scale (log2 units) joins them in the exponent's one FMA (s * scale - max), and
        # the row max is taken before it (scale > 0, varlen_attention checks): a multiply a score less. With a
        # bias, scaled first.
        s = tl.dot(q, tl.trans(k))
        if BIASED:  # BIAS[head, d + MAX_DISTANCE]: each row's head's bias for key - query = d, clamped (float32)
            d = tl.minimum(tl.maximum(offs_n[None, :] - offs_m[:, None], -MAX_DISTANCE), MAX_DISTANCE)
            s = s * scale_log2 + tl.load(BIAS + heads[:, None] * (2 * MAX_DISTANCE + 1) + d + MAX_DISTANCE) \
                * 1.4426950408889634
        if MASKED:
            valid = offs_n[None, :] < n
            if CAUSAL:
                valid = valid & (offs_m[:, None] >= offs_n[None, :])
            if WINDOWED:
                gap = offs_m[:, None] - offs_n[None, :]
                valid = valid & (gap <= window) & (gap >= -window)
            s = tl.where(valid, s, float("-inf"))
        if BIASED:
            m_new = tl.maximum(m_i, tl.max(s, 1))
        else:
            m_new = tl.maximum(m_i, tl.max(s, 1) * scale_log2)
        m_use = m_new
        if WINDOWED:  # a block may hold no key of a row's window yet: its sums stay 0, its max -inf
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        # without a window key 0 is in the first block and valid for every row (n > m0 >= 0): no row
        # stays at -inf; with one, every real row meets its own key within [lo, hi)
        alpha = tl.exp2(m_i - m_use)
        if BIASED:
            p = tl.exp2(s - m_use[:, None])
        else:
            p = tl.exp2(tl.fma(s, scale_log2, -m_use[:, None]))  # one FFMA whatever Triton's default FP fusion
        if TMA:
            v = V.load([start + n0, kv_head * HEAD_DIM])
            if MASKED:
                v = tl.where(cols, v, 0.0)
        elif MASKED:
            v = tl.load(V + token * stride_vt + kv_head * stride_vh + offs_d[None, :], mask=cols, other=0.0)
        else:
            v = tl.load(V + token * stride_vt + kv_head * stride_vh + offs_d[None, :])
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc)
        l_i = l_i * alpha + tl.sum(p, 1)
        return acc, l_i, m_new

    @triton.jit
    def _attention_kernel(Q, K, V, O, CU, BIAS, scale_log2,
                          stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
                          M_BLOCKS, window, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                          BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, WINDOWED: tl.constexpr,
                          BIASED: tl.constexpr, MAX_DISTANCE: tl.constexpr, SPLIT: tl.constexpr, TMA: tl.constexpr,
                          PACK: tl.constexpr = 1, LONGEST_FIRST: tl.constexpr = False):
        # PACK query heads of one KV group in a program: its PACK * BLOCK_M rows are each head's BLOCK_M positions
        # [m0, m0 + BLOCK_M), one after the other, sharing every K and V block (and the causal diagonal)
        # the longest (causal: most work) query blocks first: LONGEST_FIRST, the grid (heads, sequences, query
        # blocks), every head's and sequence's last block before any head's next-to-last; else (query blocks,
        # sequences, heads), one head's blocks longest first, then the next head's
        if LONGEST_FIRST:
            mb = M_BLOCKS - 1 - tl.program_id(2)
            head = tl.program_id(0) * PACK  # the program's first query head
        else:
            mb = M_BLOCKS - 1 - tl.program_id(0)
            head = tl.program_id(2) * PACK
        seq = tl.program_id(1)
        start = tl.load(CU + seq)
        n = tl.load(CU + seq + 1) - start
        m0 = mb * BLOCK_M
        if m0 < n:
            kv_head = head // GROUP
            offs_r = tl.arange(0, PACK * BLOCK_M)
            offs_m = m0 + offs_r % BLOCK_M  # each row's position in its sequence
            heads = head + offs_r // BLOCK_M  # each row's query head
            offs_d = tl.arange(0, HEAD_DIM)
            rows = offs_m[:, None] < n
            q = tl.load(Q + (start + offs_m)[:, None].to(tl.int64) * stride_qt + heads[:, None] * stride_qh
                        + offs_d[None, :], mask=rows, other=0.0)
            m_i = tl.full([PACK * BLOCK_M], float("-inf"), tl.float32)
            l_i = tl.zeros([PACK * BLOCK_M], tl.float32)
            acc = tl.zeros([PACK * BLOCK_M, HEAD_DIM], tl.float32)
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
                acc, l_i, m_i = _key_block(acc, l_i, m_i, q, K, V, BIAS, start, n, n0, offs_m, offs_d, kv_head,
                                           heads, scale_log2, stride_kt, stride_kh, stride_vt, stride_vh, window,
                                           BLOCK_N, CAUSAL, WINDOWED, BIASED, MAX_DISTANCE, False, TMA, HEAD_DIM)
            for n0 in range(full, hi, BLOCK_N):
                acc, l_i, m_i = _key_block(acc, l_i, m_i, q, K, V, BIAS, start, n, n0, offs_m, offs_d, kv_head,
                                           heads, scale_log2, stride_kt, stride_kh, stride_vt, stride_vh, window,
                                           BLOCK_N, CAUSAL, WINDOWED, BIASED, MAX_DISTANCE, True, TMA, HEAD_DIM)
            out = acc / l_i[:, None]
            tl.store(O + (start + offs_m)[:, None].to(tl.int64) * stride_ot + heads[:, None] * stride_oh
                     + offs_d[None, :], out.to(O.dtype.element_ty), mask=rows)


def varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int,
                     causal: bool, scale: float, config: tuple[int, ...] | None = None,
                     window: int = FULL, position_bias: torch.Tensor | None = None,
                     split: bool | None = None, tma: bool | None = None,
                     longest_first: bool | None = None) -> torch.Tensor:
    """q [T, Hq, D], k/v [T, Hkv, D] (head dim contiguous), cu_seqlens int32 [S + 1] on the device, max_seqlen
    an upper bound on every sequence (rows past it are left unset: the caller's bound must hold, as rose.buckets'
    layouts do, padding included) -> [T, Hq, D]. Rows in no sequence (past cu_seqlens[-1]) are left unset.
    config: (BLOCK_M, BLOCK_N, warps, stages[, pack]) instead of block_config's (benchmarks.triton_attention_sweep);
    pack: that many query heads of one KV group in a program (a divisor of the group), PACK * BLOCK_M rows sharing
    each K and V block. window: a query attends keys at most `window` positions away on either side (causal still
    hides later ones);
    FULL: all. position_bias: float32 [Hq, 2 * D + 1], added to each score (after the scale) by key - query
    position d, clamped to [-D, D] (MPNet's relative position buckets are constant past D = 128).
    split: key blocks every row sees run without masks, the rest (the diagonal, the sequence's tail) with them;
    False masks every block; None: block_config's choice (benchmarks.triton_attention_sweep --split measures
    the two). tma: K and V through tensor descriptors where they allow it (_descriptors) and no bias is given,
    with block_config's blocks for that form; None: block_config's choice (TMA's setting). longest_first: programs
    launched heads fastest and query blocks slowest, so that every head's longest causal blocks start before any
    shorter one (a greedy schedule's tail: the last wave's imbalance); None: triton_blocks.longest_first's choice
    (one to four causal sequences above a bound of 512; ROSE_TRITON_ATTENTION_LONGEST_FIRST forces it)."""
    tokens, heads, head_dim = q.shape
    if not scale > 0:  # the kernel takes each row's max of the raw scores, then scales it: a positive scale only
        raise ValueError(f"scale must be positive, not {scale}")
    if window < FULL or window >= 1 << 30:
        raise ValueError(f"window must be FULL ({FULL}) or 0 .. 2**30 - 1, not {window}")
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    out = torch.empty((tokens, heads, head_dim), dtype=q.dtype, device=q.device)
    seqs = cu_seqlens.shape[0] - 1
    capability = _capability(q.device)
    group = heads // k.shape[1]
    blocks = block_config(head_dim, max_seqlen, seqs, capability, causal, tma, group)
    if config is not None:
        blocks = blocks._replace(block_m=config[0], block_n=config[1], warps=config[2], stages=config[3],
                                 pack=config[4] if len(config) > 4 else 1)
    # (not with a bias: 128 x 128 blocks with one need 353 KB of shared memory through descriptors, over Hopper's 227)
    kv = _descriptors(k, v, blocks.block_n) if blocks.tma and position_bias is None else None
    if blocks.tma and kv is None and config is None:  # no descriptors for these tensors: the pointer form's blocks
        blocks = block_config(head_dim, max_seqlen, seqs, capability, causal, tma=False)
    block_m, block_n, warps, stages = blocks[:4]
    pack = blocks.pack
    if group % pack:
        raise ValueError(f"pack {pack} must divide the {group} query heads of a KV head")
    split = blocks.split if split is None else split
    m_blocks = max(1, math.ceil(max_seqlen / block_m))
    if longest_first is None:
        longest_first = triton_blocks.longest_first(max_seqlen, seqs, causal)
    longest_first = longest_first and m_blocks < 1 << 16  # (the grid's third dimension holds 65535)
    grid = (heads // pack, seqs, m_blocks) if longest_first else (m_blocks, seqs, heads // pack)
    max_distance = 0
    if position_bias is not None:
        if position_bias.dtype != torch.float32 or position_bias.shape[0] != heads or position_bias.shape[1] % 2 == 0:
            raise ValueError(f"position_bias must be float32 [{heads}, 2 * D + 1], not {tuple(position_bias.shape)} "
                             f"{position_bias.dtype}")
        position_bias = position_bias.contiguous()
        max_distance = position_bias.shape[1] // 2
    _attention_kernel[grid](q, *(kv or (k, v)), out, cu_seqlens,
                            position_bias if position_bias is not None else cu_seqlens,
                            scale * LOG2E,
                            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
                            out.stride(0), out.stride(1), m_blocks, max(window, 0),
                            GROUP=group, HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=block_n,
                            CAUSAL=causal, WINDOWED=window != FULL, BIASED=position_bias is not None,
                            MAX_DISTANCE=max_distance, SPLIT=split and window == FULL,  # windows stay masked
                            TMA=kv is not None, PACK=pack, LONGEST_FIRST=longest_first,
                            num_warps=warps, num_stages=stages)
    return out


def _descriptors(k: torch.Tensor, v: torch.Tensor, block_n: int) -> tuple | None:
    """Tensor descriptors of k and v as [T, Hkv * D] with [block_n, D] blocks, or None where they cannot be: no
    host-side descriptors in this Triton, a GPU without TMA (rose.layers.tma.has_tma), heads not contiguous within a
    row, or a base or row stride not 16-byte aligned (rose.layers.tma.describable)."""
    if k.is_cuda and not has_tma(k.device):
        return None
    out = []
    for x in (k, v):
        if x.stride(1) != x.shape[-1]:  # heads not contiguous within a token's row: no [T, Hkv * D] view
            return None
        rows = x.flatten(1)
        if not describable(rows):
            return None
        out.append(TensorDescriptor.from_tensor(rows, [block_n, x.shape[-1]]))
    return tuple(out)


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

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: ForwardMeta,
                causal: bool, scale: float, state: Any = None, window: int = FULL) -> torch.Tensor:
        if q.shape[-1] not in HEAD_DIMS:
            raise AttentionBackendError(f"attention 'triton' supports head dims {HEAD_DIMS}, not {q.shape[-1]}")
        if q.shape[1] % k.shape[1]:
            raise AttentionBackendError(f"{q.shape[1]} query heads are not a multiple of {k.shape[1]} KV heads")
        return varlen_attention(q, k, v, meta.cu_seqlens, meta.max_seqlen, causal, scale, window=window)

    def forward_biased(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: ForwardMeta, scale: float,
                       position_bias: torch.Tensor) -> torch.Tensor:
        """Bidirectional attention with `position_bias` [Hq, 2 * D + 1] (varlen_attention) on every score."""
        return varlen_attention(q, k, v, meta.cu_seqlens, meta.max_seqlen, False, scale,
                                position_bias=position_bias)
