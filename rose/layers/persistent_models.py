"""What the persistent decoder (rose.layers.persistent_decoder) reads from a model: each supported family's weights
stacked by layer, and its form. Two families: Qwen3 (pre-norm, RMSNorm, no biases, QK-norm + RoPE, SiLU-gated
MLP, causal or not: Qwen3-Embedding, pplx-embed) and BERT (post-norm, LayerNorm, biases, no rotary, GELU:
BERT, RoBERTa and XLM-R encoders such as all-MiniLM, BGE and E5). Stacking points each module's own parameter at
its view of the stack, so the weights are held once; anything the family lacks is a one-element placeholder the
kernel never reads."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from rose.windows import FULL

SILU_GATED, GELU = 1, 2  # the kernel's ACT


@dataclass
class Stacked:
    """One model's decoder as the kernel takes it. ln1[l] is the norm phase 0 of layer l applies: Qwen3's
    input_layernorm of layer l; BERT's output LayerNorm of layer l - 1 (so BERT's ln1 is offset by one layer:
    ln1[0] is layer 0's and serves phase 0 of layer 1), `final` the last one (BERT's last layer's)."""

    post: bool  # post-norm (BERT): the residual stream is the normed rows
    layer_norm: bool
    bias: bool
    act: int  # SILU_GATED or GELU
    rope: bool  # QK-norm + RoPE
    causal: bool
    eps: float
    scale: float
    layers: int
    wqkv: torch.Tensor
    wo: torch.Tensor
    wgu: torch.Tensor
    wd: torch.Tensor
    bqkv: torch.Tensor
    bo: torch.Tensor
    bgu: torch.Tensor
    bd: torch.Tensor
    ln1: torch.Tensor
    ln1b: torch.Tensor
    ln2: torch.Tensor
    ln2b: torch.Tensor
    final: torch.Tensor
    final_b: torch.Tensor
    qn: torch.Tensor
    kn: torch.Tensor
    inv_freq: torch.Tensor
    wemb: torch.Tensor  # BERT's embedding tables and their LayerNorm (PersistentDecoder.from_ids)
    temb: torch.Tensor
    pemb: torch.Tensor
    eln: torch.Tensor
    elnb: torch.Tensor
    token_types: bool  # a pair's second text has its own type (cross-encoders), else type 0 everywhere


def unsupported(model) -> str | None:
    """Why the persistent decoder cannot run this model, or None."""
    if _bert_layers(model) is not None:
        return _bert_unsupported(model)
    layers = getattr(model, "layers", None)
    if not layers or not hasattr(layers[0], "self_attn") or not hasattr(layers[0], "mlp"):
        return "not a Qwen3-style decoder nor a BERT-style encoder"
    attn = layers[0].self_attn
    if attn.q_norm is None or attn.qk_norm != "rms":
        return "no Qwen3 QK-norm"
    if attn.qkv_proj.bias is not None or attn.o_proj.bias is not None:
        return "projection biases"
    if any(w != FULL for w in model.windows):
        return "sliding windows"
    if attn.num_heads % attn.num_kv_heads:
        return "q heads not a multiple of kv heads"
    return _head_dim_unsupported(attn.head_dim)


def shapes(model) -> tuple[int, int, int, int, int]:
    """(heads, kv heads, head dim, hidden, inner) of a supported model, before anything is stacked."""
    bert = _bert_layers(model)
    if bert is not None:
        first = bert[0]
        return (first.num_heads, first.num_heads, first.head_dim, first.attention.output.dense.out_features,
                first.intermediate.dense.out_features)
    attn, mlp = model.layers[0].self_attn, model.layers[0].mlp
    return attn.num_heads, attn.num_kv_heads, attn.head_dim, attn.qkv_proj.in_features, mlp.down_proj.in_features


def stack(model) -> Stacked:
    """The model's decoder stacked for the kernel (unsupported(model) must be None)."""
    bert = _bert_layers(model)
    return _stack_bert(model, bert) if bert is not None else _stack_qwen3(model)


