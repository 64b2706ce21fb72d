"""BERT, RoBERTa and XLM-RoBERTa encoders: absolute positions, token types, post-LN, GELU.

Module paths mirror Hugging Face's, so loading is a name map; the only difference is the fused
`attention.self.qkv_proj` (query, key and value concatenated at load). RoBERTa/XLM-R positions start
after the padding index (fairseq): `position_offset = pad_token_id + 1`. HF derives them from the ids: a token
with the pad id (a text holding "<pad>", which the tokenizer matches as that token) gets the padding position and
is not counted in the positions after it; fairseq_positions does the same on packed sequences.
Token types: type 0 everywhere (one row added to every token) unless built with `token_types=True` (BERT
cross-encoders: a pair's second text is type 1), which looks up each token's type from the batch.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from rose.attention.base import AttentionBackend, AttentionContext
from rose.layers import LayerNorm, MergedLinear, embed_layer_norm, get_activation
from rose.meta import ForwardMeta


def fairseq_positions(input_ids: torch.Tensor, positions: torch.Tensor, padding_idx: int) -> torch.Tensor:
    """HF's create_position_ids_from_input_ids (RoBERTa, XLM-R, MPNet) on packed sequences: a token with the id
    `padding_idx` gets position padding_idx, any other padding_idx + 1 + the tokens before it in its sequence
    that are not padding_idx. positions: each token's index within its own sequence (ForwardMeta.positions)."""
    pad = (input_ids == padding_idx).long()
    seen = torch.cumsum(pad, 0)  # pad ids up to each token, over the packed batch
    start = torch.arange(positions.shape[0], device=positions.device) - positions  # its sequence's first token
    before = seen - seen[start] + pad[start]  # pad ids in its sequence up to it
    return torch.where(pad.bool(), padding_idx, positions - before + padding_idx + 1)


class BertEmbeddings(nn.Module):
    def __init__(self, cfg: dict[str, Any], hidden: int) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(cfg["vocab_size"], hidden)
        self.position_embeddings = nn.Embedding(cfg["max_position_embeddings"], hidden)
        self.token_type_embeddings = nn.Embedding(max(1, cfg.get("type_vocab_size", 2)), hidden)
        self.LayerNorm = LayerNorm(hidden, eps=cfg.get("layer_norm_eps", 1e-12))

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                token_types: torch.Tensor | None = None) -> torch.Tensor:
        norm = self.LayerNorm  # word + type, then + position, then the norm (one kernel: ROSE_ENCODER_NORMS)
        return embed_layer_norm(input_ids, positions, token_types, self.word_embeddings.weight,
                                self.position_embeddings.weight, self.token_type_embeddings.weight, norm.weight,
                                norm.bias, norm.eps)


class BertSelfAttention(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.qkv_proj = MergedLinear(hidden, (hidden, hidden, hidden), bias=True)


class BertDenseNorm(nn.Module):
    """`dense` then LayerNorm(dense(x) + residual): HF's BertSelfOutput and BertOutput."""

    def __init__(self, d_in: int, hidden: int, eps: float) -> None:
        super().__init__()
        self.dense = nn.Linear(d_in, hidden)
        self.LayerNorm = LayerNorm(hidden, eps=eps)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm.add_forward(self.dense(x), residual)


class BertAttention(nn.Module):
    def __init__(self, hidden: int, eps: float) -> None:
        super().__init__()
        self.add_module("self", BertSelfAttention(hidden))  # HF's name; `self` is not a Python attribute here
        self.output = BertDenseNorm(hidden, hidden, eps)


class BertIntermediate(nn.Module):
    def __init__(self, hidden: int, inner: int) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden, inner)


class BertLayer(nn.Module):
    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        hidden, eps = cfg["hidden_size"], cfg.get("layer_norm_eps", 1e-12)
        self.num_heads = cfg["num_attention_heads"]
        self.head_dim = hidden // self.num_heads
        self.attention = BertAttention(hidden, eps)
        self.intermediate = BertIntermediate(hidden, cfg["intermediate_size"])
        self.output = BertDenseNorm(cfg["intermediate_size"], hidden, eps)
        self.act = get_activation(cfg.get("hidden_act", "gelu"))

    def forward(self, x: torch.Tensor, attn: AttentionContext) -> torch.Tensor:
        t = x.shape[0]
        q, k, v = self.attention._modules["self"].qkv_proj.forward_split(x)
        shape = (t, self.num_heads, self.head_dim)
        a = attn(q.view(shape), k.view(shape), v.view(shape)).reshape(t, -1)
        x = self.attention.output(a, x)
        return self.output(self.act(self.intermediate.dense(x)), x)


class BertEncoder(nn.Module):
    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(cfg) for _ in range(cfg["num_hidden_layers"]))


class BertModel(nn.Module):
    """The encoder without pooler: forward(meta, backend) -> last hidden states [Tb, hidden]."""

    FUSED = {"attention.self.qkv_proj": ("attention.self.query", "attention.self.key", "attention.self.value")}

    def __init__(self, cfg: dict[str, Any], position_offset: int = 0, token_types: bool = False) -> None:
        super().__init__()
        self.token_types = token_types
        if cfg.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError(f"unsupported position_embedding_type {cfg['position_embedding_type']!r}")
        if cfg["hidden_size"] % cfg["num_attention_heads"]:
            raise ValueError("hidden_size must be a multiple of num_attention_heads")
        self.position_offset = position_offset
        self.scale = (cfg["hidden_size"] // cfg["num_attention_heads"]) ** -0.5
        self.embeddings = BertEmbeddings(cfg, cfg["hidden_size"])
        self.encoder = BertEncoder(cfg)

    # rose.layers.persistent_decoder.PersistentDecoder once the engine's warm-up enabled it (ROSE_PERSISTENT_DECODER,
    # default auto): every layer of a batch of up to its routed bound in one kernel, for forwards with its backend
    # (the runner's)
    persistent = None

    def forward(self, meta: ForwardMeta, backend: AttentionBackend) -> torch.Tensor:
        positions = (fairseq_positions(meta.input_ids, meta.positions, self.position_offset - 1)
                     if self.position_offset else meta.positions)
        x = self.embeddings(meta.input_ids, positions, meta.token_types if self.token_types else None)
        p = self.persistent
        if p is not None and backend is p.backend and p.fits(meta.layout.tokens):
            return p(x, positions, meta.seq_ids)
        attn = AttentionContext.build(backend, meta, causal=False, scale=self.scale)
        for layer in self.encoder.layer:
            x = layer(x, attn)
        return x
