"""MPNet (all-mpnet-base-v2): BERT's post-LN layers plus a relative position bias on every attention score.

The bias is one learned scalar per head and relative-position bucket (T5-style: 32 buckets, exact up to 8
positions each way, log-spaced up to 128), shared by all layers, added to q.k / sqrt(d). A backend whose kernel
adds such a bias (`position_bias`: ROSE's Triton kernel, given the bias per head and distance -128..128, past
which the buckets are constant, computed once) runs it ragged; with any other backend attention is the
banded path (rose.attention.banded): ragged, fixed shapes, one bias mask per forward. auto takes triton where it
runs (2.1 × the banded path's documents a second on the H200, benchmarks/NOTES.md); a serving profile that mixes
backends (PerBucketBackend) has no forward_biased and keeps the banded path. Absolute positions start after the
padding index (fairseq, as RoBERTa): token i of a sequence uses row i + 2. Module paths mirror Hugging Face's MPNetModel; `attention.attn.qkv_proj` is
q, k and v concatenated at load. A pad id inside a text: rose.models.bert.fairseq_positions, as HF.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from rose.attention.banded import banded_attention, biased_band
from rose.attention.base import AttentionBackend
from rose.layers import LayerNorm, MergedLinear, embed_layer_norm, get_activation
from rose.meta import ForwardMeta
from rose.models.bert import BertDenseNorm, BertIntermediate, fairseq_positions

PADDING_IDX = 1  # MPNet's embeddings fix it (whatever the config's pad_token_id)
NUM_BUCKETS = 32  # HF's compute_position_bias always buckets into 32
MAX_DISTANCE = 128


def relative_position_bucket(relative: torch.Tensor) -> torch.Tensor:
    """Bucket of key position - query position: 0..15 for keys before or at the query, 16..31 after."""
    half = NUM_BUCKETS // 2
    exact = half // 2
    n = -relative
    side = (n < 0).to(torch.long) * half
    n = n.abs()
    large = exact + (torch.log(n.float().clamp(min=1) / exact) / math.log(MAX_DISTANCE / exact)
                     * (half - exact)).to(torch.long)
    return side + torch.where(n < exact, n, large.clamp(max=half - 1))


class MPNetEmbeddings(nn.Module):
    def __init__(self, cfg: dict[str, Any], hidden: int) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(cfg["vocab_size"], hidden)
        self.position_embeddings = nn.Embedding(cfg["max_position_embeddings"], hidden)
        self.LayerNorm = LayerNorm(hidden, eps=cfg.get("layer_norm_eps", 1e-12))

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        positions = fairseq_positions(input_ids, positions, PADDING_IDX)
        norm = self.LayerNorm  # word + position, then the norm (one kernel: ROSE_ENCODER_NORMS)
        return embed_layer_norm(input_ids, positions, None, self.word_embeddings.weight,
                                self.position_embeddings.weight, None, norm.weight, norm.bias, norm.eps)


class MPNetSelfAttention(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.qkv_proj = MergedLinear(hidden, (hidden, hidden, hidden), bias=True)
        self.o = nn.Linear(hidden, hidden)


class MPNetAttention(nn.Module):
    def __init__(self, hidden: int, eps: float) -> None:
        super().__init__()
        self.attn = MPNetSelfAttention(hidden)
        self.LayerNorm = LayerNorm(hidden, eps=eps)


class MPNetLayer(nn.Module):
    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        hidden, eps = cfg["hidden_size"], cfg.get("layer_norm_eps", 1e-12)
        self.num_heads = cfg["num_attention_heads"]
        self.head_dim = hidden // self.num_heads
        self.attention = MPNetAttention(hidden, eps)
        self.intermediate = BertIntermediate(hidden, cfg["intermediate_size"])
        self.output = BertDenseNorm(cfg["intermediate_size"], hidden, eps)
        self.act = get_activation(cfg.get("hidden_act", "gelu"))

    def forward(self, x: torch.Tensor, attend) -> torch.Tensor:
        t = x.shape[0]
        attn = self.attention.attn
        q, k, v = attn.qkv_proj.forward_split(x)
        shape = (t, self.num_heads, self.head_dim)
        a = attend(q.view(shape), k.view(shape), v.view(shape)).reshape(t, -1)
        x = self.attention.LayerNorm.add_forward(attn.o(a), x)
        return self.output(self.act(self.intermediate.dense(x)), x)


class MPNetEncoder(nn.Module):
    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        self.layer = nn.ModuleList(MPNetLayer(cfg) for _ in range(cfg["num_hidden_layers"]))
        self.relative_attention_bias = nn.Embedding(NUM_BUCKETS, cfg["num_attention_heads"])


class MPNetModel(nn.Module):
    """forward(meta, backend) -> last hidden states [Tb, hidden]; the backend serves attention only when it adds
    the position bias itself (see above)."""

    FUSED = {"attention.attn.qkv_proj": ("attention.attn.q", "attention.attn.k", "attention.attn.v")}

    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        if cfg["hidden_size"] % cfg["num_attention_heads"]:
            raise ValueError("hidden_size must be a multiple of num_attention_heads")
        if int(cfg.get("relative_attention_num_buckets", NUM_BUCKETS)) != NUM_BUCKETS:
            raise ValueError(f"relative_attention_num_buckets must be {NUM_BUCKETS} (what MPNet's bias uses)")
        self.scale = (cfg["hidden_size"] // cfg["num_attention_heads"]) ** -0.5
        self.max_length = int(cfg["max_position_embeddings"]) - PADDING_IDX - 1
        self.embeddings = MPNetEmbeddings(cfg, cfg["hidden_size"])
        self.encoder = MPNetEncoder(cfg)
        self._distance_bias: dict[torch.device, torch.Tensor] = {}  # distance_bias(), per device

    def distance_bias(self, device: torch.device) -> torch.Tensor:
        """float32 [heads, 2 * MAX_DISTANCE + 1]: each head's bias for key - query = -128 .. 128 (the buckets are
        constant past it). The same for every batch: made once per device, outside any graph capture (one made
        during a capture lives in the graph's pool and is not kept)."""
        bias = self._distance_bias.get(device)
        if bias is None:
            dist = torch.arange(-MAX_DISTANCE, MAX_DISTANCE + 1, device=device)
            bias = self.encoder.relative_attention_bias(relative_position_bucket(dist)).float().t().contiguous()
            if not (device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
                self._distance_bias[device] = bias
        return bias

    def forward(self, meta: ForwardMeta, backend: AttentionBackend) -> torch.Tensor:
        x = self.embeddings(meta.input_ids, meta.positions)
        if backend.position_bias:  # a ragged kernel that adds the bias itself (triton)
            bias = self.distance_bias(x.device)
            for layer in self.encoder.layer:
                x = layer(x, lambda q, k, v: backend.forward_biased(q, k, v, meta, self.scale, bias))
            return x
        reach = max(0, min(meta.max_seqlen, self.max_length) - 1)  # real sequences are at most max_length long
        table = self.encoder.relative_attention_bias
        band = biased_band(meta, reach, lambda dist: table(relative_position_bucket(dist)), x.dtype)
        for layer in self.encoder.layer:
            x = layer(x, lambda q, k, v: banded_attention(q, k, v, band, self.scale))
        return x
