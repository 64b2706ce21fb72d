"""Tiny random folders of trust_remote_code families (GTE v1.5 `NewModel`; NomicBERT in rose_tiny_nomic),
with references written here.

transformers has no GTE v1.5: the reference is this file's own padded implementation of the published math
(Alibaba-NLP/new-impl modeling.py, read, not copied): embeddings (+ token type 0) -> LayerNorm; per layer
attn_ln(x + o_proj(softmax(rope(q) rope(k)^T / sqrt(d) + mask) v)) then mlp_ln(h + down(act(gate) * up));
RoPE from a cos/sin table built for factor x max_position_embeddings positions with NTK-scaled frequencies.
The folders are in the published layout: config.json with model_type "new", NewModel and its auto_map,
the published tensor names, a BERT WordPiece tokenizer.json and sentence-transformers files (CLS pooling).
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from types import SimpleNamespace

import torch
from rose_tiny_models import VOCAB, TinyModel, _bert_tokenizer, _randomize, _write_json, _write_st_files
from torch import nn

GTE_AUTO_MAP = {"AutoConfig": "Alibaba-NLP/new-impl--configuration.NewConfig",
                "AutoModel": "Alibaba-NLP/new-impl--modeling.NewModel"}


class _RefRMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        h = x.float()
        return self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


def _reference_table(cfg: dict, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [positions, head_dim] as the published rotary module caches them (float32)."""
    base = float(cfg["rope_theta"])
    scaling = cfg.get("rope_scaling")
    positions = cfg["max_position_embeddings"]
    inv = 1.0 / base ** (torch.arange(0, head_dim, 2).float() / head_dim)
    if scaling:
        factor, mixed_b = float(scaling["factor"]), scaling.get("mixed_b")
        positions = int(positions * factor)
        if positions > cfg["max_position_embeddings"]:
            if mixed_b is None:
                inv = 1.0 / (base * factor) ** (torch.arange(0, head_dim, 2).float() / head_dim)
                inv = inv / factor ** (2 / head_dim)
            else:
                lam = torch.exp(math.log(factor) / (head_dim / 2) ** mixed_b
                                * torch.arange(1, head_dim // 2 + 1).float() ** mixed_b)
                inv = inv / lam
    angles = torch.outer(torch.arange(positions, dtype=torch.float32), inv)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


class GteReference(nn.Module):
    """NewModel on a right-padded batch: forward(input_ids, attention_mask).last_hidden_state."""

    def __init__(self, cfg: dict) -> None:
        super().__init__()
        self.cfg, self.config = cfg, SimpleNamespace(vocab_size=cfg["vocab_size"])
        hidden, inner = cfg["hidden_size"], cfg["intermediate_size"]
        self.heads, self.head_dim = cfg["num_attention_heads"], hidden // cfg["num_attention_heads"]
        norm = (lambda: _RefRMSNorm(hidden, cfg["layer_norm_eps"])) if cfg["layer_norm_type"] == "rms_norm" else (
            lambda: nn.LayerNorm(hidden, eps=cfg["layer_norm_eps"]))
        emb = nn.Module()
        emb.word_embeddings = nn.Embedding(cfg["vocab_size"], hidden)
        if cfg["type_vocab_size"] > 0:
            emb.token_type_embeddings = nn.Embedding(cfg["type_vocab_size"], hidden)
        emb.LayerNorm = nn.LayerNorm(hidden, eps=cfg["layer_norm_eps"])
        self.embeddings = emb
        layers = nn.ModuleList()
        for _ in range(cfg["num_hidden_layers"]):
            layer, attn, mlp = nn.Module(), nn.Module(), nn.Module()
            if cfg["pack_qkv"]:
                attn.qkv_proj = nn.Linear(hidden, 3 * hidden)
            else:
                attn.q_proj, attn.k_proj, attn.v_proj = (nn.Linear(hidden, hidden) for _ in range(3))
            attn.o_proj = nn.Linear(hidden, hidden)
            mlp.up_gate_proj = nn.Linear(hidden, 2 * inner, bias=False)
            mlp.down_proj = nn.Linear(inner, hidden)
            layer.attention, layer.mlp, layer.attn_ln, layer.mlp_ln = attn, mlp, norm(), norm()
            layers.append(layer)
        self.encoder = nn.Module()
        self.encoder.layer = layers
        cos, sin = _reference_table(cfg, self.head_dim)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def _rope(self, x, cos, sin):  # x [B, L, H, D]
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rotated * sin

    def forward(self, input_ids, attention_mask):
        b, n = input_ids.shape
        emb = self.embeddings
        x = emb.word_embeddings(input_ids)
        if hasattr(emb, "token_type_embeddings"):
            x = x + emb.token_type_embeddings(torch.zeros_like(input_ids))
        x = emb.LayerNorm(x)
        cos = self.cos[:n].to(x.dtype)[None, :, None, :]
        sin = self.sin[:n].to(x.dtype)[None, :, None, :]
        bias = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
        for layer in self.encoder.layer:
            a = layer.attention
            if self.cfg["pack_qkv"]:
                q, k, v = a.qkv_proj(x).split(self.heads * self.head_dim, dim=-1)
            else:
                q, k, v = a.q_proj(x), a.k_proj(x), a.v_proj(x)
            q, k, v = (t.view(b, n, self.heads, self.head_dim) for t in (q, k, v))
            q, k = self._rope(q, cos, sin), self._rope(k, cos, sin)
            scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(self.head_dim) + bias
            ctx = torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v).reshape(b, n, -1)
            h = layer.attn_ln(x + a.o_proj(ctx))
            up, gate = layer.mlp.up_gate_proj(h).split(self.cfg["intermediate_size"], dim=-1)
            x = layer.mlp_ln(h + layer.mlp.down_proj(nn.functional.gelu(gate) * up))
        return SimpleNamespace(last_hidden_state=x)


def gte_config(**overrides) -> dict:
    """config.json of a tiny gte-base-en-v1.5 (its published fields and values, narrower and shorter)."""
    cfg = {"architectures": ["NewModel"], "auto_map": GTE_AUTO_MAP, "model_type": "new", "vocab_size": VOCAB,
           "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 96,
           "hidden_act": "gelu", "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.0,
           "max_position_embeddings": 128, "type_vocab_size": 0, "initializer_range": 0.02,
           "layer_norm_type": "layer_norm", "layer_norm_eps": 1e-12, "position_embedding_type": "rope",
           "rope_theta": 500.0, "rope_scaling": {"factor": 2.0, "type": "ntk"}, "classifier_dropout": None,
           "pack_qkv": True, "unpad_inputs": False, "use_memory_efficient_attention": False,
           "logn_attention_scale": False, "logn_attention_clip1": False, "pad_token_id": 0, "torch_dtype": "float32"}
    cfg.update(overrides)
    return cfg


def build_gte(root: Path, name: str = "tiny-gte", seed: int = 31, std: float = 0.1, **overrides) -> TinyModel:
    from safetensors.torch import save_file

    path = root / name
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    cfg = gte_config(**overrides)
    torch.manual_seed(seed)
    ref = GteReference(cfg)
    _randomize(ref, seed, std)
    ref.eval()
    _write_json(path / "config.json", cfg)
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, str(path / "model.safetensors"))
    _bert_tokenizer(path)
    tok_config = path / "tokenizer_config.json"
    _write_json(tok_config, {**json.loads(tok_config.read_text()), "model_max_length": cfg["max_position_embeddings"]})
    _write_st_files(path, cfg["hidden_size"], "cls", True, cfg["max_position_embeddings"])
    return TinyModel(name, path, ref, 0, False, "cls", True, False)


REMOTE_FAMILIES = ("gte", "gte-variant", "nomic", "nomic-variant")


def build_remote(root: Path) -> dict[str, TinyModel]:
    """gte-base-en-v1.5's layout and mGTE-like variations (token types, RMSNorm, separate q/k/v, mixed NTK);
    nomic-embed-text-v1.5's and a variation (half the head rotated in GPT-J pairs, plain GELU MLP, biases,
    dynamic NTK configured: served up to max_trained_positions)."""
    from rose_tiny_nomic import build_nomic

    return {"gte": build_gte(root),
            "gte-variant": build_gte(root, name="tiny-gte-variant", seed=32, type_vocab_size=1,
                                     layer_norm_type="rms_norm", pack_qkv=False,
                                     rope_scaling={"factor": 4.0, "type": "ntk", "mixed_b": 0.5}),
            "nomic": build_nomic(root),
            "nomic-variant": build_nomic(root, name="tiny-nomic-variant", seed=42, rotary_emb_fraction=0.5,
                                         rotary_emb_interleaved=True, activation_function="gelu", n_inner=128,
                                         qkv_proj_bias=True, mlp_fc1_bias=True, mlp_fc2_bias=True,
                                         rotary_scaling_factor=2.0, max_trained_positions=64)}
