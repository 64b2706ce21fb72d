"""A Qwen3 decoder's every layer in one persistent kernel, for small batches (at most 128 tokens).

Why (issue 14, benchmarks/NOTES.md "One persistent kernel for the decoder at small batches"): at 128 tokens a
layer is nine kernels, and each GEMM costs >= 5.5 µs in a graph whatever its size (the o and down projections
cover 8 of 132 SMs with cuBLAS's tiles); split-K, folded norms, PDL and L2-resident weights were each
refuted. Here one program per SM walks every layer's phases, the work of a phase spread over all programs,
with a grid barrier between phases in place of a kernel boundary:

    0 add + RMSNorm (input_layernorm)  rows           4 add + RMSNorm (post_attention_layernorm)  rows
    1 QKV projection                   tiles x slices 5 gate-up projection, SiLU(gate) * up        tiles
    2 QK-norm + RoPE + attention       heads x blocks 6 down projection                            tiles x slices
    3 o projection                     tiles x slices after the last layer: add + the final RMSNorm

The QKV, o and down projections are split along K too (items of a column tile and a slice of K, each storing
its float32 partial), so that every SM has work and each item reads only its slice of the activations, which
it would otherwise re-read whole from L2; the phase that reads a projection sums its slices (attention for the
QKV, the next add+RMSNorm for o and down). Attention at these sizes is, per q head and block of 32 queries,
one [queries x tokens] tile masked to the query's own sequence (and causally where the model is causal): any
ragged batch of up to 128 tokens. Rounding follows the layer-by-layer kernels (rose.layers.fused): bf16
residual sums, norm output and RoPE's cos/sin rounded, float32 inside.

The grid barrier: each program writes how many phases it finished into its own slot (an exchange, so the
same whichever threads execute it) with release order, then spins on plain (volatile) reads of every slot
until all reach the count, and orders what follows with an acquire on its own slot; data written by other
programs is read past L1 (`.cg`). The slots are zeroed before each launch (a memset node in a graph); one
barrier costs 1.1 µs on the H200. Every program must be resident at once: the grid is at most the SM count
and the kernel runs alone on the device (Tulip steps one batch at a time; the express lane, a second stream
of forwards, turns the persistent decoder off: rose.runner.enable_express). `persistent=False` runs the same
phases one launch each, no barrier: the CPU tests (Triton's interpreter runs programs one after another, so a
barrier between several would never open) and the A/B of barriers against launches.

Measured on the H200 (NOTES): per graph replay 23 % under the layers at 16 tokens, level at 64, 1.76 x over
them at 128; through the engine 1.156 -> 1.018 ms at 16 tokens. Hence opt-in, batches of up to 64 tokens.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch

from rose.windows import FULL

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the torch build
    triton = None

PHASES = 7  # per layer; step L * PHASES is the final norm
PHASE_NAMES = ("add+norm", "qkv", "attention", "o", "add+norm 2", "gate-up", "down")
MAX_TOKENS = 128
ROUTED_TOKENS = 64  # ROSE_PERSISTENT_DECODER=on: the largest batch routed to it, where it beat the layers on the H200


def routed_tokens(raw: str) -> int:
    """ROSE_PERSISTENT_DECODER: off (default; 0, false), on (1, true: batches of up to ROUTED_TOKENS tokens),
    or the largest batch in tokens to route to it (2 to MAX_TOKENS)."""
    raw = raw.strip().lower()
    if raw in ("", "0", "off", "false", "no"):
        return 0
    if raw in ("1", "on", "true", "yes"):
        return ROUTED_TOKENS
    if raw.isdigit() and 2 <= int(raw) <= MAX_TOKENS:
        return int(raw)
    raise ValueError(f"ROSE_PERSISTENT_DECODER={raw!r}: expected off, on or a token count of 2 to {MAX_TOKENS}")


ENABLED = routed_tokens(os.environ.get("ROSE_PERSISTENT_DECODER", ""))  # tokens routed to it; 0: off
log = logging.getLogger("rose.persistent_decoder")


@dataclass(frozen=True)
class Tiles:
    """Column tile widths per projection, slices of K (split-K) for the QKV and for the o and down projections,
    the K step, warps, pipeline stages, and the least token block (benchmarks sweep these). Column tiles are at
    least 32 wide: 16-wide tiles of a 16-token block over 8 warps computed wrong on the H200 (Triton 3.6)."""

    qkv: int = 64
    o: int = 32
    gate_up: int = 32
    down: int = 32
    split_qkv: int = 2
    split_od: int = 4
    k: int = 128
    warps: int = 8
    stages: int = 3
    rows: int = 16  # the least token block (BLOCK_M): batches of fewer tokens are padded to it
    queries: int = 32  # queries per attention item (a q head's block of them)

    def check(self, hidden: int, qkv_size: int, q_size: int, inner: int) -> None:
        """Raise unless every projection's N is whole column tiles and its K whole slices of whole K steps
        (the kernel does not mask a partial tile)."""
        if min(self.qkv, self.o, self.gate_up, self.down) < 32:
            raise ValueError(f"column tiles under 32 wide: {self}")
        projections = {"qkv": (qkv_size, hidden, self.qkv, self.split_qkv),  # name: (N, K, tile, slices)
                       "o": (hidden, q_size, self.o, self.split_od), "gate-up": (inner, hidden, self.gate_up, 1),
                       "down": (hidden, inner, self.down, self.split_od)}
        for name, (n, k, tile, split) in projections.items():
            if n % tile:
                raise ValueError(f"the {name} projection's {n} columns are not whole tiles of {tile}")
            if k % (split * self.k):
                raise ValueError(f"the {name} projection's K = {k} in {split} slices is not whole K steps of {self.k}")


class PersistentDecoder:
    """The decoder layers of a Qwen3Model (QK-norm, no biases, SiLU, full attention) as one kernel.

    Building it stacks each kind of weight over the layers and points the model's own parameters at views
    of the stacks, so the weights are held once. `__call__(residual, positions, seq_ids)` takes the token
    embeddings [T, hidden] and returns the final-normed hidden states, as Qwen3Model.forward does."""

    def __init__(self, model, tiles: Tiles = Tiles(), programs: int | None = None, routed: int = MAX_TOKENS) -> None:
        """routed: the largest batch (tokens) `fits` accepts, for Qwen3Model.forward's routing."""
        reason = unsupported(model)
        if reason:
            raise ValueError(f"no persistent decoder for this model: {reason}")
        layers = model.layers
        attn0, mlp0 = layers[0].self_attn, layers[0].mlp
        self.heads, self.kv_heads, self.head_dim = attn0.num_heads, attn0.num_kv_heads, attn0.head_dim
        self.hidden = attn0.qkv_proj.in_features
        self.inner = mlp0.down_proj.in_features
        self.qkv_size = (self.heads + 2 * self.kv_heads) * self.head_dim
        self.eps, self.scale, self.causal = attn0.eps, model.scale, model.causal
        self.tiles, self.routed = tiles, min(routed, MAX_TOKENS)
        self.wqkv = _stack_params([layer.self_attn.qkv_proj for layer in layers])
        self.wo = _stack_params([layer.self_attn.o_proj for layer in layers])
        self.wgu = _stack_params([layer.mlp.gate_up_proj for layer in layers])
        self.wd = _stack_params([layer.mlp.down_proj for layer in layers])
        self.ln1 = _stack_params([layer.input_layernorm for layer in layers])
        self.ln2 = _stack_params([layer.post_attention_layernorm for layer in layers])
        self.qn = _stack_params([layer.self_attn.q_norm for layer in layers])
        self.kn = _stack_params([layer.self_attn.k_norm for layer in layers])
        self.final = model.norm.weight
        self.inv_freq = model.rotary.inv_freq
        self.layers = len(layers)
        device = self.wqkv.device
        if programs is None:
            programs = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4
        self.programs = programs
        self.flags = torch.zeros(programs, dtype=torch.int32, device=device)
        tiles.check(self.hidden, self.qkv_size, self.heads * self.head_dim, self.inner)

    def fits(self, tokens: int) -> bool:
        return 0 < tokens <= self.routed

    def __call__(self, residual: torch.Tensor, positions: torch.Tensor, seq_ids: torch.Tensor,
                 persistent: bool = True, clock: torch.Tensor | None = None) -> torch.Tensor:
        """clock: int64 [layers * 7 + 2] on the device (persistent only, a GPU only): program 0 writes the
        GPU's clock (ns) before the first step and after each step's barrier, so where the time goes per phase
        can be read (benchmarks.persistent_decoder --phases)."""
        t = residual.shape[0]
        if not 0 < t <= MAX_TOKENS:
            raise ValueError(f"{t} tokens: the persistent decoder takes 1 to {MAX_TOKENS}")
        residual = residual.contiguous().clone()  # updated in place, layer by layer
        tl_ = self.tiles
        self.tiles.check(self.hidden, self.qkv_size, self.heads * self.head_dim, self.inner)

        def new(*shape, dtype=residual.dtype):
            return torch.empty(*shape, dtype=dtype, device=residual.device)

        d = self.head_dim
        h, out = new(t, self.hidden), new(t, self.hidden)
        qkv = new(tl_.split_qkv, t, (self.heads + 2 * self.kv_heads) * d, dtype=torch.float32)  # K slices' partials
        x = new(tl_.split_od, t, self.hidden, dtype=torch.float32)  # the o and down projections' partials
        attn, act = new(t, self.heads * d), new(t, self.inner)
        steps = self.layers * PHASES + 1
        block_m = max(tl_.rows, triton.next_power_of_2(t))
        args = (residual, h, qkv, attn, x, act, out, self.wqkv, self.wo, self.wgu, self.wd, self.ln1, self.ln2,
                self.qn, self.kn, self.final, positions, seq_ids, self.inv_freq, self.flags,
                self.flags if clock is None else clock, t, self.eps, self.scale, steps - 1)
        meta = {"H": self.hidden, "BLOCK_H": triton.next_power_of_2(self.hidden), "NH": self.heads,
                "NKV": self.kv_heads, "HALF": d // 2, "INNER": self.inner, "BLOCK_M": block_m, "BN_QKV": tl_.qkv,
                "BN_O": tl_.o, "BN_GU": tl_.gate_up, "BN_D": tl_.down, "S_QKV": tl_.split_qkv, "S_OD": tl_.split_od,
                "BK": tl_.k, "BQ": min(block_m, tl_.queries), "CAUSAL": self.causal,
                "NPROG_P2": triton.next_power_of_2(self.programs), "CLOCK": clock is not None, "num_warps": tl_.warps,
                "num_stages": tl_.stages}
        grid = (self.programs,)
        if clock is not None and (not persistent or clock.numel() < steps + 1):
            raise ValueError(f"a clock needs the persistent kernel and {steps + 1} slots")
        if persistent:
            self.flags.zero_()
            _decoder_kernel[grid](*args, 0, steps, PERSISTENT=True, **meta)
        else:
            for step in range(steps):
                _decoder_kernel[grid](*args, step, step + 1, PERSISTENT=False, **meta)
        return out


