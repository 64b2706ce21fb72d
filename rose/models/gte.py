"""GTE v1.5 / mGTE (`NewModel`, Alibaba-NLP/new-impl, trust_remote_code): post-LN encoder, RoPE, gated MLP.

The published math, per layer: h = attn_ln(x + o_proj(attention(rope(q), rope(k), v))), then
out = mlp_ln(h + down_proj(act(gate) * up)), with up and gate the two halves of up_gate_proj (no bias).
Embeddings: word + token type 0 (when type_vocab_size > 0) + absolute positions (position_embedding_type
"absolute"), then LayerNorm. RoPE ("rope") may be NTK-scaled (rope_scaling {"type": "ntk", "factor": f,
"mixed_b": b}): the published code builds its cos/sin table for f x max_position_embeddings positions, so
the scaled frequencies apply to every input, short ones included. Norms are LayerNorm or RMSNorm
(layer_norm_type). Config defaults are NewConfig's. Module paths mirror the published NewModel; with
pack_qkv false, `attention.qkv_proj` is q_proj, k_proj and v_proj concatenated at load.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from rose.attention.base import AttentionBackend, AttentionContext
from rose.layers import LayerNorm, MergedLinear, RMSNorm, RotaryEmbedding, apply_rotary, get_activation
from rose.meta import ForwardMeta

DEFAULTS = {"type_vocab_size": 1, "layer_norm_eps": 1e-12, "layer_norm_type": "layer_norm", "rope_theta": 10000.0,
            "position_embedding_type": "rope", "pack_qkv": True, "hidden_act": "gelu"}


def _get(cfg: dict[str, Any], key: str):
    value = cfg.get(key)
    return DEFAULTS[key] if value is None else value


def ntk_inv_freq(head_dim: int, theta: float, scaling: dict[str, Any] | None) -> torch.Tensor:
    """RoPE inverse frequencies, NTK-scaled as the published NTKScalingRotaryEmbedding (fixed, or mixed with
    `mixed_b`) when rope_scaling has a factor above 1."""
    exponent = torch.arange(0, head_dim, 2, dtype=torch.float32, device="cpu") / head_dim
    if not scaling:
        return 1.0 / (theta ** exponent)
    if scaling.get("type", scaling.get("rope_type")) != "ntk":
        raise ValueError(f"unsupported rope_scaling {scaling!r} (only NTK)")
    factor, mixed_b = float(scaling["factor"]), scaling.get("mixed_b")
    if factor <= 1.0:  # the published table then covers max_position_embeddings: no scaling
        return 1.0 / (theta ** exponent)
    if mixed_b is None:
        return 1.0 / ((theta * factor) ** exponent) / factor ** (2.0 / head_dim)
    a = math.log(factor) / (head_dim / 2) ** float(mixed_b)
    m = torch.arange(1, head_dim // 2 + 1, dtype=torch.float32, device="cpu")
    return (1.0 / (theta ** exponent)) / torch.exp(a * m ** float(mixed_b))


def _norm(cfg: dict[str, Any], hidden: int) -> nn.Module:
    kind, eps = _get(cfg, "layer_norm_type"), float(_get(cfg, "layer_norm_eps"))
    if kind == "layer_norm":
        return LayerNorm(hidden, eps=eps)
    if kind == "rms_norm":
        return RMSNorm(hidden, eps)
    raise ValueError(f"unsupported layer_norm_type {kind!r}")


class NewEmbeddings(nn.Module):
    def __init__(self, cfg: dict[str, Any], hidden: int) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(cfg["vocab_size"], hidden)
        self.absolute = _get(cfg, "position_embedding_type") == "absolute"
        if self.absolute:
            self.position_embeddings = nn.Embedding(cfg["max_position_embeddings"], hidden)
        if int(_get(cfg, "type_vocab_size")) > 0:
            self.token_type_embeddings = nn.Embedding(int(_get(cfg, "type_vocab_size")), hidden)
        self.LayerNorm = LayerNorm(hidden, eps=float(_get(cfg, "layer_norm_eps")))

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x = self.word_embeddings(input_ids)
        if hasattr(self, "token_type_embeddings"):
            x = x + self.token_type_embeddings.weight[0]
        if self.absolute:
            x = x + self.position_embeddings(positions)
        return self.LayerNorm(x)


class NewAttention(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.qkv_proj = MergedLinear(hidden, (hidden, hidden, hidden), bias=True)
        self.o_proj = nn.Linear(hidden, hidden)


class NewGatedMLP(nn.Module):
    def __init__(self, cfg: dict[str, Any], hidden: int) -> None:
        super().__init__()
        inner = cfg["intermediate_size"]
        self.up_gate_proj = nn.Linear(hidden, 2 * inner, bias=False)
        self.down_proj = nn.Linear(inner, hidden)
        self.act = get_activation(_get(cfg, "hidden_act"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        up, gate = self.up_gate_proj(x).chunk(2, dim=-1)
        return self.down_proj(self.act(gate) * up)


class NewLayer(nn.Module):
    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        hidden = cfg["hidden_size"]
        self.num_heads = cfg["num_attention_heads"]
        self.head_dim = hidden // self.num_heads
        self.attention = NewAttention(hidden)
        self.mlp = NewGatedMLP(cfg, hidden)
        self.attn_ln = _norm(cfg, hidden)
        self.mlp_ln = _norm(cfg, hidden)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None,
                attn: AttentionContext) -> torch.Tensor:
        t = x.shape[0]
        shape = (t, self.num_heads, self.head_dim)
        q, k, v = (p.view(shape) for p in self.attention.qkv_proj.forward_split(x))
        if rope is not None:
            q, k = apply_rotary(q, *rope), apply_rotary(k, *rope)
        h = self.attn_ln(x + self.attention.o_proj(attn(q, k, v).reshape(t, -1)))
        return self.mlp_ln(h + self.mlp(h))


class NewEncoder(nn.Module):
    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        self.layer = nn.ModuleList(NewLayer(cfg) for _ in range(cfg["num_hidden_layers"]))


class NewModel(nn.Module):
    """forward(meta, backend) -> last hidden states [Tb, hidden] (no final norm: the layers end post-LN)."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        hidden, heads = cfg["hidden_size"], cfg["num_attention_heads"]
        if hidden % heads:
            raise ValueError("hidden_size must be a multiple of num_attention_heads")
        if cfg.get("logn_attention_scale"):
            raise ValueError("logn_attention_scale is not supported")
        kind = _get(cfg, "position_embedding_type")
        if kind not in ("rope", "absolute"):
            raise ValueError(f"unsupported position_embedding_type {kind!r}")
        if not _get(cfg, "pack_qkv"):  # separate q/k/v tensors in the checkpoint
            self.FUSED = {"attention.qkv_proj": ("attention.q_proj", "attention.k_proj", "attention.v_proj")}
        self.scale = (hidden // heads) ** -0.5
        self.embeddings = NewEmbeddings(cfg, hidden)
        self.encoder = NewEncoder(cfg)
        self.rotary = None
        if kind == "rope":
            self.rotary = RotaryEmbedding(hidden // heads, float(_get(cfg, "rope_theta")))
            self.rotary.register_buffer("inv_freq", ntk_inv_freq(hidden // heads, float(_get(cfg, "rope_theta")),
                                                                 cfg.get("rope_scaling")), persistent=False)

    def forward(self, meta: ForwardMeta, backend: AttentionBackend) -> torch.Tensor:
        x = self.embeddings(meta.input_ids, meta.positions)
        attn = AttentionContext.build(backend, meta, causal=False, scale=self.scale)
        rope = self.rotary(meta.positions, x.dtype) if self.rotary is not None else None
        for layer in self.encoder.layer:
            x = layer(x, rope, attn)
        return x
