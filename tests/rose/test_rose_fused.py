"""Fused Triton kernels equal their torch definitions (GPU, bf16; the CPU always runs the torch path)."""

from __future__ import annotations

import pytest
import torch

from rose.layers import encoder_norms, fused

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available() or fused.triton is None,
                                                  reason="needs CUDA and Triton")]


def _both(fn, *args, monkeypatch):
    monkeypatch.setattr(fused, "ENABLED", True)
    monkeypatch.setattr(encoder_norms, "ENCODER_NORMS", True)  # whatever ROSE_ENCODER_NORMS says: tested here
    fast = fn(*args)
    monkeypatch.setattr(fused, "ENABLED", False)
    monkeypatch.setattr(encoder_norms, "ENCODER_NORMS", False)
    ref = fn(*args)
    return fast, ref


def _close(a, b, rel=2e-2):
    a, b = a.float(), b.float()
    assert torch.isfinite(a).all()
    err = (a - b).norm() / b.norm().clamp_min(1e-12)
    assert err < rel, f"relative error {err:.2e}"


@pytest.mark.parametrize("tokens,hidden", [(1, 64), (37, 1024), (300, 2560)])
def test_add_rms_norm(tokens, hidden, monkeypatch):
    g = torch.Generator("cuda").manual_seed(tokens)
    x = torch.randn(tokens, hidden, device="cuda", generator=g).bfloat16()
    r = torch.randn(tokens, hidden, device="cuda", generator=g).bfloat16()
    w = (1 + 0.1 * torch.randn(hidden, device="cuda", generator=g)).bfloat16()
    (out, res), (out_ref, res_ref) = _both(fused.add_rms_norm, x, r, w, 1e-6, monkeypatch=monkeypatch)
    assert torch.equal(res, res_ref), "the residual sum rounds exactly as torch's bf16 add"
    _close(out, out_ref)
    fast, ref = _both(fused.rms_norm, x, w, 1e-6, monkeypatch=monkeypatch)
    _close(fast, ref)


@pytest.mark.parametrize("heads,kv_heads,head_dim,tokens", [(16, 8, 128, 77), (4, 2, 16, 77), (32, 8, 128, 77),
                                                          (16, 8, 128, 1), (16, 8, 128, 4099), (12, 3, 64, 530)])
def test_qk_norm_rope(heads, kv_heads, head_dim, tokens, monkeypatch):
    g = torch.Generator("cuda").manual_seed(heads)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, device="cuda", generator=g).bfloat16()
    qw = (1 + 0.1 * torch.randn(head_dim, device="cuda", generator=g)).bfloat16()
    kw = (1 + 0.1 * torch.randn(head_dim, device="cuda", generator=g)).bfloat16()
    pos = torch.randint(0, 30000, (tokens,), device="cuda", generator=g)
    inv_freq = 1.0 / (1e6 ** (torch.arange(0, head_dim, 2, device="cuda", dtype=torch.float32) / head_dim))
    (q, k), (q_ref, k_ref) = _both(fused.qk_norm_rope, qkv, qw, kw, pos, inv_freq, heads, kv_heads, head_dim, 1e-6,
                                   monkeypatch=monkeypatch)
    assert q.shape == (tokens, heads, head_dim) and k.shape == (tokens, kv_heads, head_dim)
    _close(q, q_ref)
    _close(k, k_ref)


def test_qk_norm_rope_block_sizes_agree():
    """Every tokens-per-program choice (and the tail of a partial block) gives the same bits."""
    heads, kv_heads, head_dim, tokens = 16, 8, 128, 1001
    g = torch.Generator("cuda").manual_seed(7)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, device="cuda", generator=g).bfloat16()
    qw, kw = torch.rand(head_dim, device="cuda", generator=g).bfloat16(), torch.rand(head_dim, device="cuda").bfloat16()
    pos = torch.arange(tokens, device="cuda")
    inv_freq = 1.0 / (1e6 ** (torch.arange(0, head_dim, 2, device="cuda", dtype=torch.float32) / head_dim))
    outs = []
    for block in (1, 2, 4, 8):
        q = torch.full((tokens, heads, head_dim), float("nan"), dtype=qkv.dtype, device="cuda")
        k = torch.full((tokens, kv_heads, head_dim), float("nan"), dtype=qkv.dtype, device="cuda")
        fused.launch_qk_norm_rope(qkv, q, k, qw, kw, pos, inv_freq, 1e-6, block_tokens=block)
        assert torch.isfinite(q).all() and torch.isfinite(k).all(), f"rows left unwritten at block {block}"
        outs.append((q, k))
    for q, k in outs[1:]:
        assert torch.equal(q, outs[0][0]) and torch.equal(k, outs[0][1])


