"""Gemma 3's text decoder as an embedding model (EmbeddingGemma: bidirectional, mean pooling, then the
Dense modules of its sentence-transformers folder); no lm_head, no KV cache.

Where it differs from the Qwen3 stack, each as transformers' Gemma3TextModel computes it:
- the embeddings are scaled by sqrt(hidden), that scale first rounded to the weights' dtype;
- every RMSNorm is Gemma's, (1 + weight) in float32 with one rounding, four per layer (before and after
  attention, before and after the MLP) besides the QK-norm; a layer adds the *normed* outputs;
- the softmax scale is 1/sqrt(query_pre_attn_scalar); the MLP is GELU-tanh(gate) * up;
- local layers ("sliding_attention" in layer_types) attend within a sliding window (rose.windows, from the
  spec) and rotate with their own RoPE base (rope_local_base_freq), global ones with rope_theta.
Module paths mirror Hugging Face's; q/k/v and gate/up are fused at load as in Qwen3.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from rose.attention.base import AttentionBackend, AttentionContext
from rose.layers import GemmaRMSNorm, MergedLinear, RotaryEmbedding
from rose.layers.fused import add_rms_norm, gate_mul, precompile_qk_norm_rope, qk_norm_rope, rms_norm
from rose.meta import ForwardMeta
from rose.models.qwen3 import Qwen3Model
from rose.windows import FULL, sliding_layers

GELU_TANH = ("gelu_pytorch_tanh", "gelu_new", "gelu_fast")  # transformers' names of the tanh approximation


def rope_thetas(cfg: dict[str, Any]) -> tuple[float, float]:
    """(local, global) RoPE bases: transformers 5's per-layer-type rope_parameters, or the older
    rope_local_base_freq / rope_theta. Only the default RoPE (no scaling) is served."""
    params = cfg.get("rope_parameters") or {}
    out = []
    for kind, legacy, default in (("sliding_attention", "rope_local_base_freq", 10000.0),
                                  ("full_attention", "rope_theta", 1000000.0)):
        p = params.get(kind) or {}
        scaling = (cfg.get("rope_scaling") or {}) if kind == "full_attention" else {}
        rope_type = p.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
        if rope_type != "default":
            raise ValueError(f"unsupported rope type {rope_type!r} for {kind} layers (only the default RoPE)")
        out.append(float(p.get("rope_theta") or cfg.get(legacy) or default))
    return out[0], out[1]


class Gemma3Attention(nn.Module):
    def __init__(self, cfg: dict[str, Any], head_dim: int) -> None:
        super().__init__()
        hidden, eps = cfg["hidden_size"], cfg.get("rms_norm_eps", 1e-6)
        self.num_heads = cfg["num_attention_heads"]
        self.num_kv_heads = cfg.get("num_key_value_heads") or self.num_heads
        self.head_dim, self.eps = head_dim, eps
        bias = bool(cfg.get("attention_bias", False))
        q_size, kv_size = self.num_heads * head_dim, self.num_kv_heads * head_dim
        self.qkv_proj = MergedLinear(hidden, (q_size, kv_size, kv_size), bias=bias)
        self.o_proj = nn.Linear(q_size, hidden, bias=bias)
        self.qk_norm = "gemma"  # the fused QK step's norm (rose.layers.fused)
        self.q_norm = GemmaRMSNorm(head_dim, eps)
        self.k_norm = GemmaRMSNorm(head_dim, eps)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor,
                attn: AttentionContext) -> torch.Tensor:
        t = x.shape[0]
        qkv = self.qkv_proj(x)
        q, k = qk_norm_rope(qkv, self.q_norm.weight, self.k_norm.weight, positions, inv_freq, self.num_heads,
                            self.num_kv_heads, self.head_dim, self.eps, norm="gemma")
        v = qkv[:, (self.num_heads + self.num_kv_heads) * self.head_dim:].view(t, self.num_kv_heads, self.head_dim)
        return self.o_proj(attn(q, k, v).reshape(t, -1))


class Gemma3MLP(nn.Module):
    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        hidden, inner = cfg["hidden_size"], cfg["intermediate_size"]
        act = cfg.get("hidden_activation") or cfg.get("hidden_act") or "gelu_pytorch_tanh"
        if act not in GELU_TANH:
            raise ValueError(f"Gemma 3 with hidden_activation {act!r} is not supported (only {GELU_TANH[0]})")
        self.gate_up_proj = MergedLinear(hidden, (inner, inner), bias=False)
        self.down_proj = nn.Linear(inner, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(gate_mul(self.gate_up_proj(x), "gelu_tanh"))


class Gemma3DecoderLayer(nn.Module):
    def __init__(self, cfg: dict[str, Any], head_dim: int) -> None:
        super().__init__()
        hidden, eps = cfg["hidden_size"], cfg.get("rms_norm_eps", 1e-6)
        self.self_attn = Gemma3Attention(cfg, head_dim)
        self.mlp = Gemma3MLP(cfg)
        self.input_layernorm = GemmaRMSNorm(hidden, eps)
        self.post_attention_layernorm = GemmaRMSNorm(hidden, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(hidden, eps)
        self.post_feedforward_layernorm = GemmaRMSNorm(hidden, eps)

    def forward(self, h: torch.Tensor, residual: torch.Tensor, next_norm: GemmaRMSNorm, positions: torch.Tensor,
                inv_freq: torch.Tensor, attn: AttentionContext) -> tuple[torch.Tensor, torch.Tensor]:
        """h = input_layernorm(residual), applied by the previous step; returns (next_norm(new residual),
        new residual), each residual add fused into the norm after it."""
        a = self.self_attn(h, positions, inv_freq, attn)
        a = rms_norm(a, self.post_attention_layernorm.weight, self.post_attention_layernorm.eps, gemma=True)
        h, residual = add_rms_norm(a, residual, self.pre_feedforward_layernorm.weight,
                                   self.pre_feedforward_layernorm.eps, gemma=True)
        m = self.mlp(h)
        m = rms_norm(m, self.post_feedforward_layernorm.weight, self.post_feedforward_layernorm.eps, gemma=True)
        return add_rms_norm(m, residual, next_norm.weight, next_norm.eps, gemma=True)


class Gemma3TextModel(nn.Module):
    """forward(meta, backend) -> final-normed hidden states [Tb, hidden]."""

    FUSED = Qwen3Model.FUSED

    def __init__(self, cfg: dict[str, Any], causal: bool, windows: tuple[int, ...] = ()) -> None:
        super().__init__()
        if cfg.get("attn_logit_softcapping"):
            raise ValueError("attention logit soft-capping is not supported")
        head_dim = int(cfg.get("head_dim") or 256)
        self.local = sliding_layers("gemma3", cfg)
        if windows and len(windows) != len(self.local):
            raise ValueError(f"{len(windows)} layer windows for {len(self.local)} layers")
        self.causal, self.hidden = causal, cfg["hidden_size"]
        self.windows = tuple(windows) or (FULL,) * len(self.local)
        self.scale = float(cfg.get("query_pre_attn_scalar", 256)) ** -0.5
        self.embed_tokens = nn.Embedding(cfg["vocab_size"], self.hidden)
        self.layers = nn.ModuleList(Gemma3DecoderLayer(cfg, head_dim) for _ in self.local)
        self.norm = GemmaRMSNorm(self.hidden, cfg.get("rms_norm_eps", 1e-6))
        local_theta, global_theta = rope_thetas(cfg)
        self.rotary_local = RotaryEmbedding(head_dim, local_theta)
        self.rotary_global = RotaryEmbedding(head_dim, global_theta)

    def precompile_kernels(self) -> int:
        """Every tokens-per-program variant of the QK-norm+RoPE kernel, compiled before serving."""
        return precompile_qk_norm_rope(self.layers[0].self_attn)

    def forward(self, meta: ForwardMeta, backend: AttentionBackend) -> torch.Tensor:
        x = self.embed_tokens(meta.input_ids)
        # HF multiplies by the scale held in the weights' dtype (bf16: sqrt(768) = 27.71 becomes 27.75)
        residual = x * torch.tensor(self.hidden ** 0.5, dtype=x.dtype).item()
        attn = {w: AttentionContext.build(backend, meta, causal=self.causal, scale=self.scale, window=w)
                for w in dict.fromkeys(self.windows)}
        first = self.layers[0].input_layernorm
        h = rms_norm(residual, first.weight, first.eps, gemma=True)
        norms = [layer.input_layernorm for layer in self.layers[1:]] + [self.norm]
        for layer, next_norm, window, local in zip(self.layers, norms, self.windows, self.local):
            inv_freq = (self.rotary_local if local else self.rotary_global).inv_freq
            h, residual = layer(h, residual, next_norm, meta.positions, inv_freq, attn[window])
        return h
