"""Qwen3 as an embedding model: RMSNorm, QK-norm, RoPE, GQA, SwiGLU; no lm_head, no KV cache.

Causal (Qwen3-Embedding, last-token pooling) or bidirectional (pplx-embed: every layer non-causal),
per the spec. Module paths mirror Hugging Face's Qwen3Model; `self_attn.qkv_proj` and `mlp.gate_up_proj`
are fused at load from q/k/v_proj and gate/up_proj.

The same stack serves the Llama-style decoders that differ from Qwen3 only in what DecoderOptions names:
Qwen2 (gte-Qwen2: biases on q/k/v, none on o, no QK-norm) and Mistral (e5-mistral: no biases, no QK-norm).
Sliding windows come per layer from the spec (rose.windows); layers of one window share one attention
context (SDPA builds one mask per window, not per layer).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from rose.attention.base import AttentionBackend, AttentionContext
from rose.layers import MergedLinear, RMSNorm, RotaryEmbedding, gate_up_act
from rose.layers.fused import (
    add_rms_norm,
    precompile_qk_norm_rope,
    qk_norm_rope,
    rms_norm,
    silu_mul,
)
from rose.meta import ForwardMeta
from rose.windows import FULL


def rope_theta(cfg: dict[str, Any]) -> float:
    params = cfg.get("rope_parameters") or {}
    scaling = cfg.get("rope_scaling") or {}
    kind = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    if kind != "default":
        raise ValueError(f"unsupported rope type {kind!r} (only the default RoPE)")
    return float(cfg.get("rope_theta") or params.get("rope_theta") or 10000.0)


@dataclass(frozen=True)
class DecoderOptions:
    """Where a Llama-style decoder differs from Qwen3 (transformers hard-codes these per model class)."""

    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = True

    @classmethod
    def for_family(cls, family: str, cfg: dict[str, Any]) -> DecoderOptions:
        if family == "qwen2":
            return cls(qkv_bias=True, o_bias=False, qk_norm=False)
        if family == "mistral":
            return cls(qkv_bias=False, o_bias=False, qk_norm=False)
        bias = bool(cfg.get("attention_bias", False))  # Qwen3 and pplx-embed
        return cls(qkv_bias=bias, o_bias=bias, qk_norm=True)


class Qwen3Attention(nn.Module):
    def __init__(self, cfg: dict[str, Any], head_dim: int, options: DecoderOptions = DecoderOptions()) -> None:
        super().__init__()
        hidden, eps = cfg["hidden_size"], cfg.get("rms_norm_eps", 1e-6)
        self.num_heads = cfg["num_attention_heads"]
        self.num_kv_heads = cfg.get("num_key_value_heads") or self.num_heads
        self.head_dim = head_dim
        q_size, kv_size = self.num_heads * head_dim, self.num_kv_heads * head_dim
        self.qkv_proj = MergedLinear(hidden, (q_size, kv_size, kv_size), bias=options.qkv_bias)
        self.o_proj = nn.Linear(q_size, hidden, bias=options.o_bias)
        self.qk_norm = "rms" if options.qk_norm else None  # the fused QK step's norm (rose.layers.fused)
        self.q_norm = RMSNorm(head_dim, eps) if options.qk_norm else None
        self.k_norm = RMSNorm(head_dim, eps) if options.qk_norm else None
        self.eps = eps

    def forward(self, x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor,
                attn: AttentionContext) -> torch.Tensor:
        t = x.shape[0]
        weights = (None, None) if self.q_norm is None else (self.q_norm.weight, self.k_norm.weight)
        qkv = self.qkv_proj(x)
        q, k = qk_norm_rope(qkv, *weights, positions, inv_freq, self.num_heads, self.num_kv_heads, self.head_dim,
                            self.eps, norm=self.qk_norm)
        v = qkv[:, (self.num_heads + self.num_kv_heads) * self.head_dim:].view(t, self.num_kv_heads, self.head_dim)
        out = attn(q, k, v)
        return self.o_proj(out.reshape(t, -1))


class Qwen3MLP(nn.Module):
    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        hidden, inner = cfg["hidden_size"], cfg["intermediate_size"]
        self.gate_up_proj = MergedLinear(hidden, (inner, inner), bias=False)
        self.down_proj = nn.Linear(inner, hidden, bias=False)
        if cfg.get("hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act {cfg.get('hidden_act')!r} is not supported here (only silu)")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # from 2048 tokens on Hopper: SiLU·mul in gate-up's epilogue (rose.layers.gate_up_act, ROSE_GATE_UP_SILU)
        h = gate_up_act.fused_or_none(x, self.gate_up_proj.weight)
        return self.down_proj(h if h is not None else silu_mul(self.gate_up_proj(x)))


class Qwen3DecoderLayer(nn.Module):
    def __init__(self, cfg: dict[str, Any], head_dim: int, options: DecoderOptions = DecoderOptions()) -> None:
        super().__init__()
        eps = cfg.get("rms_norm_eps", 1e-6)
        self.self_attn = Qwen3Attention(cfg, head_dim, options)
        self.mlp = Qwen3MLP(cfg)
        self.input_layernorm = RMSNorm(cfg["hidden_size"], eps)
        self.post_attention_layernorm = RMSNorm(cfg["hidden_size"], eps)

    def forward(self, h: torch.Tensor, residual: torch.Tensor, next_norm: RMSNorm, positions: torch.Tensor,
                inv_freq: torch.Tensor, attn: AttentionContext) -> tuple[torch.Tensor, torch.Tensor]:
        """h = this layer's input_layernorm(residual), already applied by the previous step. Returns
        (next_norm(new residual), new residual): each residual add is fused into the norm after it."""
        a = self.self_attn(h, positions, inv_freq, attn)
        h, residual = add_rms_norm(a, residual, self.post_attention_layernorm.weight, self.post_attention_layernorm.eps)
        m = self.mlp(h)
        return add_rms_norm(m, residual, next_norm.weight, next_norm.eps)


class Qwen3Model(nn.Module):
    """forward(meta, backend) -> final-normed hidden states [Tb, hidden]."""

    FUSED = {
        "self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
        "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
    }

    def __init__(self, cfg: dict[str, Any], causal: bool, options: DecoderOptions | None = None,
                 windows: tuple[int, ...] = ()) -> None:
        """options: None = Qwen3's (DecoderOptions.for_family); windows: per layer (rose.windows), () = none."""
        super().__init__()
        options = options or DecoderOptions.for_family("qwen3", cfg)
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
        layers = cfg["num_hidden_layers"]
        if windows and len(windows) != layers:
            raise ValueError(f"{len(windows)} layer windows for {layers} layers")
        self.causal = causal
        self.windows = tuple(windows) or (FULL,) * layers
        self.scale = head_dim ** -0.5
        self.embed_tokens = nn.Embedding(cfg["vocab_size"], cfg["hidden_size"])
        self.layers = nn.ModuleList(Qwen3DecoderLayer(cfg, head_dim, options) for _ in range(layers))
        self.norm = RMSNorm(cfg["hidden_size"], cfg.get("rms_norm_eps", 1e-6))
        self.rotary = RotaryEmbedding(head_dim, rope_theta(cfg))

    def precompile_kernels(self) -> int:
        """Every tokens-per-program variant of the QK-norm+RoPE kernel and the fused gate-up's routed variants,
        compiled before serving."""
        attn = self.layers[0].self_attn
        return precompile_qk_norm_rope(attn) + gate_up_act.precompile(self.layers[0].mlp.gate_up_proj.weight)

    # rose.layers.persistent_decoder.PersistentDecoder once the engine's warm-up enabled it (ROSE_PERSISTENT_DECODER,
    # default auto): every layer of a batch of up to its routed bound in one kernel, for forwards with its backend
    # (the runner's, not the express lane's); forward_layers (bulk stepped by layers) never uses it
    persistent = None

    def forward(self, meta: ForwardMeta, backend: AttentionBackend) -> torch.Tensor:
        p = self.persistent
        if p is not None and backend is p.backend and p.fits(meta.layout.tokens):
            return p(self.embed_tokens(meta.input_ids), meta.positions, meta.seq_ids)
        for h in self.forward_layers(meta, backend):
            pass
        return h

    def forward_layers(self, meta: ForwardMeta, backend: AttentionBackend) -> Iterator[torch.Tensor]:
        """forward, one decoder layer's kernels per step: yields after each layer (the last yield is the final
        hidden states), so a caller may put other work on the stream between layers (rose.layer_steps)."""
        residual = self.embed_tokens(meta.input_ids)
        attn = {w: AttentionContext.build(backend, meta, causal=self.causal, scale=self.scale, window=w)
                for w in dict.fromkeys(self.windows)}
        first = self.layers[0].input_layernorm
        h = rms_norm(residual, first.weight, first.eps)
        norms = [layer.input_layernorm for layer in self.layers[1:]] + [self.norm]
        for layer, next_norm, window in zip(self.layers, norms, self.windows):
            h, residual = layer(h, residual, next_norm, meta.positions, self.rotary.inv_freq, attn[window])
            yield h
