"""Sparse and multi-vector heads on the device (rose.retrieval_spec says which a folder has and its columns).

`attach_retrieval_heads` changes `ModelRunner.forward` (model -> pooling -> transform) before any step, so the
eager path and every CUDA graph compute them:
- SPLADE replaces the pooling: the MLM head on every token (transform dense + activation + LayerNorm, then the
  decoder to vocabulary logits), log1p(relu(.)) in float32, then the max (or sum) over each span's tokens with
  one scatter_reduce into [Pb, vocab] rows (values are >= 0, so zeros are the identity of the max).
- BGE-M3 widens the transform: pooled row h -> [h | colbert_linear(h) | relu(sparse_linear(h))] in float32,
  its weights read from FlagEmbedding's colbert_linear.pt / sparse_linear.pt.
"""

from __future__ import annotations

import torch
from torch import nn

from rose.checkpoint import open_weights
from rose.layers.activations import get_activation
from rose.loader import load_tensors
from rose.spec import ModelFolderError, ModelSpec

_MLM_NAMES = {"dense.weight": ("cls.predictions.transform.dense.weight",),
              "dense.bias": ("cls.predictions.transform.dense.bias",),
              "norm.weight": ("cls.predictions.transform.LayerNorm.weight",),
              "norm.bias": ("cls.predictions.transform.LayerNorm.bias",),
              "decoder.weight": ("cls.predictions.decoder.weight", "embeddings.word_embeddings.weight"),
              "decoder.bias": ("cls.predictions.bias", "cls.predictions.decoder.bias")}


class SpladePooler(nn.Module):
    """hidden [Tb, H] -> float32 [Pb, vocab]: SpladePooling over each span of the MLM logits."""

    def __init__(self, hidden: int, vocab: int, act: str, eps: float, strategy: str, activation: str) -> None:
        super().__init__()
        self.dense, self.decoder = nn.Linear(hidden, hidden), nn.Linear(hidden, vocab)
        self.norm = nn.LayerNorm(hidden, eps=eps)
        self.act, self.strategy, self.twice = get_activation(act), strategy, activation == "log1p_relu"

    def forward(self, hidden: torch.Tensor, span_index: torch.Tensor, span_count: torch.Tensor) -> torch.Tensor:
        x = self.norm(self.act(self.dense(hidden)))
        weights = torch.log1p(torch.relu(self.decoder(x).float()))  # the logits in the model's dtype, then fp32
        if self.twice:
            weights = torch.log1p(weights)
        out = torch.zeros(span_count.shape[0] + 1, weights.shape[1], dtype=torch.float32, device=hidden.device)
        if self.strategy == "max":
            out.scatter_reduce_(0, span_index[:, None].expand_as(weights), weights, "amax")
        else:
            out.index_add_(0, span_index, weights)
        return out[:-1]  # the last row gathered the tokens in no span (padding)


class M3Transform(nn.Module):
    """pooled [P, H] float32 -> [P, H + C + 1]: the row, its ColBERT vector (not yet normalized), its sparse weight."""

    def __init__(self, colbert: nn.Linear, sparse: nn.Linear) -> None:
        super().__init__()
        self.colbert, self.sparse = colbert, sparse

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        return torch.cat([pooled, self.colbert(pooled), torch.relu(self.sparse(pooled))], dim=1)


def _linear_pt(path, out_features: int, in_features: int) -> nn.Linear:
    with open_weights(path) as f:  # torch.load(weights_only=True): a pickle naming anything else is refused
        state = {name: f.get(name) for name in f.keys()}
    weight, bias = state.get("weight"), state.get("bias")
    if weight is None or tuple(weight.shape) != (out_features, in_features) or bias is None:
        shape = None if weight is None else tuple(weight.shape)
        raise ModelFolderError(f"{path}: expected a Linear state dict with weight {(out_features, in_features)} and "
                               f"a bias, found weight {shape}")
    layer = nn.Linear(in_features, out_features)
    layer.load_state_dict({"weight": weight.float(), "bias": bias.float()})
    return layer


def build_splade_pooler(spec: ModelSpec, dtype: torch.dtype) -> SpladePooler:
    cfg, heads = spec.config, spec.retrieval
    hidden, vocab = int(cfg["hidden_size"]), int(cfg["vocab_size"])
    tensors = load_tensors(spec.model_dir, _MLM_NAMES)
    if tuple(tensors["decoder.weight"].shape) != (vocab, hidden):
        raise ModelFolderError(f"{spec.model_dir}: MLM decoder has shape {tuple(tensors['decoder.weight'].shape)}, "
                               f"config.json implies {(vocab, hidden)}")
    pooler = SpladePooler(hidden, vocab, str(cfg.get("hidden_act", "gelu")), float(cfg.get("layer_norm_eps", 1e-12)),
                          heads.splade_pooling, heads.splade_activation)
    pooler.load_state_dict({k: v.float() for k, v in tensors.items()}, strict=True)
    return pooler.to(dtype).eval().requires_grad_(False)  # the MLM head in the model's dtype, like its layers


def build_m3_transform(spec: ModelSpec) -> M3Transform:
    hidden, colbert = int(spec.config["hidden_size"]), spec.retrieval.colbert_dim
    layers = [_linear_pt(spec.model_dir / "colbert_linear.pt", colbert, hidden),
              _linear_pt(spec.model_dir / "sparse_linear.pt", 1, hidden)]
    return M3Transform(*layers).eval().requires_grad_(False)


def attach_retrieval_heads(runner, spec: ModelSpec) -> None:
    """Make `runner`'s forward compute the folder's sparse / multi-vector outputs; before any step."""
    if spec.retrieval is None:
        return
    if runner.runs or (runner.graphs is not None and runner.graphs.graphs):
        raise RuntimeError("attach_retrieval_heads must run before the runner's first step")
    if spec.retrieval.kind == "splade":
        runner.pooler = build_splade_pooler(spec, runner.dtype).to(runner.device)
    else:
        runner.transform = build_m3_transform(spec).to(runner.device)
    runner.dimensions = spec.retrieval.width