def test_warmup_compiles_every_qk_kernel_variant(tiny_models):
    """A batch of a new size must not meet a Triton compile in serving (0.3-1 s each on first use)."""
    from rose.engine import Engine

    engine = Engine.from_pretrained(tiny_models["qwen3"].path, device="cuda", prewarm=(), graph_manifest=None)
    engine.warmup()
    attn = engine.runner.model.layers[0].self_attn
    blocks = {fused.qk_block_tokens(t, attn.num_heads) for t in (1, 600, 1500, 3000, 50000)}
    compiled = sum(len(c[0]) for c in fused._qk_norm_rope_kernel.device_caches.values()) \
        if hasattr(fused._qk_norm_rope_kernel, "device_caches") else None
    assert fused.precompile_qk_norm_rope(attn) == len(blocks) == 4
    if compiled is not None:
        assert compiled >= 4, "warm-up left qk-norm kernel variants to compile in serving"
    engine.close()


def test_silu_mul(monkeypatch):
    g = torch.Generator("cuda").manual_seed(0)
    gate_up = torch.randn(129, 2 * 3072, device="cuda", generator=g).bfloat16()
    fast, ref = _both(fused.silu_mul, gate_up, monkeypatch=monkeypatch)
    _close(fast, ref)


# -- the other decoders' modes: Gemma's (1 + w) norm, RoPE without a QK-norm, GELU-tanh ---------------
@pytest.mark.parametrize("tokens,hidden", [(1, 64), (37, 768), (300, 4096)])
def test_gemma_rms_norm(tokens, hidden, monkeypatch):
    g = torch.Generator("cuda").manual_seed(tokens)
    x = torch.randn(tokens, hidden, device="cuda", generator=g).bfloat16()
    r = torch.randn(tokens, hidden, device="cuda", generator=g).bfloat16()
    w = (0.1 * torch.randn(hidden, device="cuda", generator=g)).bfloat16()  # Gemma's weights are centred on 0
    (out, res), (out_ref, res_ref) = _both(fused.add_rms_norm, x, r, w, 1e-6, True, monkeypatch=monkeypatch)
    assert torch.equal(res, res_ref)
    _close(out, out_ref)
    fast, ref = _both(fused.rms_norm, x, w, 1e-6, True, monkeypatch=monkeypatch)
    _close(fast, ref)
    plain, _ = _both(fused.rms_norm, x, w, 1e-6, False, monkeypatch=monkeypatch)
    assert (plain.float() - fast.float()).norm() > 0.5 * fast.float().norm(), "the modes differ: (1 + w) vs w"


@pytest.mark.parametrize("norm", [None, "gemma"])
@pytest.mark.parametrize("heads,kv_heads,head_dim,tokens", [(3, 1, 256, 77), (12, 2, 128, 530), (32, 8, 128, 4099),
                                                          (4, 2, 16, 1)])
def test_qk_rope_without_norm_and_with_gemmas(norm, heads, kv_heads, head_dim, tokens, monkeypatch):
    g = torch.Generator("cuda").manual_seed(heads + tokens)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, device="cuda", generator=g).bfloat16()
    qw = None if norm is None else (0.1 * torch.randn(head_dim, device="cuda", generator=g)).bfloat16()
    kw = None if norm is None else (0.1 * torch.randn(head_dim, device="cuda", generator=g)).bfloat16()
    pos = torch.randint(0, 30000, (tokens,), device="cuda", generator=g)
    inv_freq = 1.0 / (1e4 ** (torch.arange(0, head_dim, 2, device="cuda", dtype=torch.float32) / head_dim))
    (q, k), (q_ref, k_ref) = _both(fused.qk_norm_rope, qkv, qw, kw, pos, inv_freq, heads, kv_heads, head_dim, 1e-6,
                                   norm, monkeypatch=monkeypatch)
    assert q.shape == (tokens, heads, head_dim) and q.is_contiguous() and k.is_contiguous()
    _close(q, q_ref)
    _close(k, k_ref)


