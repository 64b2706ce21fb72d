"""Fused elementwise kernels for the decoder layers (Triton on CUDA, the same math in torch elsewhere); the encoders'
are rose.layers.encoder_norms.

Why: inside a whole-model CUDA graph the launch overhead is gone, but each kernel node still costs
~2-3 µs of GPU time and every unfused elementwise op re-reads its tensor from memory. The unfused Qwen3
layer ran ~50 kernels (RMSNorm alone is 8: casts, pow, mean, rsqrt, two muls); 28 layers x 50 x ~3 µs
put a 4 ms floor under a 64-token forward on the H200 (benchmarks/NOTES.md). Fused, a layer is
add+RMSNorm, QKV GEMM, QK-norm+RoPE, attention, O GEMM, add+RMSNorm, gate-up GEMM, SiLU*mul, down GEMM.
The same kernels serve the other decoders by a compile-time mode: the norm is Qwen3's (`weight * x`,
rounded between), Gemma's (`(1 + weight) * x`, rounded once) or, for the QK step, absent (Qwen2, Mistral:
RoPE alone); the gate activation is SiLU or GELU-tanh (Gemma).

Rounding follows Hugging Face's bf16 path (residual sum, norm output and RoPE cos/sin rounded to the
activation dtype) so parity with transformers holds; arithmetic inside a kernel is float32.
Hand-written Triton rather than torch.compile: compiled once per kernel (not per token bucket), no
recompiles under capture, and start-to-ready stays within seconds.
"""

from __future__ import annotations

import os

import torch

try:  # Triton ships with CUDA builds of torch; on a CPU (and in CI, where dev installs Triton) the torch fallbacks run
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the torch build
    triton = None

ENABLED = os.environ.get("ROSE_FUSED_KERNELS", "1") not in ("0", "false", "off")
QK_NORMS = {None: 0, "rms": 1, "gemma": 2}  # the QK step's norm -> the kernel's NORM mode
GATE_ACTS = {"silu": 0, "gelu_tanh": 1}  # gate activation -> the kernel's ACT mode


def _use_triton(x: torch.Tensor) -> bool:
    return ENABLED and triton is not None and x.is_cuda


def _qk_kernel_fits(x: torch.Tensor, head_dim: int) -> bool:
    return _use_triton(x) and not head_dim & (head_dim - 1)  # tl.arange needs a power-of-two half


# -- torch reference versions (CPU, and the definition the kernels must match) ---------------------
def _rms_torch(x: torch.Tensor, weight: torch.Tensor, eps: float, gemma: bool = False) -> torch.Tensor:
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    if gemma:  # Gemma: (1 + weight) in float32, one rounding at the end
        return (h * (1.0 + weight.to(torch.float32))).to(x.dtype)
    return weight * h.to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


