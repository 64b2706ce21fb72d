"""torch's ragged attention, torch.nn.attention.varlen.varlen_attn (FlashAttention-2 kernels, CUDA).

Packed q/k/v with cu_seqlens, no padding and no mask; GQA without repeating K/V; a sliding window is
FlashAttention's own `window_size` (left, right). Its signature moved between torch releases (2.10 took
`is_causal`, later ones `window_size`; `enable_gqa` came later), so the call adapts to the parameters it
finds at import.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from rose.attention.base import FULL, AttentionBackend, AttentionBackendError
from rose.meta import ForwardMeta

try:
    from torch.nn.attention.varlen import varlen_attn as _varlen_attn

    _PARAMS = set(inspect.signature(_varlen_attn).parameters)
except ImportError:  # torch without torch.nn.attention.varlen
    _varlen_attn = None
    _PARAMS = set()

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)


def varlen_available() -> bool:
    return _varlen_attn is not None and torch.cuda.is_available()


class VarlenBackend(AttentionBackend):
    name = "varlen"
    graph_safe = True
    bidirectional_window = "window_size" in _PARAMS  # (window, window): FlashAttention's local, both sides

    def __init__(self, device: torch.device, dtype: torch.dtype) -> None:
        if _varlen_attn is None:
            raise AttentionBackendError(f"attention 'varlen' needs torch.nn.attention.varlen (torch {torch.__version__})")
        if device.type != "cuda":
            raise AttentionBackendError("attention 'varlen' runs on CUDA only; use 'sdpa' on a CPU")
        if dtype not in SUPPORTED_DTYPES:
            raise AttentionBackendError(f"attention 'varlen' needs float16 or bfloat16, not {dtype}; use 'sdpa'")

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: ForwardMeta,
                causal: bool, scale: float, state: Any = None, window: int = FULL) -> torch.Tensor:
        kwargs: dict[str, Any] = {}
        if "scale" in _PARAMS:
            kwargs["scale"] = scale
        elif abs(scale - q.shape[-1] ** -0.5) > 1e-6:
            raise AttentionBackendError("this torch's varlen_attn takes no scale")
        if "window_size" in _PARAMS:
            kwargs["window_size"] = (window, 0 if causal else window)  # FULL is FlashAttention's -1 too
        elif window != FULL:
            raise AttentionBackendError("this torch's varlen_attn has no window_size (sliding-window attention)")
        elif "is_causal" in _PARAMS:
            kwargs["is_causal"] = causal
        elif causal:
            raise AttentionBackendError("this torch's varlen_attn has no causal mode")
        if k.shape[1] != q.shape[1] and "enable_gqa" in _PARAMS:
            kwargs["enable_gqa"] = True  # older releases take GQA natively (FlashAttention-2 does)
        cu = meta.cu_seqlens
        out = _varlen_attn(q, k, v, cu, cu, meta.max_seqlen, meta.max_seqlen, **kwargs)
        return out[0] if isinstance(out, tuple) else out