@pytest.mark.parametrize("norm", [None, "gemma"])
def test_qk_rope_block_sizes_agree_in_every_mode(norm):
    heads, kv_heads, head_dim, tokens = 3, 1, 256, 1001
    g = torch.Generator("cuda").manual_seed(9)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, device="cuda", generator=g).bfloat16()
    qw, kw = (0.1 * torch.randn(2, head_dim, device="cuda", generator=g)).bfloat16()
    pos = torch.arange(tokens, device="cuda")
    inv_freq = 1.0 / (1e4 ** (torch.arange(0, head_dim, 2, device="cuda", dtype=torch.float32) / head_dim))
    outs = []
    for block in (1, 2, 4, 8):
        q = torch.full((tokens, heads, head_dim), float("nan"), dtype=qkv.dtype, device="cuda")
        k = torch.full((tokens, kv_heads, head_dim), float("nan"), dtype=qkv.dtype, device="cuda")
        fused.launch_qk_norm_rope(qkv, q, k, qw, kw, pos, inv_freq, 1e-6, block_tokens=block, norm=norm)
        assert torch.isfinite(q).all() and torch.isfinite(k).all(), f"rows left unwritten at block {block}"
        outs.append((q, k))
    for q, k in outs[1:]:
        assert torch.equal(q, outs[0][0]) and torch.equal(k, outs[0][1])


def test_gelu_tanh_mul(monkeypatch):
    g = torch.Generator("cuda").manual_seed(1)
    gate_up = 3 * torch.randn(129, 2 * 1152, device="cuda", generator=g).bfloat16()
    gate_up[0, :6] = torch.tensor([-100.0, -30.0, -5.0, 5.0, 30.0, 100.0])  # exp overflows to inf: tanh -> +-1
    fast, ref = _both(fused.gate_mul, gate_up, "gelu_tanh", monkeypatch=monkeypatch)
    assert torch.isfinite(fast).all()
    _close(fast, ref)


def test_warmup_compiles_the_qk_kernel_of_each_decoder(tiny_decoders):
    from rose.engine import Engine

    for name, mode in (("gemma3", "gemma"), ("qwen2", None), ("mistral", None)):
        engine = Engine.from_pretrained(tiny_decoders[name].path, device="cuda", prewarm=(), graph_manifest=None)
        attn = engine.runner.model.layers[0].self_attn
        assert attn.qk_norm == mode and fused.precompile_qk_norm_rope(attn) == 4
        engine.close()


@pytest.mark.parametrize("tokens,hidden,bias", [(1, 384, True), (128, 384, True), (300, 1024, False), (77, 768, True)])
def test_add_layer_norm(tokens, hidden, bias, monkeypatch):
    """The encoders' add + LayerNorm kernel against torch's layer_norm of the bf16 sum."""
    g = torch.Generator("cuda").manual_seed(tokens + hidden)
    x = torch.randn(tokens, hidden, device="cuda", generator=g).bfloat16()
    r = torch.randn(tokens, hidden, device="cuda", generator=g).bfloat16()
    w = (1 + 0.1 * torch.randn(hidden, device="cuda", generator=g)).bfloat16()
    b = (0.1 * torch.randn(hidden, device="cuda", generator=g)).bfloat16() if bias else None
    fast, ref = _both(encoder_norms.add_layer_norm, x, r, w, b, 1e-12, monkeypatch=monkeypatch)
    assert fast.shape == ref.shape and fast.dtype == ref.dtype
    _close(fast, ref, rel=1e-2)
    assert (fast.float() - ref.float()).abs().max() <= 2 * 2 ** -7 * ref.float().abs().max()  # a rounding step or two


@pytest.mark.parametrize("types", ["none", "row0", "given"])
def test_embed_layer_norm(types, monkeypatch):
    """The encoders' embeddings kernel against torch's gathers, bf16 sums and layer_norm."""
    g = torch.Generator("cuda").manual_seed(3)
    tokens, hidden = 130, 384
    word = torch.randn(1000, hidden, device="cuda", generator=g).bfloat16()
    position = torch.randn(512, hidden, device="cuda", generator=g).bfloat16()
    table = torch.randn(2, hidden, device="cuda", generator=g).bfloat16() if types != "none" else None
    ids = torch.randint(0, 1000, (tokens,), device="cuda", generator=g)
    at = torch.randint(0, 512, (tokens,), device="cuda", generator=g)
    kinds = torch.randint(0, 2, (tokens,), device="cuda", generator=g) if types == "given" else None
    w = (1 + 0.1 * torch.randn(hidden, device="cuda", generator=g)).bfloat16()
    b = (0.1 * torch.randn(hidden, device="cuda", generator=g)).bfloat16()
    fast, ref = _both(encoder_norms.embed_layer_norm, ids, at, kinds, word, position, table, w, b, 1e-12,
                      monkeypatch=monkeypatch)
    assert fast.shape == ref.shape == (tokens, hidden) and fast.dtype == ref.dtype
    _close(fast, ref, rel=1e-2)
    assert (fast.float() - ref.float()).abs().max() <= 2 * 2 ** -7 * ref.float().abs().max()
