"""The one attention interface every backend implements (SDPA, torch varlen; FlashInfer and FA4 later).

A forward over a ragged batch calls the backend in three places:
- `plan(meta)`: host side, before the forward and outside any CUDA graph. A backend that needs host
  work per batch (FlashInfer's plan into fixed workspace buffers) does it here; a graph runner calls it
  before every replay with the new batch's HostMeta in `meta.host`.
- `prepare(meta, causal)`: device side, once per forward, inside the graph (e.g. SDPA's block-diagonal
  mask). Must be capturable: no host syncs, shapes fixed by the layout.
- `forward(q, k, v, meta, causal, scale, state)`: per layer; q [T, Hq, D], k/v [T, Hkv, D] -> [T, Hq, D].
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from rose.meta import ForwardMeta


class AttentionBackendError(ValueError):
    """The backend cannot run here (device, dtype, missing kernel)."""


class AttentionBackend:
    name = "base"
    graph_safe = True  # whether forward() may be captured in a CUDA graph

    def plan(self, meta: ForwardMeta) -> None:
        """Host-side per-batch work, outside the graph. Default: nothing."""

    def prepare(self, meta: ForwardMeta, causal: bool) -> Any:
        """Device-side per-forward state shared by all layers. Default: none."""
        return None

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: ForwardMeta,
                causal: bool, scale: float, state: Any = None) -> torch.Tensor:
        raise NotImplementedError


@dataclass
class AttentionContext:
    """What a layer needs to attend: built once per forward by the model, called once per layer."""

    backend: AttentionBackend
    meta: ForwardMeta
    causal: bool
    scale: float
    state: Any = None

    @classmethod
    def build(cls, backend: AttentionBackend, meta: ForwardMeta, causal: bool, scale: float) -> AttentionContext:
        return cls(backend, meta, causal, scale, backend.prepare(meta, causal))

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.backend.forward(q, k, v, self.meta, self.causal, self.scale, self.state)
