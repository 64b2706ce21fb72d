"""NomicBERT (nomic-embed-text, `nomic_bert`, trust_remote_code): post-LN encoder, RoPE, SwiGLU, GPT-2 names.

The published math (nomic-ai modeling_hf_nomic_bert.py), per layer: h = norm1(x + out_proj(attention)),
out = norm2(h + mlp(h)); the MLP is fc2(fc11(x) * act(fc12(x))) for glu / swiglu / geglu (act sigmoid /
silu / exact gelu; hidden n_inner, or 8/3 n_embd, rounded up to 256) or fc2(gelu(fc1(x))). Wqkv is q, k, v
stacked. RoPE covers the first rotary_emb_fraction of each head (GPT-NeoX halves, or GPT-J pairs when
rotary_emb_interleaved), base rotary_emb_base; with rotary_emb_fraction 0 positions are learned instead.
Embeddings: word (rows padded to pad_vocab_size_multiple) + token type 0, then emb_ln. Its dynamic NTK
rotary (rotary_scaling_factor) changes the frequencies only past max_trained_positions, by the padded
batch's width: the spec caps max_length there, where the math is the plain RoPE above. Defaults are
NomicBertConfig's (and GPT2Config's under it).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from rose.attention.base import AttentionBackend, AttentionContext
from rose.layers import LayerNorm, RotaryEmbedding
from rose.meta import ForwardMeta

DEFAULTS = {"rotary_emb_fraction": 0.0, "rotary_emb_base": 1000.0, "rotary_emb_interleaved": False,
            "qkv_proj_bias": True, "mlp_fc1_bias": True, "mlp_fc2_bias": True, "type_vocab_size": 2,
            "pad_vocab_size_multiple": 1, "layer_norm_epsilon": 1e-5, "activation_function": "gelu_new",
            "n_positions": 1024}
GATED = {"glu": torch.sigmoid, "swiglu": F.silu, "geglu": F.gelu}
UNSUPPORTED = ("prenorm", "parallel_block", "rotary_emb_scale_base", "norm_mlp", "moe_every_n_layers", "causal")


def _get(cfg: dict[str, Any], key: str):
    value = cfg.get(key)
    return DEFAULTS[key] if value is None else value


def _rotate(x: torch.Tensor, interleaved: bool) -> torch.Tensor:
    if interleaved:  # pairs (x0, x1) -> (-x1, x0)
        return torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class NomicBertEmbeddings(nn.Module):
    def __init__(self, cfg: dict[str, Any], hidden: int) -> None:
        super().__init__()
        multiple = int(_get(cfg, "pad_vocab_size_multiple"))
        self.word_embeddings = nn.Embedding(-(-cfg["vocab_size"] // multiple) * multiple, hidden)
        if float(_get(cfg, "rotary_emb_fraction")) <= 0 and int(_get(cfg, "n_positions")) > 0:
            self.position_embeddings = nn.Embedding(int(_get(cfg, "n_positions")), hidden)
        if int(_get(cfg, "type_vocab_size")) > 0:
            self.token_type_embeddings = nn.Embedding(int(_get(cfg, "type_vocab_size")), hidden)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x = self.word_embeddings(input_ids)
        if hasattr(self, "token_type_embeddings"):
            x = x + self.token_type_embeddings.weight[0]
        if hasattr(self, "position_embeddings"):
            x = x + self.position_embeddings(positions)
        return x


class NomicBertAttention(nn.Module):
    def __init__(self, hidden: int, bias: bool) -> None:
        super().__init__()
        self.Wqkv = nn.Linear(hidden, 3 * hidden, bias=bias)
        self.out_proj = nn.Linear(hidden, hidden, bias=bias)


class NomicBertMLP(nn.Module):
    def __init__(self, cfg: dict[str, Any], hidden: int) -> None:
        super().__init__()
        kind, inner = _get(cfg, "activation_function"), cfg.get("n_inner")
        b1, b2 = bool(_get(cfg, "mlp_fc1_bias")), bool(_get(cfg, "mlp_fc2_bias"))
        self.gate_act = GATED.get(kind)
        if self.gate_act is not None:
            inner = inner or int(8 * hidden / 3)
            inner = -(-inner // 256) * 256  # the published gated MLP rounds its width up to 256
            self.fc11 = nn.Linear(hidden, inner, bias=b1)
            self.fc12 = nn.Linear(hidden, inner, bias=b1)
        else:  # every other activation name runs exact GELU in the published code
            self.fc1 = nn.Linear(hidden, inner or 4 * hidden, bias=b1)
        self.fc2 = nn.Linear(self.fc11.out_features if self.gate_act else self.fc1.out_features, hidden, bias=b2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_act is not None:
            return self.fc2(self.fc11(x) * self.gate_act(self.fc12(x)))
        return self.fc2(F.gelu(self.fc1(x)))


class NomicBertBlock(nn.Module):
    def __init__(self, cfg: dict[str, Any], hidden: int) -> None:
        super().__init__()
        eps = float(_get(cfg, "layer_norm_epsilon"))
        self.num_heads = cfg["n_head"]
        self.head_dim = hidden // self.num_heads
        self.attn = NomicBertAttention(hidden, bool(_get(cfg, "qkv_proj_bias")))
        self.mlp = NomicBertMLP(cfg, hidden)
        self.norm1 = LayerNorm(hidden, eps=eps)
        self.norm2 = LayerNorm(hidden, eps=eps)

    def forward(self, x: torch.Tensor, rotate, attn: AttentionContext) -> torch.Tensor:
        t = x.shape[0]
        q, k, v = self.attn.Wqkv(x).view(t, 3, self.num_heads, self.head_dim).unbind(1)
        q, k = rotate(q), rotate(k)
        h = self.norm1(x + self.attn.out_proj(attn(q, k, v).reshape(t, -1)))
        return self.norm2(h + self.mlp(h))


class NomicBertEncoder(nn.Module):
    def __init__(self, cfg: dict[str, Any], hidden: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(NomicBertBlock(cfg, hidden) for _ in range(cfg["n_layer"]))


class NomicBertModel(nn.Module):
    """forward(meta, backend) -> last hidden states [Tb, n_embd] (the layers end post-LN)."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        hidden, heads = cfg["n_embd"], cfg["n_head"]
        if hidden % heads:
            raise ValueError("n_embd must be a multiple of n_head")
        for key in UNSUPPORTED:
            if cfg.get(key):
                raise ValueError(f"{key}={cfg[key]!r} is not supported")
        head_dim = hidden // heads
        self.scale = head_dim ** -0.5
        self.rotary_dim = int(head_dim * float(_get(cfg, "rotary_emb_fraction")))
        self.interleaved = bool(_get(cfg, "rotary_emb_interleaved"))
        self.embeddings = NomicBertEmbeddings(cfg, hidden)
        self.emb_ln = LayerNorm(hidden, eps=float(_get(cfg, "layer_norm_epsilon")))
        self.encoder = NomicBertEncoder(cfg, hidden)
        self.rotary = RotaryEmbedding(self.rotary_dim, float(_get(cfg, "rotary_emb_base"))) if self.rotary_dim else None

    def _rotation(self, positions: torch.Tensor, dtype: torch.dtype):
        if self.rotary is None:
            return lambda x: x
        freqs = positions.to(torch.float32)[:, None] * self.rotary.inv_freq[None, :]  # [T, rotary_dim / 2]
        # cos/sin in the model dtype, as the published cache: halves repeated (NeoX), or each one twice (GPT-J)
        cos, sin = freqs.cos().to(dtype), freqs.sin().to(dtype)
        cos, sin = ((c.repeat_interleave(2, -1) if self.interleaved else torch.cat((c, c), -1))[:, None, :]
                    for c in (cos, sin))
        r = self.rotary_dim

        def rotate(x: torch.Tensor) -> torch.Tensor:
            part = x[..., :r]
            return torch.cat((part * cos + _rotate(part, self.interleaved) * sin, x[..., r:]), dim=-1)

        return rotate

    def forward(self, meta: ForwardMeta, backend: AttentionBackend) -> torch.Tensor:
        x = self.emb_ln(self.embeddings(meta.input_ids, meta.positions))
        attn = AttentionContext.build(backend, meta, causal=False, scale=self.scale)
        rotate = self._rotation(meta.positions, x.dtype)
        for layer in self.encoder.layers:
            x = layer(x, rotate, attn)
        return x
