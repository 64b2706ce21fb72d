"""Attention backends behind one interface, and the one factory that picks among them.

`auto` = torch varlen on CUDA in half precision when importable, else SDPA. FlashInfer and
FlashAttention 4 (issue 7) register here as further names.
"""

from __future__ import annotations

import torch

from rose.attention.base import AttentionBackend, AttentionBackendError, AttentionContext
from rose.attention.sdpa import SdpaBackend
from rose.attention.varlen import SUPPORTED_DTYPES as _VARLEN_DTYPES
from rose.attention.varlen import VarlenBackend, varlen_available

BACKENDS = ("auto", "sdpa", "varlen")

__all__ = ["BACKENDS", "AttentionBackend", "AttentionBackendError", "AttentionContext", "make_backend"]


def make_backend(name: str, device: torch.device, dtype: torch.dtype, spec=None) -> AttentionBackend:
    """The attention backend `name` for this device and dtype (`spec` is for per-model choices later)."""
    if name == "auto":
        name = "varlen" if device.type == "cuda" and varlen_available() and dtype in _VARLEN_DTYPES else "sdpa"
    if name == "sdpa":
        return SdpaBackend(device)
    if name == "varlen":
        return VarlenBackend(device, dtype)
    raise AttentionBackendError(f"unknown attention backend {name!r}; expected one of {', '.join(BACKENDS)}")