def attach(model) -> PersistentDecoder | None:
    """Where ROSE_PERSISTENT_DECODER is on, the model is a supported decoder and its weights are on CUDA: build
    the persistent decoder and set it as `model.persistent` (Qwen3Model.forward then runs batches of up to
    ENABLED tokens through it). Returns it, or None with the reason logged."""
    if not ENABLED or triton is None or not hasattr(model, "persistent"):
        return None
    reason = unsupported(model) or (None if model.embed_tokens.weight.is_cuda else "weights not on CUDA")
    if reason:
        log.info("persistent decoder off: %s", reason)
        return None
    model.persistent = PersistentDecoder(model, routed=ENABLED)
    log.info("persistent decoder on for batches of up to %d tokens (%d programs)", ENABLED, model.persistent.programs)
    return model.persistent


def unsupported(model) -> str | None:
    """Why the persistent decoder cannot run this model, or None."""
    layers = getattr(model, "layers", None)
    if not layers or not hasattr(layers[0], "self_attn") or not hasattr(layers[0], "mlp"):
        return "not a Qwen3-style decoder"
    attn = layers[0].self_attn
    if attn.q_norm is None or attn.qk_norm != "rms":
        return "no Qwen3 QK-norm"
    if attn.qkv_proj.bias is not None or attn.o_proj.bias is not None:
        return "projection biases"
    if any(w != FULL for w in model.windows):
        return "sliding windows"
    d = attn.head_dim
    if d & (d - 1) or d < 32:
        return f"head_dim {d} (a power of two >= 32)"
    if attn.num_heads % attn.num_kv_heads:
        return "q heads not a multiple of kv heads"
    return None