# -- public API --------------------------------------------------------------------------------------
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, gemma: bool = False) -> torch.Tensor:
    if not _use_triton(x):
        return _rms_torch(x, weight, eps, gemma)
    out = torch.empty_like(x)
    _launch_add_rms(x, None, weight, out, None, eps, gemma)
    return out


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float, gemma: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(residual + x), residual + x): the residual add and the next norm in one pass."""
    if not _use_triton(x):
        summed = residual + x
        return _rms_torch(summed, weight, eps, gemma), summed
    out = torch.empty_like(x)
    new_residual = torch.empty_like(x)
    _launch_add_rms(x, residual, weight, out, new_residual, eps, gemma)
    return out, new_residual


def qk_norm_rope(qkv: torch.Tensor, q_weight: torch.Tensor | None, k_weight: torch.Tensor | None,
                 positions: torch.Tensor, inv_freq: torch.Tensor, num_heads: int, num_kv_heads: int, head_dim: int,
                 eps: float, norm: str | None = "rms") -> tuple[torch.Tensor, torch.Tensor]:
    """From the fused QKV projection [T, (Hq + 2 Hkv) D]: per-head norm of q and k (`norm` of QK_NORMS;
    None = none, the weights unused), then RoPE at each token's position. Returns contiguous q [T, Hq, D]
    and k [T, Hkv, D]."""
    t = qkv.shape[0]
    q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
    if not _qk_kernel_fits(qkv, head_dim):
        q = qkv[:, :q_size].reshape(t, num_heads, head_dim)
        k = qkv[:, q_size:q_size + kv_size].reshape(t, num_kv_heads, head_dim)
        if norm is not None:
            q, k = _rms_torch(q, q_weight, eps, norm == "gemma"), _rms_torch(k, k_weight, eps, norm == "gemma")
        freqs = positions.to(torch.float32)[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().to(qkv.dtype)[:, None, :], emb.sin().to(qkv.dtype)[:, None, :]
        return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
    q = torch.empty(t, num_heads, head_dim, dtype=qkv.dtype, device=qkv.device)
    k = torch.empty(t, num_kv_heads, head_dim, dtype=qkv.dtype, device=qkv.device)
    launch_qk_norm_rope(qkv, q, k, q_weight, k_weight, positions, inv_freq, eps, norm=norm)
    return q, k


def qk_block_tokens(tokens: int, num_heads: int) -> int:
    """Tokens per program of the QK-norm+RoPE kernel: the most (up to 8, and up to 128 q heads' rows)
    that still leave ~2 programs per SM of the H200's 132, so small batches spread over the chip."""
    block = 8
    while block > 1 and (block * num_heads > 128 or -(-tokens // block) < 264):
        block //= 2
    return block


def launch_qk_norm_rope(qkv, q, k, q_weight, k_weight, positions, inv_freq, eps: float,
                        block_tokens: int | None = None, norm: str | None = "rms") -> None:
    """One program per block of tokens and per q-or-k: each normalizes and rotates every head of its
    tokens ([tokens, heads, head_dim] tiles), computing each token's cos/sin once, not once per head."""
    if norm is None:  # the weight pointers are never read: any tensor will do
        q_weight = k_weight = inv_freq
    t, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    block_t = block_tokens or qk_block_tokens(t, num_heads)
    block_hq, block_hk = triton.next_power_of_2(num_heads), triton.next_power_of_2(num_kv_heads)
    elements = block_t * block_hq * head_dim
    _qk_norm_rope_kernel[(triton.cdiv(t, block_t), 2)](
        qkv, q, k, q_weight, k_weight, positions, inv_freq, qkv.stride(0), t, num_heads, num_kv_heads, eps,
        HALF=head_dim // 2, BLOCK_T=block_t, BLOCK_HQ=block_hq, BLOCK_HK=block_hk, NORM=QK_NORMS[norm],
        num_warps=4 if elements <= 4096 else 8)


def precompile_qk_norm_rope(attn) -> int:
    """Compile every tokens-per-program variant of the QK-norm+RoPE kernel for this attention module's
    shape and norm (`attn.qk_norm`; weights `attn.q_norm`, `attn.k_norm`) now (each is a Triton compile of
    ~0.3-1 s on its first use), so that the first batch of a new size in serving does not pay it. Returns
    how many launches ran (0 off CUDA)."""
    weight = attn.qkv_proj.weight
    if not _qk_kernel_fits(weight, attn.head_dim):
        return 0
    norm = attn.qk_norm
    q_weight, k_weight = (None, None) if norm is None else (attn.q_norm.weight, attn.k_norm.weight)
    heads, kv_heads, d = attn.num_heads, attn.num_kv_heads, attn.head_dim
    qkv = torch.zeros(8, (heads + 2 * kv_heads) * d, dtype=weight.dtype, device=weight.device)
    q = torch.empty(8, heads, d, dtype=weight.dtype, device=weight.device)
    k = torch.empty(8, kv_heads, d, dtype=weight.dtype, device=weight.device)
    positions = torch.arange(8, device=weight.device)
    inv_freq = torch.ones(d // 2, dtype=torch.float32, device=weight.device)
    blocks = sorted({qk_block_tokens(t, heads) for t in (1, 1 << 10, 1 << 11, 1 << 12, 1 << 20)})
    for block in blocks:
        launch_qk_norm_rope(qkv, q, k, q_weight, k_weight, positions, inv_freq, 1e-6, block_tokens=block,
                            norm=norm)
    return len(blocks)


def gate_mul(gate_up: torch.Tensor, act: str = "silu") -> torch.Tensor:
    """act(gate) * up for the fused gate-up projection [T, 2I] -> [T, I]; act of GATE_ACTS."""
    inner = gate_up.shape[1] // 2
    if not _use_triton(gate_up):
        gate, up = gate_up.split(inner, dim=-1)
        if act == "silu":
            return torch.nn.functional.silu(gate) * up
        return torch.nn.functional.gelu(gate, approximate="tanh") * up
    out = torch.empty(gate_up.shape[0], inner, dtype=gate_up.dtype, device=gate_up.device)
    block = 1024
    _act_mul_kernel[(gate_up.shape[0], triton.cdiv(inner, block))](gate_up, out, inner, gate_up.stride(0),
                                                                    ACT=GATE_ACTS[act], BLOCK=block)
    return out


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up (Qwen3, Qwen2, Mistral)."""
    return gate_mul(gate_up, "silu")


# -- Triton kernels ------------------------------------------------------------------------------------
def row_launch(cols: int) -> dict:
    """A one-program-a-row norm kernel's launch shape for rows of `cols` values: the whole row in one block (the next
    power of two), 4 warps up to 2048 values, 8 past (the RMS and the encoders' LayerNorm kernels alike)."""
    block = triton.next_power_of_2(cols)
    return {"BLOCK": block, "num_warps": 4 if block <= 2048 else 8}


def _launch_add_rms(x, residual, weight, out, res_out, eps: float, gemma: bool = False) -> None:
    rows, cols = x.shape[0], x.shape[-1]
    has_res = residual is not None
    _add_rms_kernel[(rows,)](x, residual if has_res else x, weight, out, res_out if has_res else out,
                             cols, x.stride(0), eps, HAS_RES=has_res, GEMMA=gemma, **row_launch(cols))


if triton is not None:

    @triton.jit
    def _add_rms_kernel(x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr, cols, stride, eps,
                        HAS_RES: tl.constexpr, GEMMA: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        offs = tl.arange(0, BLOCK)
        mask = offs < cols
        x = tl.load(x_ptr + row * stride + offs, mask=mask, other=0.0)
        if HAS_RES:
            r = tl.load(res_ptr + row * stride + offs, mask=mask, other=0.0)
            x = (x.to(tl.float32) + r.to(tl.float32)).to(res_out_ptr.dtype.element_ty)  # bf16 sum, as HF
            tl.store(res_out_ptr + row * stride + offs, x, mask=mask)
        h = x.to(tl.float32)
        rstd = tl.rsqrt(tl.sum(h * h, axis=0) / cols + eps)
        w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        if GEMMA:  # (1 + w) * x, rounded once
            y = h * rstd * (1.0 + w)
        else:  # w * round(x), as HF's Qwen3/Llama RMSNorm
            y = (h * rstd).to(out_ptr.dtype.element_ty).to(tl.float32) * w
        tl.store(out_ptr + row * stride + offs, y.to(out_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _norm_rope_heads(qkv_ptr, dst_ptr, w_ptr, pos_ptr, inv_freq_ptr, stride, tokens, col0, heads, eps,
                         HALF: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, NORM: tl.constexpr):
        tok = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
        tok_ok = tok < tokens
        tok64 = tok.to(tl.int64)
        h = tl.arange(0, BLOCK_H)
        j = tl.arange(0, HALF)
        mask = tok_ok[:, None, None] & (h < heads)[None, :, None] & (j < HALF)[None, None, :]
        src = qkv_ptr + tok64[:, None, None] * stride + col0 + h[None, :, None] * (2 * HALF) + j[None, None, :]
        n1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)
        n2 = tl.load(src + HALF, mask=mask, other=0.0).to(tl.float32)
        dt = dst_ptr.dtype.element_ty
        if NORM != 0:
            rstd = tl.rsqrt((tl.sum(n1 * n1, axis=2) + tl.sum(n2 * n2, axis=2)) / (2 * HALF) + eps)[:, :, None]
            w1 = tl.load(w_ptr + j).to(tl.float32)[None, None, :]
            w2 = tl.load(w_ptr + HALF + j).to(tl.float32)[None, None, :]
            if NORM == 1:  # Qwen3: w * round(x)
                n1 = ((n1 * rstd).to(dt).to(tl.float32) * w1).to(dt).to(tl.float32)
                n2 = ((n2 * rstd).to(dt).to(tl.float32) * w2).to(dt).to(tl.float32)
            else:  # Gemma: (1 + w) * x, rounded once
                n1 = (n1 * rstd * (1.0 + w1)).to(dt).to(tl.float32)
                n2 = (n2 * rstd * (1.0 + w2)).to(dt).to(tl.float32)
        pos = tl.load(pos_ptr + tok, mask=tok_ok, other=0).to(tl.float32)
        freq = pos[:, None] * tl.load(inv_freq_ptr + j)[None, :]
        c = tl.cos(freq).to(dt).to(tl.float32)[:, None, :]
        s = tl.sin(freq).to(dt).to(tl.float32)[:, None, :]
        dst = dst_ptr + (tok64[:, None, None] * heads + h[None, :, None]) * (2 * HALF) + j[None, None, :]
        tl.store(dst, (n1 * c - n2 * s).to(dt), mask=mask)
        tl.store(dst + HALF, (n2 * c + n1 * s).to(dt), mask=mask)

    @triton.jit
    def _qk_norm_rope_kernel(qkv_ptr, q_ptr, k_ptr, qw_ptr, kw_ptr, pos_ptr, inv_freq_ptr, stride, tokens,
                             num_heads, num_kv_heads, eps, HALF: tl.constexpr, BLOCK_T: tl.constexpr,
                             BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr, NORM: tl.constexpr):
        if tl.program_id(1) == 0:
            _norm_rope_heads(qkv_ptr, q_ptr, qw_ptr, pos_ptr, inv_freq_ptr, stride, tokens, 0, num_heads, eps,
                             HALF, BLOCK_T, BLOCK_HQ, NORM)
        else:
            _norm_rope_heads(qkv_ptr, k_ptr, kw_ptr, pos_ptr, inv_freq_ptr, stride, tokens, num_heads * 2 * HALF,
                             num_kv_heads, eps, HALF, BLOCK_T, BLOCK_HK, NORM)

    @triton.jit
    def _act_mul_kernel(gu_ptr, out_ptr, inner, stride, ACT: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < inner
        g = tl.load(gu_ptr + row * stride + offs, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(gu_ptr + row * stride + inner + offs, mask=mask, other=0.0).to(tl.float32)
        dt = out_ptr.dtype.element_ty
        if ACT == 0:  # silu
            act = (g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32)
        else:  # gelu, tanh approximation; tanh(y) = 1 - 2 / (exp(2y) + 1) (exp overflow gives 1, as it should)
            y = 0.7978845608028654 * (g + 0.044715 * g * g * g)
            act = (0.5 * g * (2.0 - 2.0 / (tl.exp(2.0 * y) + 1.0))).to(dt).to(tl.float32)
        tl.store(out_ptr + row * inner + offs, (act * u).to(dt), mask=mask)
