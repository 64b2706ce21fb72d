"""The QKV projection with the QK norm and RoPE in its epilogue (rose.layers.qkv_norm_rope) against the layers'
unfused path (F.linear, then rose.layers.fused.qk_norm_rope) in bf16 on Qwen3-0.6B's and -4B's attention shapes: as
accurate against a float64 reference, within the rounding steps a different summation order allows, the same bits in
a CUDA-graph replay as called eagerly, and Qwen3's attention routed through it as accurate as unfused."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from rose.layers import fused, qkv_norm_rope
from rose.layers.qkv_norm_rope import qkv_norm_rope as fused_qkv

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available() or qkv_norm_rope.triton is None or not qkv_norm_rope.gemm_tiles_fit(0),
    reason="needs CUDA, Triton and a GPU with TMA that fits its tiles (Hopper, datacenter Blackwell)")]

SHAPES = {"qwen3-0.6b": (1024, 16, 8), "qwen3-4b": (2560, 32, 8)}  # hidden (K), query heads, KV heads; D 128
D = 128


def _operands(m: int, k: int, heads: int, kv_heads: int):
    g = torch.Generator("cuda").manual_seed(m * 7 + heads)
    x = torch.randn(m, k, device="cuda", generator=g).bfloat16()
    w = (torch.randn((heads + 2 * kv_heads) * D, k, device="cuda", generator=g) * 0.03).bfloat16()
    q_w = (torch.rand(D, device="cuda", generator=g) + 0.5).bfloat16()
    k_w = (torch.rand(D, device="cuda", generator=g) + 0.5).bfloat16()
    positions = torch.randint(0, 8192, (m,), device="cuda", generator=g)
    inv_freq = 1.0 / (1e6 ** (torch.arange(0, D, 2, dtype=torch.float32, device="cuda") / D))
    return x, w, q_w, k_w, positions, inv_freq


def _unfused(x, w, q_w, k_w, positions, inv_freq, heads, kv_heads):
    qkv = F.linear(x, w)
    q, k = fused.qk_norm_rope(qkv, q_w, k_w, positions, inv_freq, heads, kv_heads, D, 1e-6)
    return q, k, qkv[:, (heads + kv_heads) * D:].reshape(x.shape[0], kv_heads, D)


def _exact(x, w, q_w, k_w, positions, inv_freq, heads, kv_heads):
    """The same in float64: each head normed and rotated without a rounding."""
    qkv = x.double() @ w.double().t()
    m = x.shape[0]
    freqs = positions.double()[:, None] * inv_freq.double()[None, :]
    cos, sin = torch.cat((freqs, freqs), -1).cos()[:, None], torch.cat((freqs, freqs), -1).sin()[:, None]

    def norm_rope(h, weight):
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * weight.double()
        return h * cos + torch.cat((-h[..., D // 2:], h[..., :D // 2]), -1) * sin

    q = norm_rope(qkv[:, :heads * D].reshape(m, heads, D), q_w)
    k = norm_rope(qkv[:, heads * D:(heads + kv_heads) * D].reshape(m, kv_heads, D), k_w)
    return q, k, qkv[:, (heads + kv_heads) * D:].reshape(m, kv_heads, D)


def _error(got, want) -> float:
    return ((got.double() - want).norm() / want.norm()).item()


@pytest.mark.parametrize("model", list(SHAPES))
@pytest.mark.parametrize("m", [1, 300, 4096])
def test_as_accurate_as_the_unfused_path_and_within_its_rounding(model, m):
    k, heads, kv_heads = SHAPES[model]
    args = _operands(m, k, heads, kv_heads)
    got = fused_qkv(*args, heads, kv_heads, 1e-6, "rms")
    unfused = _unfused(*args, heads, kv_heads)
    exact = _exact(*args, heads, kv_heads)
    for name, a, b, e in zip("qkv", got, unfused, exact, strict=True):
        assert a.shape == b.shape and a.is_contiguous(), (name, a.shape, b.shape)
        assert _error(a, e) <= 1.5 * _error(b, e) + 1e-6, (name, _error(a, e), _error(b, e))
        # a product a step apart (another summation order) moves its row's rstd and rotation by a step or two of
        # the head's scale (a rotation that cancels leaves a small value with its operands' rounding)
        scale = torch.maximum(b.float().abs(), b.float().pow(2).mean(-1, keepdim=True).sqrt())
        steps = (a.float() - b.float()).abs() / (torch.finfo(torch.bfloat16).eps * scale.clamp_min(1e-6))
        assert float(steps.max()) <= 4 and float((steps > 1).float().mean()) <= 1e-2, (
            name, float(steps.max()), float((steps > 1).float().mean()))


def test_a_graph_replay_gives_the_eager_bits():
    k, heads, kv_heads = SHAPES["qwen3-0.6b"]
    args = _operands(512, k, heads, kv_heads)
    eager = [t.clone() for t in fused_qkv(*args, heads, kv_heads, 1e-6, "rms")]
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        fused_qkv(*args, heads, kv_heads, 1e-6, "rms")  # compiled before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = fused_qkv(*args, heads, kv_heads, 1e-6, "rms")
    for t in outs:
        t.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert all(torch.equal(a, b) for a, b in zip(outs, eager, strict=True))


def test_qwen3s_attention_routed_through_it_matches_the_unfused_attention(monkeypatch):
    """With the route on from 1000 tokens, Qwen3's attention runs the fused kernel from there and the unfused pair
    below it; the routed layer's output is within the unfused one's rounding."""
    from rose.attention import AttentionShape, make_backend
    from rose.attention.base import AttentionContext
    from rose.batch import Batch
    from rose.meta import ForwardMeta, pack_batch
    from rose.models.qwen3 import Qwen3Attention

    k, heads, kv_heads = SHAPES["qwen3-0.6b"]
    cfg = {"hidden_size": k, "num_attention_heads": heads, "num_key_value_heads": kv_heads, "rms_norm_eps": 1e-6}
    attn = Qwen3Attention(cfg, D).cuda().bfloat16()
    x, w, q_w, k_w, _, inv_freq = _operands(1024, k, heads, kv_heads)
    with torch.no_grad():
        attn.qkv_proj.weight.copy_(w)
        attn.q_norm.weight.copy_(q_w)
        attn.k_norm.weight.copy_(k_w)
        attn.o_proj.weight.normal_(0, 0.02)
    backend = make_backend("triton", torch.device("cuda"), torch.bfloat16, shape=AttentionShape(heads, kv_heads, D,
                                                                                                 True))
    calls = []
    monkeypatch.setattr(qkv_norm_rope, "qkv_norm_rope", lambda *a, **kw: calls.append(1) or fused_qkv(*a, **kw))
    outputs = {}
    for tokens in (1024, 999):
        host = pack_batch(Batch.from_sequences([[1] * tokens]))
        meta = ForwardMeta.from_buffer(torch.from_numpy(host.packed).cuda(), host.layout, host.max_seqlen, host)
        backend.plan(meta)
        ctx = AttentionContext.build(backend, meta, True, D ** -0.5)
        with torch.inference_mode():
            monkeypatch.setattr(qkv_norm_rope, "LEAST", None)
            plain = attn(x[:tokens], meta.positions, inv_freq, ctx)
            monkeypatch.setattr(qkv_norm_rope, "LEAST", 1000)
            outputs[tokens] = (plain, attn(x[:tokens], meta.positions, inv_freq, ctx), len(calls))
    assert outputs[1024][2] == 1 and outputs[999][2] == 1  # 1024 tokens routed, 999 not
    assert torch.equal(outputs[999][0], outputs[999][1])
    plain, routed, _ = outputs[1024]
    # q and k a rounding step apart in a few elements move the softmax's weights, not the output's scale
    apart = ((routed.float() - plain.float()).norm() / plain.float().norm()).item()
    assert apart <= 5e-3, apart
