"""FlashAttention 4 (`flash-attn-4`, `flash_attn.cute.flash_attn_varlen_func`) behind ROSE's interface.

Packed q/k/v with cu_seqlens on the device, like torch's varlen: nothing to plan on the host, so a CUDA
graph captures it as is (max_seqlen = Tb is an upper bound the kernel accepts). A sliding window is its
`window_size` (left, right; None = unbounded). GQA is native (K/V keep
their heads; FA4 packs the query heads of a group). FA4 compiles its kernels with the CuTe DSL on the
first call of each (dtype, head dim, mask) combination; the eager warm-up run before a graph capture takes
that cost, and `rose build-kernels` moves it to image build time (rose.attention.kernels).
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from rose.attention.base import FULL, AttentionBackend, AttentionBackendError
from rose.attention.shape import AttentionShape
from rose.meta import ForwardMeta

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)
SUPPORTED_ARCH_MAJORS = (9, 10, 11)  # Hopper and Blackwell: FA4 asserts the same
SUPPORTED_HEAD_DIMS = (64, 96, 128, 192, 256)
PIP_HINT = "pip install 'ivy-tulip-rose[fa4]' (the flash-attn-4 package)"


def import_fa4():
    """flash_attn.cute.flash_attn_varlen_func, with its compile cache pointed at ROSE_KERNEL_CACHE_DIR."""
    from rose.attention.kernels import import_kernel_package

    def load():
        from flash_attn.cute import flash_attn_varlen_func

        return flash_attn_varlen_func

    return import_kernel_package(load, "fa4", "FlashAttention 4", PIP_HINT)


def check_supported(device: torch.device, dtype: torch.dtype, shape: AttentionShape | None) -> None:
    if device.type != "cuda" or not torch.cuda.is_available():
        raise AttentionBackendError("attention 'fa4' runs on CUDA only; use 'sdpa' on a CPU")
    if dtype not in SUPPORTED_DTYPES:
        raise AttentionBackendError(f"attention 'fa4' needs float16 or bfloat16, not {dtype}")
    major, minor = torch.cuda.get_device_capability(device)
    if major not in SUPPORTED_ARCH_MAJORS:
        raise AttentionBackendError(f"attention 'fa4' needs Hopper or Blackwell (sm90/sm100); this GPU is sm{major}{minor}")
    if shape is not None and shape.head_dim not in SUPPORTED_HEAD_DIMS:
        raise AttentionBackendError(f"attention 'fa4' supports head dims {SUPPORTED_HEAD_DIMS}, not {shape.head_dim}")


class Fa4Backend(AttentionBackend):
    name = "fa4"
    graph_safe = True

    def __init__(self, device: torch.device, dtype: torch.dtype, shape: AttentionShape | None = None) -> None:
        check_supported(device, dtype, shape)
        self._attn = import_fa4()
        params = set(inspect.signature(self._attn).parameters)
        missing = {"cu_seqlens_q", "cu_seqlens_k", "softmax_scale", "causal"} - params
        if missing:
            raise AttentionBackendError(f"this flash-attn-4 has no {sorted(missing)} in flash_attn_varlen_func")
        self._has_max_seqlen = "max_seqlen_q" in params
        self._has_window = "window_size" in params
        self.bidirectional_window = self._has_window  # (window, window): FA4's local mask, both sides
        if shape is not None and shape.window != FULL and not self._has_window:
            raise AttentionBackendError("this flash-attn-4 has no window_size (the model has sliding-window layers)")

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: ForwardMeta,
                causal: bool, scale: float, state: Any = None, window: int = FULL) -> torch.Tensor:
        kwargs: dict[str, Any] = {"cu_seqlens_q": meta.cu_seqlens, "cu_seqlens_k": meta.cu_seqlens,
                                  "softmax_scale": scale, "causal": causal}
        if window != FULL:
            if not self._has_window:
                raise AttentionBackendError("this flash-attn-4 has no window_size (sliding-window attention)")
            kwargs["window_size"] = (window, 0 if causal else window)
        if self._has_max_seqlen:
            kwargs["max_seqlen_q"] = kwargs["max_seqlen_k"] = meta.max_seqlen
        q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
        out = self._attn(q, k, v, **kwargs)
        return out[0] if isinstance(out, tuple) else out
