"""ModernBERT: pre-LN encoder, RoPE, GeGLU MLP, alternating global and sliding-window (local) attention.

Layer i is global when config `layer_types[i]` says "full_attention" (older configs: i is a multiple of
`global_attn_every_n_layers`), else local: a key at most `local_attention // 2` positions away (as HF's
mask, |i - j| <= window). Global layers use the configured attention backend; local ones too, with that
window on both sides (FlashAttention's window_size=(w, w)), when the backend runs one
(`bidirectional_window`), else the banded path (rose.attention.banded, ~1.5x the keys per query and a copy
of K/V into bands per layer). Both stay ragged and capturable in a CUDA graph. RoPE has one theta per
kind (global_rope_theta 160000 / local_rope_theta 10000, or rope_parameters per layer type). Biases and
norm biases follow attention_bias / mlp_bias / norm_bias (all off in the published models). Module paths
mirror Hugging Face's ModernBertModel (`Wqkv` is already one fused tensor in the checkpoint).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from rose.attention.banded import banded_attention, window_band
from rose.attention.base import AttentionBackend, AttentionContext
from rose.layers import LayerNorm, RotaryEmbedding, apply_rotary, get_activation
from rose.meta import ForwardMeta

_DEFAULT_THETA = {"full_attention": 160000.0, "sliding_attention": 10000.0}
_LEGACY_THETA = {"full_attention": "global_rope_theta", "sliding_attention": "local_rope_theta"}


def layer_kinds(cfg: dict[str, Any]) -> list[str]:
    """'full_attention' | 'sliding_attention' per layer."""
    kinds = cfg.get("layer_types")
    if kinds is None:
        every = int(cfg.get("global_attn_every_n_layers", 3))
        kinds = ["sliding_attention" if i % every else "full_attention" for i in range(cfg["num_hidden_layers"])]
    if len(kinds) != cfg["num_hidden_layers"] or set(kinds) - set(_DEFAULT_THETA):
        raise ValueError(f"layer_types must name {cfg['num_hidden_layers']} layers of {sorted(_DEFAULT_THETA)}")
    return list(kinds)


def rope_theta(cfg: dict[str, Any], kind: str) -> float:
    params = (cfg.get("rope_parameters") or {}).get(kind) or {}
    if params.get("rope_type", "default") != "default" or cfg.get("rope_scaling"):
        raise ValueError("unsupported rope type (only the default RoPE)")
    return float(params.get("rope_theta") or cfg.get(_LEGACY_THETA[kind]) or _DEFAULT_THETA[kind])


class ModernBertEmbeddings(nn.Module):
    def __init__(self, cfg: dict[str, Any], eps: float, norm_bias: bool) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(cfg["vocab_size"], cfg["hidden_size"])
        self.norm = LayerNorm(cfg["hidden_size"], eps=eps, bias=norm_bias)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.norm(self.tok_embeddings(input_ids))


class ModernBertAttention(nn.Module):
    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        hidden, bias = cfg["hidden_size"], bool(cfg.get("attention_bias", False))
        self.num_heads = cfg["num_attention_heads"]
        self.head_dim = hidden // self.num_heads
        self.Wqkv = nn.Linear(hidden, 3 * hidden, bias=bias)
        self.Wo = nn.Linear(hidden, hidden, bias=bias)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend) -> torch.Tensor:
        t = x.shape[0]
        q, k, v = self.Wqkv(x).view(t, 3, self.num_heads, self.head_dim).unbind(1)
        # As HF: the rotation in float32 with cos/sin rounded to the model dtype, then back to it.
        q = apply_rotary(q.float(), cos, sin).to(x.dtype)
        k = apply_rotary(k.float(), cos, sin).to(x.dtype)
        return self.Wo(attend(q, k, v).reshape(t, -1))


class ModernBertMLP(nn.Module):
    """GeGLU: Wo(act(input) * gate), input and gate the two halves of Wi."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        hidden, inner, bias = cfg["hidden_size"], cfg["intermediate_size"], bool(cfg.get("mlp_bias", False))
        self.Wi = nn.Linear(hidden, 2 * inner, bias=bias)
        self.Wo = nn.Linear(inner, hidden, bias=bias)
        self.act = get_activation(cfg.get("hidden_activation", "gelu"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, gate = self.Wi(x).chunk(2, dim=-1)
        return self.Wo(self.act(h) * gate)


class ModernBertEncoderLayer(nn.Module):
    def __init__(self, cfg: dict[str, Any], index: int, kind: str, eps: float, norm_bias: bool) -> None:
        super().__init__()
        hidden = cfg["hidden_size"]
        self.local = kind == "sliding_attention"
        self.attn_norm = nn.Identity() if index == 0 else LayerNorm(hidden, eps=eps, bias=norm_bias)
        self.attn = ModernBertAttention(cfg)
        self.mlp_norm = LayerNorm(hidden, eps=eps, bias=norm_bias)
        self.mlp = ModernBertMLP(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin, attend)
        return x + self.mlp(self.mlp_norm(x))


class ModernBertModel(nn.Module):
    """forward(meta, backend) -> final-normed hidden states [Tb, hidden]."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        if cfg["hidden_size"] % cfg["num_attention_heads"]:
            raise ValueError("hidden_size must be a multiple of num_attention_heads")
        eps, norm_bias = float(cfg.get("norm_eps", 1e-5)), bool(cfg.get("norm_bias", False))
        kinds = layer_kinds(cfg)
        head_dim = cfg["hidden_size"] // cfg["num_attention_heads"]
        self.scale = head_dim ** -0.5
        self.window = int(cfg.get("local_attention", 128)) // 2
        self.embeddings = ModernBertEmbeddings(cfg, eps, norm_bias)
        self.layers = nn.ModuleList(ModernBertEncoderLayer(cfg, i, kind, eps, norm_bias)
                                    for i, kind in enumerate(kinds))
        self.final_norm = LayerNorm(cfg["hidden_size"], eps=eps, bias=norm_bias)
        self.rotary_global = RotaryEmbedding(head_dim, rope_theta(cfg, "full_attention"))
        self.rotary_local = RotaryEmbedding(head_dim, rope_theta(cfg, "sliding_attention"))

    def forward(self, meta: ForwardMeta, backend: AttentionBackend) -> torch.Tensor:
        x = self.embeddings(meta.input_ids)
        global_attn = AttentionContext.build(backend, meta, causal=False, scale=self.scale)
        rope = {False: self.rotary_global(meta.positions, x.dtype)}
        attend = {False: global_attn}
        if any(layer.local for layer in self.layers):
            rope[True] = self.rotary_local(meta.positions, x.dtype)
            attend[True] = self.local_attention(meta, backend)
        for layer in self.layers:
            x = layer(x, *rope[layer.local], attend[layer.local])
        return self.final_norm(x)

    def local_attention(self, meta: ForwardMeta, backend: AttentionBackend):
        """The local layers' attend(q, k, v), built once per forward and shared by them."""
        if backend.bidirectional_window:
            return AttentionContext.build(backend, meta, causal=False, scale=self.scale, window=self.window)
        band = window_band(meta, self.window)
        return lambda q, k, v: banded_attention(q, k, v, band, self.scale)