def _stack_params(modules) -> torch.Tensor:
    """Stack the modules' weights along a new first dimension and point each module's weight at its view."""
    stacked = torch.stack([m.weight.detach() for m in modules]).contiguous()
    for i, m in enumerate(modules):
        m.weight.data = stacked[i]
    return stacked


if triton is not None:

    @triton.jit
    def _globaltimer():
        return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False,
                                         pack=1)

    @triton.jit
    def _barrier(flags_ptr, pid, nprog, target, NPROG_P2: tl.constexpr):
        tl.debug_barrier()  # this program's stores before its arrival
        tl.atomic_xchg(flags_ptr + pid, target, sem="release", scope="gpu")
        offs = tl.arange(0, NPROG_P2)
        live = offs < nprog
        behind = nprog
        while behind > 0:  # plain reads from L2 while waiting: no atomic traffic
            seen = tl.load(flags_ptr + offs, mask=live, other=target, volatile=True)
            behind = tl.sum((seen < target).to(tl.int32), axis=0)
        tl.atomic_add(flags_ptr + pid, 0, sem="acquire", scope="gpu")  # order the reads that follow
        tl.debug_barrier()

    @triton.jit
    def _norm_rows(res_ptr, add_ptr, w_ptr, dst_ptr, T, pid, nprog, eps, add,
                   H: tl.constexpr, BLOCK_H: tl.constexpr, SPLIT: tl.constexpr):
        """res += the sum of add's SPLIT float32 partials ([SPLIT, T, H], rounded once, when `add`), then
        dst = RMSNorm(res) * w; one row per program at a time."""
        offs = tl.arange(0, BLOCK_H)
        ok = offs < H
        w = tl.load(w_ptr + offs, mask=ok, other=0.0).to(tl.float32)
        dt = dst_ptr.dtype.element_ty
        for r in range(pid, T, nprog):
            x = tl.load(res_ptr + r * H + offs, mask=ok, other=0.0, cache_modifier=".cg")
            if add:
                y = tl.zeros([BLOCK_H], dtype=tl.float32)
                for s in tl.static_range(SPLIT):
                    y += tl.load(add_ptr + (s * T + r) * H + offs, mask=ok, other=0.0, cache_modifier=".cg")
                x = (x.to(tl.float32) + y.to(dt).to(tl.float32)).to(dt)
                tl.store(res_ptr + r * H + offs, x, mask=ok)
            v = x.to(tl.float32)
            rstd = tl.rsqrt(tl.sum(v * v, axis=0) / H + eps)
            tl.store(dst_ptr + r * H + offs, ((v * rstd).to(dt).to(tl.float32) * w).to(dt), mask=ok)

    @triton.jit
    def _gemm(a_ptr, w_ptr, dst_ptr, T, pid, nprog, N: tl.constexpr, K: tl.constexpr, BLOCK_M: tl.constexpr,
              BN: tl.constexpr, BK: tl.constexpr, SPLIT: tl.constexpr, GATED: tl.constexpr):
        """a[T, K] @ w[N, K]^T, the work cut into (column tile, slice of K) items spread over the programs.
        Plain: dst [SPLIT, T, N] float32, item (tile, s) storing the s-th slice's partial product (the phase
        that reads dst sums the slices). GATED (SPLIT 1): w is [2N, K] (gate rows, then up rows) and
        dst [T, N] = SiLU(a @ gate^T) * (a @ up^T) in dst's dtype, each product rounded first as the unfused
        path does."""
        KS: tl.constexpr = K // SPLIT
        rm = tl.arange(0, BLOCK_M)
        rk = tl.arange(0, BK)
        row_ok = rm < T
        for item in range(pid, (N // BN) * SPLIT, nprog):
            tile = item // SPLIT
            k_lo = (item % SPLIT) * KS
            rn = tile * BN + tl.arange(0, BN)
            acc = tl.zeros([BLOCK_M, BN], dtype=tl.float32)
            acc_up = tl.zeros([BLOCK_M, BN], dtype=tl.float32)
            for k0 in range(k_lo, k_lo + KS, BK):
                a = tl.load(a_ptr + rm[:, None] * K + k0 + rk[None, :], mask=row_ok[:, None], other=0.0,
                            cache_modifier=".cg")
                w = tl.load(w_ptr + rn[:, None] * K + k0 + rk[None, :])
                acc = tl.dot(a, tl.trans(w), acc)
                if GATED:
                    u = tl.load(w_ptr + (rn[:, None] + N) * K + k0 + rk[None, :])
                    acc_up = tl.dot(a, tl.trans(u), acc_up)
            if GATED:
                dt = dst_ptr.dtype.element_ty
                g = acc.to(dt).to(tl.float32)
                y = (g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32) * acc_up.to(dt).to(tl.float32)
                tl.store(dst_ptr + rm[:, None] * N + rn[None, :], y.to(dt), mask=row_ok[:, None])
            else:
                part = dst_ptr + (item % SPLIT) * T * N
                tl.store(part + rm[:, None] * N + rn[None, :], acc, mask=row_ok[:, None])

    @triton.jit
    def _summed(part_ptr, like_ptr, cols, rm, ok, T, QKV_N: tl.constexpr, SPLIT: tl.constexpr):
        """The QKV output at [rm, cols] from its SPLIT float32 partials, rounded to the activations' dtype (like_ptr's)
        as a GEMM's output is."""
        acc = tl.zeros([rm.shape[0], cols.shape[0]], dtype=tl.float32)
        for s in tl.static_range(SPLIT):
            acc += tl.load(part_ptr + (s * T + rm[:, None]) * QKV_N + cols[None, :], mask=ok[:, None], other=0.0,
                           cache_modifier=".cg")
        return acc.to(like_ptr.dtype.element_ty).to(tl.float32)

    @triton.jit
    def _norm_rope(qkv_ptr, like_ptr, col0, w_ptr, rm, ok, c, s, eps, T, QKV_N: tl.constexpr, HALF: tl.constexpr,
                   SPLIT: tl.constexpr):
        """One head's [BLOCK_M, D] slice of the QKV output, RMS-normed by w and rotated: its two halves."""
        j = tl.arange(0, HALF)
        n1 = _summed(qkv_ptr, like_ptr, col0 + j, rm, ok, T, QKV_N, SPLIT)
        n2 = _summed(qkv_ptr, like_ptr, col0 + HALF + j, rm, ok, T, QKV_N, SPLIT)
        dt = like_ptr.dtype.element_ty
        rstd = tl.rsqrt((tl.sum(n1 * n1, axis=1) + tl.sum(n2 * n2, axis=1)) / (2 * HALF) + eps)[:, None]
        w1 = tl.load(w_ptr + j).to(tl.float32)[None, :]
        w2 = tl.load(w_ptr + HALF + j).to(tl.float32)[None, :]
        n1 = ((n1 * rstd).to(dt).to(tl.float32) * w1).to(dt).to(tl.float32)
        n2 = ((n2 * rstd).to(dt).to(tl.float32) * w2).to(dt).to(tl.float32)
        return (n1 * c - n2 * s).to(dt), (n2 * c + n1 * s).to(dt)

    @triton.jit
    def _rope_table(pos_ptr, inv_freq_ptr, rows, ok, dt, HALF: tl.constexpr):
        """cos and sin of each row's position times the RoPE frequencies, rounded to dt as HF's are."""
        j = tl.arange(0, HALF)
        freq = tl.load(pos_ptr + rows, mask=ok, other=0).to(tl.float32)[:, None] * tl.load(inv_freq_ptr + j)[None, :]
        return tl.cos(freq).to(dt).to(tl.float32), tl.sin(freq).to(dt).to(tl.float32)

    @triton.jit
    def _attention(qkv_ptr, attn_ptr, qn_ptr, kn_ptr, pos_ptr, seq_ptr, inv_freq_ptr, T, pid, nprog, eps, scale,
                   NH: tl.constexpr, NKV: tl.constexpr, HALF: tl.constexpr, BLOCK_M: tl.constexpr,
                   BQ: tl.constexpr, CAUSAL: tl.constexpr, SPLIT: tl.constexpr):
        """Items of a q head and a block of BQ queries: QK-norm + RoPE of those queries and of every key of the
        head's kv head, then softmax(q k^T) v over the keys of the query's own sequence (and no later ones when
        causal). q, k, v are summed from the QKV's partials."""
        D: tl.constexpr = 2 * HALF
        QKV_N: tl.constexpr = (NH + 2 * NKV) * D
        keys = tl.arange(0, BLOCK_M)
        key_ok = keys < T
        dt = attn_ptr.dtype.element_ty
        key_seq = tl.load(seq_ptr + keys, mask=key_ok, other=-1)
        dcols = tl.arange(0, D)
        for item in tl.range(pid, NH * (BLOCK_M // BQ), nprog, num_stages=1):  # unpipelined: q, k, v in smem
            hq = item % NH
            rq = (item // NH) * BQ + tl.arange(0, BQ)
            q_ok = rq < T
            g = hq // (NH // NKV)
            cq, sq = _rope_table(pos_ptr, inv_freq_ptr, rq, q_ok, dt, HALF)
            ck, sk = _rope_table(pos_ptr, inv_freq_ptr, keys, key_ok, dt, HALF)  # here, not live across items
            q1, q2 = _norm_rope(qkv_ptr, attn_ptr, hq * D, qn_ptr, rq, q_ok, cq, sq, eps, T, QKV_N, HALF, SPLIT)
            k1, k2 = _norm_rope(qkv_ptr, attn_ptr, (NH + g) * D, kn_ptr, keys, key_ok, ck, sk, eps, T, QKV_N, HALF,
                                SPLIT)
            v = _summed(qkv_ptr, attn_ptr, (NH + NKV + g) * D + dcols, keys, key_ok, T, QKV_N, SPLIT).to(dt)
            q_seq = tl.load(seq_ptr + rq, mask=q_ok, other=-2)
            allowed = (q_seq[:, None] == key_seq[None, :]) & key_ok[None, :]
            if CAUSAL:
                allowed = allowed & (keys[None, :] <= rq[:, None])
            logits = tl.dot(q1, tl.trans(k1)) + tl.dot(q2, tl.trans(k2))
            logits = tl.where(allowed, logits * scale, -1.0e30)
            p = tl.exp(logits - tl.max(logits, axis=1)[:, None])
            o = tl.dot(p.to(dt), v) / tl.sum(p, axis=1)[:, None]
            tl.store(attn_ptr + rq[:, None] * (NH * D) + hq * D + dcols[None, :], o.to(dt), mask=q_ok[:, None])

    @triton.jit
    def _decoder_kernel(res_ptr, h_ptr, qkv_ptr, attn_ptr, x_ptr, act_ptr, out_ptr,
                        wqkv_ptr, wo_ptr, wgu_ptr, wd_ptr, ln1_ptr, ln2_ptr, qn_ptr, kn_ptr, fin_ptr,
                        pos_ptr, seq_ptr, inv_freq_ptr, flags_ptr, clock_ptr, T, eps, scale, final, first, last,
                        H: tl.constexpr, BLOCK_H: tl.constexpr, NH: tl.constexpr, NKV: tl.constexpr,
                        HALF: tl.constexpr, INNER: tl.constexpr, BLOCK_M: tl.constexpr, BN_QKV: tl.constexpr,
                        BN_O: tl.constexpr, BN_GU: tl.constexpr, BN_D: tl.constexpr, S_QKV: tl.constexpr,
                        S_OD: tl.constexpr, BK: tl.constexpr, BQ: tl.constexpr, CAUSAL: tl.constexpr,
                        NPROG_P2: tl.constexpr, CLOCK: tl.constexpr, PERSISTENT: tl.constexpr):
        """Steps [first, last) of the decoder: step = layer * 7 + phase (module docstring); the step after the
        last layer's is the final norm. qkv_ptr and x_ptr hold float32 partials of K's slices (S_QKV; S_OD for
        the o and down projections), summed where they are read. PERSISTENT: a grid barrier after each step."""
        pid = tl.program_id(0)
        nprog = tl.num_programs(0)
        D: tl.constexpr = 2 * HALF
        QKV_N: tl.constexpr = (NH + 2 * NKV) * D
        if CLOCK and pid == 0:
            tl.store(clock_ptr + first, _globaltimer())
        for step in range(first, last):
            layer = tl.cast(step // 7, tl.int64)
            phase = step % 7
            if phase == 0:
                if step == final:
                    _norm_rows(res_ptr, x_ptr, fin_ptr, out_ptr, T, pid, nprog, eps, True, H, BLOCK_H, S_OD)
                else:
                    _norm_rows(res_ptr, x_ptr, ln1_ptr + layer * H, h_ptr, T, pid, nprog, eps, step > 0, H, BLOCK_H,
                               S_OD)
            elif phase == 1:
                _gemm(h_ptr, wqkv_ptr + layer * (QKV_N * H), qkv_ptr, T, pid, nprog, QKV_N, H, BLOCK_M, BN_QKV, BK,
                      S_QKV, False)
            elif phase == 2:
                _attention(qkv_ptr, attn_ptr, qn_ptr + layer * D, kn_ptr + layer * D, pos_ptr, seq_ptr,
                           inv_freq_ptr, T, pid, nprog, eps, scale, NH, NKV, HALF, BLOCK_M, BQ, CAUSAL, S_QKV)
            elif phase == 3:
                _gemm(attn_ptr, wo_ptr + layer * (H * NH * D), x_ptr, T, pid, nprog, H, NH * D, BLOCK_M, BN_O, BK,
                      S_OD, False)
            elif phase == 4:
                _norm_rows(res_ptr, x_ptr, ln2_ptr + layer * H, h_ptr, T, pid, nprog, eps, True, H, BLOCK_H, S_OD)
            elif phase == 5:
                _gemm(h_ptr, wgu_ptr + layer * (2 * INNER * H), act_ptr, T, pid, nprog, INNER, H, BLOCK_M, BN_GU,
                      BK, 1, True)
            else:
                _gemm(act_ptr, wd_ptr + layer * (H * INNER), x_ptr, T, pid, nprog, H, INNER, BLOCK_M, BN_D, BK,
                      S_OD, False)
            if PERSISTENT:
                _barrier(flags_ptr, pid, nprog, step + 1, NPROG_P2)
            if CLOCK and pid == 0:
                tl.store(clock_ptr + step + 1, _globaltimer())
