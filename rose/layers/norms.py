"""LayerNorm (BERT family), RMSNorm (Qwen3) and GemmaRMSNorm, numerically as Hugging Face computes them."""

from __future__ import annotations

import torch
from torch import nn

from rose.layers.encoder_norms import add_layer_norm


class LayerNorm(nn.LayerNorm):
    """torch's LayerNorm; weight/bias names match HF checkpoints."""

    def add_forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """self(x + residual); the add and the norm in one kernel on a GPU (ROSE_ENCODER_NORMS, on by default)
        (rose.layers.encoder_norms)."""
        return add_layer_norm(x, residual, self.weight, self.bias, self.eps)


class RMSNorm(nn.Module):
    """Qwen3's RMSNorm: statistics in float32, then `weight * x.to(input dtype)` (the same rounding as HF)."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)



class GemmaRMSNorm(RMSNorm):
    """Gemma's RMSNorm: `(1 + weight) * x` in float32, rounded once (HF stores the weight centred on 0)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (h * (1.0 + self.weight.to(torch.float32))).to(x.dtype)
