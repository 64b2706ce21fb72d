"""DistilBERT: BERT's post-LN encoder under its own names (dim, n_heads, n_layers, hidden_dim; q_lin...).

Absolute positions (learned, or sinusoidal ones stored in the checkpoint all the same), no token types,
LayerNorm eps 1e-12 (fixed in HF's code). Module paths mirror Hugging Face's DistilBertModel;
`attention.qkv_proj` is q_lin, k_lin and v_lin concatenated at load.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from rose.attention.base import AttentionBackend, AttentionContext
from rose.layers import LayerNorm, MergedLinear, embed_layer_norm, get_activation
from rose.meta import ForwardMeta

EPS = 1e-12


class Embeddings(nn.Module):
    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(cfg["vocab_size"], cfg["dim"])
        self.position_embeddings = nn.Embedding(cfg["max_position_embeddings"], cfg["dim"])
        self.LayerNorm = LayerNorm(cfg["dim"], eps=EPS)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        norm = self.LayerNorm  # word + position, then the norm (one kernel: ROSE_ENCODER_NORMS)
        return embed_layer_norm(input_ids, positions, None, self.word_embeddings.weight,
                                self.position_embeddings.weight, None, norm.weight, norm.bias, norm.eps)


class DistilBertSelfAttention(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.qkv_proj = MergedLinear(dim, (dim, dim, dim), bias=True)
        self.out_lin = nn.Linear(dim, dim)


class FFN(nn.Module):
    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        self.lin1 = nn.Linear(cfg["dim"], cfg["hidden_dim"])
        self.lin2 = nn.Linear(cfg["hidden_dim"], cfg["dim"])
        self.act = get_activation(cfg.get("activation", "gelu"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin2(self.act(self.lin1(x)))


class TransformerBlock(nn.Module):
    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        self.num_heads = cfg["n_heads"]
        self.head_dim = cfg["dim"] // self.num_heads
        self.attention = DistilBertSelfAttention(cfg["dim"])
        self.sa_layer_norm = LayerNorm(cfg["dim"], eps=EPS)
        self.ffn = FFN(cfg)
        self.output_layer_norm = LayerNorm(cfg["dim"], eps=EPS)

    def forward(self, x: torch.Tensor, attn: AttentionContext) -> torch.Tensor:
        t = x.shape[0]
        q, k, v = self.attention.qkv_proj.forward_split(x)
        shape = (t, self.num_heads, self.head_dim)
        a = attn(q.view(shape), k.view(shape), v.view(shape)).reshape(t, -1)
        x = self.sa_layer_norm.add_forward(self.attention.out_lin(a), x)
        return self.output_layer_norm.add_forward(self.ffn(x), x)


class Transformer(nn.Module):
    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        self.layer = nn.ModuleList(TransformerBlock(cfg) for _ in range(cfg["n_layers"]))


class DistilBertModel(nn.Module):
    """The encoder: forward(meta, backend) -> last hidden states [Tb, dim]."""

    FUSED = {"attention.qkv_proj": ("attention.q_lin", "attention.k_lin", "attention.v_lin")}

    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        if cfg["dim"] % cfg["n_heads"]:
            raise ValueError("dim must be a multiple of n_heads")
        self.scale = (cfg["dim"] // cfg["n_heads"]) ** -0.5
        self.embeddings = Embeddings(cfg)
        self.transformer = Transformer(cfg)

    def forward(self, meta: ForwardMeta, backend: AttentionBackend) -> torch.Tensor:
        x = self.embeddings(meta.input_ids, meta.positions)
        attn = AttentionContext.build(backend, meta, causal=False, scale=self.scale)
        for layer in self.transformer.layer:
            x = layer(x, attn)
        return x
