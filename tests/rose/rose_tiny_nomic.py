"""A tiny random NomicBERT folder (nomic-embed-text-v1.5's layout) and a reference written here.

transformers has no NomicBERT: the reference is this file's own padded implementation of the published math
(nomic-ai modeling_hf_nomic_bert.py, read, not copied): word + token type 0 embeddings -> emb_ln; per layer
norm1(x + out_proj(softmax(rope(q) rope(k)^T / sqrt(d) + mask) v)) then norm2(h + mlp(h)), the MLP gated
(fc11 * act(fc12), its width rounded up to 256) or plain (gelu(fc1)); RoPE on the first rotary_emb_fraction
of each head, NeoX halves or GPT-J pairs, from a cos/sin table cast to the model dtype.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from rose_tiny_models import TinyModel, _bert_tokenizer, _randomize, _write_json, _write_st_files
from torch import nn

NOMIC_AUTO_MAP = {"AutoConfig": "nomic-ai/nomic-bert-2048--configuration_hf_nomic_bert.NomicBertConfig",
                  "AutoModel": "nomic-ai/nomic-bert-2048--modeling_hf_nomic_bert.NomicBertModel"}


class NomicReference(nn.Module):
    """NomicBertModel on a right-padded batch: forward(input_ids, attention_mask).last_hidden_state."""

    def __init__(self, cfg: dict) -> None:
        super().__init__()
        self.cfg, self.config = cfg, SimpleNamespace(vocab_size=cfg["vocab_size"])
        d, eps = cfg["n_embd"], cfg["layer_norm_epsilon"]
        self.heads, self.head_dim = cfg["n_head"], d // cfg["n_head"]
        self.rot = int(self.head_dim * cfg["rotary_emb_fraction"])
        self.gated = cfg["activation_function"] in ("glu", "swiglu", "geglu")
        rows = math.ceil(cfg["vocab_size"] / cfg["pad_vocab_size_multiple"]) * cfg["pad_vocab_size_multiple"]
        self.embeddings = nn.Module()
        self.embeddings.word_embeddings = nn.Embedding(rows, d)
        self.embeddings.token_type_embeddings = nn.Embedding(cfg["type_vocab_size"], d)
        self.emb_ln = nn.LayerNorm(d, eps=eps)
        self.encoder = nn.Module()
        self.encoder.layers = nn.ModuleList()
        inner = math.ceil(cfg["n_inner"] / 256) * 256 if self.gated else cfg["n_inner"]
        for _ in range(cfg["n_layer"]):
            block, attn, mlp = nn.Module(), nn.Module(), nn.Module()
            attn.Wqkv = nn.Linear(d, 3 * d, bias=cfg["qkv_proj_bias"])
            attn.out_proj = nn.Linear(d, d, bias=cfg["qkv_proj_bias"])
            if self.gated:
                mlp.fc11 = nn.Linear(d, inner, bias=cfg["mlp_fc1_bias"])
                mlp.fc12 = nn.Linear(d, inner, bias=cfg["mlp_fc1_bias"])
            else:
                mlp.fc1 = nn.Linear(d, inner, bias=cfg["mlp_fc1_bias"])
            mlp.fc2 = nn.Linear(inner, d, bias=cfg["mlp_fc2_bias"])
            block.attn, block.mlp = attn, mlp
            block.norm1, block.norm2 = nn.LayerNorm(d, eps=eps), nn.LayerNorm(d, eps=eps)
            self.encoder.layers.append(block)
        inv = 1.0 / cfg["rotary_emb_base"] ** (torch.arange(0, self.rot, 2, dtype=torch.float32) / self.rot)
        freqs = torch.outer(torch.arange(cfg["n_positions"], dtype=torch.float32), inv)
        self.register_buffer("cos", freqs.cos(), persistent=False)
        self.register_buffer("sin", freqs.sin(), persistent=False)

    def _rope(self, x, cos, sin):  # x [B, L, H, D]; cos/sin [L, rot/2]
        if self.cfg["rotary_emb_interleaved"]:
            cos, sin = cos.repeat_interleave(2, -1), sin.repeat_interleave(2, -1)
            part = x[..., : self.rot]
            rotated = torch.stack([-part[..., 1::2], part[..., 0::2]], dim=-1).reshape(part.shape)
        else:
            cos, sin = torch.cat([cos, cos], -1), torch.cat([sin, sin], -1)
            part = x[..., : self.rot]
            half = self.rot // 2
            rotated = torch.cat([-part[..., half:], part[..., :half]], dim=-1)
        out = part * cos[None, :, None, :] + rotated * sin[None, :, None, :]
        return torch.cat([out, x[..., self.rot:]], dim=-1)

    def forward(self, input_ids, attention_mask):
        b, n = input_ids.shape
        e = self.embeddings
        x = self.emb_ln(e.word_embeddings(input_ids) + e.token_type_embeddings(torch.zeros_like(input_ids)))
        cos, sin = self.cos[:n].to(x.dtype), self.sin[:n].to(x.dtype)
        bias = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
        act = {"glu": torch.sigmoid, "swiglu": F.silu, "geglu": F.gelu}.get(self.cfg["activation_function"])
        for block in self.encoder.layers:
            q, k, v = block.attn.Wqkv(x).view(b, n, 3, self.heads, self.head_dim).unbind(2)
            if self.rot:
                q, k = self._rope(q, cos, sin), self._rope(k, cos, sin)
            scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(self.head_dim) + bias
            ctx = torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v).reshape(b, n, -1)
            h = block.norm1(x + block.attn.out_proj(ctx))
            m = block.mlp
            y = m.fc2(m.fc11(h) * act(m.fc12(h))) if self.gated else m.fc2(F.gelu(m.fc1(h)))
            x = block.norm2(h + y)
        return SimpleNamespace(last_hidden_state=x)


def nomic_config(**overrides) -> dict:
    """config.json of a tiny nomic-embed-text-v1.5 (its published fields and values, narrower and shorter)."""
    cfg = {"architectures": ["NomicBertModel"], "auto_map": NOMIC_AUTO_MAP, "model_type": "nomic_bert",
           "activation_function": "swiglu", "attn_pdrop": 0.0, "causal": False, "dense_seq_output": True,
           "embd_pdrop": 0.0, "fused_bias_fc": True, "fused_dropout_add_ln": True, "initializer_range": 0.02,
           "layer_norm_epsilon": 1e-12, "max_trained_positions": 2048, "mlp_fc1_bias": False, "mlp_fc2_bias": False,
           "n_embd": 64, "n_head": 4, "n_inner": 96, "n_layer": 2, "n_positions": 128, "pad_vocab_size_multiple": 64,
           "parallel_block": False, "parallel_block_tied_norm": False, "prenorm": False, "qkv_proj_bias": False,
           "resid_pdrop": 0.0, "rotary_emb_base": 1000, "rotary_emb_fraction": 1.0, "rotary_emb_interleaved": False,
           "rotary_emb_scale_base": None, "rotary_scaling_factor": None, "scale_attn_weights": True,
           "type_vocab_size": 2, "use_flash_attn": True, "use_rms_norm": False, "use_xentropy": True,
           "vocab_size": 260, "bos_token_id": None, "eos_token_id": None}
    cfg.update(overrides)
    return cfg


def build_nomic(root: Path, name: str = "tiny-nomic", seed: int = 41, **overrides) -> TinyModel:
    from safetensors.torch import save_file

    path = root / name
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    cfg = nomic_config(**overrides)
    torch.manual_seed(seed)
    ref = NomicReference(cfg)
    _randomize(ref, seed)
    ref.eval()
    _write_json(path / "config.json", cfg)
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, str(path / "model.safetensors"))
    _bert_tokenizer(path)
    tok_config = path / "tokenizer_config.json"
    _write_json(tok_config, {**json.loads(tok_config.read_text()), "model_max_length": cfg["n_positions"]})
    _write_st_files(path, cfg["n_embd"], "mean", True, cfg["n_positions"])
    return TinyModel(name, path, ref, 0, False, "mean", True, False)
