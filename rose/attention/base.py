"""The one attention interface every backend implements (SDPA, torch varlen; FlashInfer and FA4 later).

A forward over a ragged batch calls the backend in three places:
- `plan(meta)`: host side, before the forward and outside any CUDA graph. A backend that needs host
  work per batch (FlashInfer's plan into fixed workspace buffers) does it here; a graph runner calls it
  before every replay with the new batch's HostMeta in `meta.host`.
- `prepare(meta, causal, window)`: device side, once per forward and window, inside the graph (e.g. SDPA's
  block-diagonal mask). Must be capturable: no host syncs, shapes fixed by the layout.
- `forward(q, k, v, meta, causal, scale, state, window)`: per layer; q [T, Hq, D], k/v [T, Hkv, D] -> [T, Hq, D].

`window` is a sliding window (Mistral, Gemma 3's local layers): a query attends only keys at most `window`
positions from it, on either side (causal still hides the later ones); FULL (-1) = no window.
`bidirectional_window` says whether a backend runs such a window without causal (|i - j| <= window, ModernBERT's
local layers); a model whose backend cannot takes another path (rose.attention.banded).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from rose.meta import ForwardMeta
from rose.windows import FULL  # noqa: F401 (no sliding window; re-exported)


class AttentionBackendError(ValueError):
    """The backend cannot run here (device, dtype, missing kernel)."""


class AttentionBackend:
    name = "base"
    graph_safe = True  # whether forward() may be captured in a CUDA graph
    bidirectional_window = False  # whether forward() runs a window with causal=False (keys on both sides)
    position_bias = False  # whether it has forward_biased (an additive bias by relative position: MPNet)
    host_plan_state = False  # whether plan() leaves state the next eager forwards read (FlashInfer's eager slot):
    # a batch stepped layer by layer (rose.layer_steps) then plans again before each layer

    def plan(self, meta: ForwardMeta) -> None:
        """Host-side per-batch work, outside the graph. Default: nothing."""

    def prepare(self, meta: ForwardMeta, causal: bool, window: int = FULL) -> Any:
        """Device-side per-forward state shared by the layers of one window. Default: none."""
        return None

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: ForwardMeta,
                causal: bool, scale: float, state: Any = None, window: int = FULL) -> torch.Tensor:
        raise NotImplementedError


@dataclass
class AttentionContext:
    """What a layer needs to attend: built once per forward (and window) by the model, called once per layer."""

    backend: AttentionBackend
    meta: ForwardMeta
    causal: bool
    scale: float
    state: Any = None
    window: int = FULL

    @classmethod
    def build(cls, backend: AttentionBackend, meta: ForwardMeta, causal: bool, scale: float,
              window: int = FULL) -> AttentionContext:
        return cls(backend, meta, causal, scale, backend.prepare(meta, causal, window), window)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.backend.forward(q, k, v, self.meta, self.causal, self.scale, self.state, self.window)