def _stack_qwen3(model) -> Stacked:
    layers = model.layers
    wqkv = _stack([layer.self_attn.qkv_proj for layer in layers])
    none = torch.zeros(1, dtype=wqkv.dtype, device=wqkv.device)
    return Stacked(post=False, layer_norm=False, bias=False, act=SILU_GATED, rope=True, causal=model.causal,
                   eps=layers[0].self_attn.eps, scale=model.scale, layers=len(layers), wqkv=wqkv,
                   wo=_stack([layer.self_attn.o_proj for layer in layers]),
                   wgu=_stack([layer.mlp.gate_up_proj for layer in layers]),
                   wd=_stack([layer.mlp.down_proj for layer in layers]), bqkv=none, bo=none, bgu=none, bd=none,
                   ln1=_stack([layer.input_layernorm for layer in layers]), ln1b=none,
                   ln2=_stack([layer.post_attention_layernorm for layer in layers]), ln2b=none,
                   final=model.norm.weight, final_b=none,
                   qn=_stack([layer.self_attn.q_norm for layer in layers]),
                   kn=_stack([layer.self_attn.k_norm for layer in layers]), inv_freq=model.rotary.inv_freq,
                   wemb=none, temb=none, pemb=none, eln=none, elnb=none, token_types=False)


def is_encoder(model) -> bool:
    """A BERT-style encoder (else a Qwen3-style decoder)."""
    return _bert_layers(model) is not None


def _bert_layers(model):
    layers = getattr(getattr(model, "encoder", None), "layer", None)
    if layers and hasattr(layers[0], "attention") and hasattr(layers[0], "intermediate"):
        return layers
    return None


def _bert_unsupported(model) -> str | None:
    layer = _bert_layers(model)[0]
    if layer.act is not F.gelu:
        return "an activation other than exact GELU"
    return _head_dim_unsupported(layer.head_dim)


def _stack_bert(model, layers) -> Stacked:
    emb = model.embeddings
    kinds = {"qkv": [layer.attention._modules["self"].qkv_proj for layer in layers],
             "o": [layer.attention.output.dense for layer in layers],
             "up": [layer.intermediate.dense for layer in layers], "down": [layer.output.dense for layer in layers],
             "ln1": [layer.output.LayerNorm for layer in layers],  # phase 0 of the next layer's (final: the last's)
             "ln2": [layer.attention.output.LayerNorm for layer in layers]}
    w = {kind: _stack(modules) for kind, modules in kinds.items()}
    b = {kind: _stack(modules, "bias") for kind, modules in kinds.items()}
    none = torch.zeros(1, dtype=w["ln1"].dtype, device=w["ln1"].device)
    return Stacked(post=True, layer_norm=True, bias=True, act=GELU, rope=False, causal=False,
                   eps=layers[0].output.LayerNorm.eps, scale=model.scale, layers=len(layers), wqkv=w["qkv"],
                   wo=w["o"], wgu=w["up"], wd=w["down"], bqkv=b["qkv"], bo=b["o"], bgu=b["up"], bd=b["down"],
                   ln1=w["ln1"], ln1b=b["ln1"], ln2=w["ln2"], ln2b=b["ln2"], final=w["ln1"][-1],
                   final_b=b["ln1"][-1], qn=none, kn=none, inv_freq=none.float(), wemb=emb.word_embeddings.weight,
                   temb=emb.token_type_embeddings.weight, pemb=emb.position_embeddings.weight,
                   eln=emb.LayerNorm.weight, elnb=emb.LayerNorm.bias, token_types=model.token_types)


def _head_dim_unsupported(d: int) -> str | None:
    if d & (d - 1) or not 32 <= d <= 128:
        return f"head_dim {d} (a power of two from 32 to 128)"
    return None


def _stack(modules, name: str = "weight") -> torch.Tensor:
    """Stack the modules' `name` parameters along a new first dimension and point each module's at its view, one
    layer at a time: each layer's own tensor is freed as its view replaces it (at most one layer's held twice)."""
    first = getattr(modules[0], name)
    stacked = torch.empty((len(modules), *first.shape), dtype=first.dtype, device=first.device)
    for i, m in enumerate(modules):
        stacked[i].copy_(getattr(m, name).detach())
        getattr(m, name).data = stacked[i]
    return stacked
