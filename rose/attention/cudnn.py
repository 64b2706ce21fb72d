"""cuDNN's fused attention over a ragged batch, behind ROSE's interface: CUDA, half precision, no extra package.

The kernel is the one torch's nested tensors reach: `aten._cudnn_attention_forward` with cumulative sequence
lengths (cuDNN's ragged offsets), packed q/k/v [T, heads, head_dim], no padding and no mask. On Hopper its
kernels use the tensor-memory accelerator and warpgroup MMAs, where torch's varlen runs FlashAttention-2's
(benchmarks/NOTES.md, "Attention backends": FlashAttention-2 reached ~215 TFLOP/s at 4096 causal tokens).

cuDNN builds an execution plan per problem shape on the host (sequences, longest sequence, heads) and torch
caches it by shape. A graph layout fixes both numbers (Sb sequences, its max-seqlen bound), so a graph's plan
is built once, by the warm-up run before its capture, and replays cost no host work. An eager batch runs at
its exact size, so cuDNN would build a plan for each new (sequences, longest) pair on the request path:
eager metas (`ForwardMeta.graph` False: exact-size batches, warm-ups, the reference a new graph is checked
against) run torch's varlen instead, the same attention by another kernel.

K/V heads are repeated to the query heads (GQA), one copy per layer: torch's cuDNN path takes the heads of
q, k and v apart, but torch's own varlen refuses GQA on it, so ROSE does not lean on it unmeasured. No sliding
window (cuDNN's ragged path has none here): models with windowed layers use varlen or fa4.
"""

from __future__ import annotations

from typing import Any

import torch

from rose.attention.base import FULL, AttentionBackend, AttentionBackendError
from rose.attention.shape import AttentionShape
from rose.attention.varlen import VarlenBackend
from rose.meta import ForwardMeta

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)
MAX_HEAD_DIM = 128  # cuDNN's fused attention on sm80/sm90 for inference: head dims up to 128, multiples of 8


def _op():
    """torch's ragged cuDNN attention op, or None when this torch has none with cumulative lengths."""
    op = getattr(torch.ops.aten, "_cudnn_attention_forward", None)
    if op is None:
        return None
    names = [a.name for a in op.default._schema.arguments]
    return op.default if "cum_seq_q" in names and "max_q" in names else None


def check_supported(device: torch.device, dtype: torch.dtype, shape: AttentionShape | None) -> None:
    """Raise AttentionBackendError when cuDNN's ragged attention cannot run this model here."""
    if device.type != "cuda" or not torch.cuda.is_available():
        raise AttentionBackendError("attention 'cudnn' runs on CUDA only; use 'sdpa' on a CPU")
    if dtype not in SUPPORTED_DTYPES:
        raise AttentionBackendError(f"attention 'cudnn' needs float16 or bfloat16, not {dtype}")
    if not torch.backends.cudnn.is_available():
        raise AttentionBackendError("attention 'cudnn': this torch has no cuDNN")
    if _op() is None:
        raise AttentionBackendError(f"attention 'cudnn' needs aten._cudnn_attention_forward with cumulative "
                                    f"sequence lengths (torch {torch.__version__} has none)")
    major, minor = torch.cuda.get_device_capability(device)
    if major < 8:
        raise AttentionBackendError(f"attention 'cudnn' needs sm80 or newer; this GPU is sm{major}{minor}")
    if shape is None:
        return
    if shape.head_dim > MAX_HEAD_DIM or shape.head_dim % 8:
        raise AttentionBackendError(f"attention 'cudnn' takes head dims up to {MAX_HEAD_DIM} in steps of 8, "
                                    f"not {shape.head_dim}")
    if shape.window != FULL:
        raise AttentionBackendError("attention 'cudnn' runs no sliding window; use varlen or fa4")
    if shape.num_qo_heads % shape.num_kv_heads:
        raise AttentionBackendError(f"{shape.num_qo_heads} query heads are not a multiple of {shape.num_kv_heads} KV heads")


class CudnnBackend(AttentionBackend):
    name = "cudnn"
    graph_safe = True
    bidirectional_window = False

    def __init__(self, device: torch.device, dtype: torch.dtype, shape: AttentionShape | None = None) -> None:
        check_supported(device, dtype, shape)
        self._op = _op()
        self._eager = VarlenBackend(device, dtype)  # eager metas (module docstring)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: ForwardMeta,
                causal: bool, scale: float, state: Any = None, window: int = FULL) -> torch.Tensor:
        if not meta.graph:
            return self._eager.forward(q, k, v, meta, causal, scale, state, window)
        if window != FULL:
            raise AttentionBackendError("attention 'cudnn' runs no sliding window")
        group = q.shape[1] // k.shape[1]
        if group > 1:
            k, v = (x.repeat_interleave(group, dim=1) for x in (k, v))
        q, k, v = (x.contiguous() for x in (q, k, v))
        cu = meta.cu_seqlens
        out = self._op(q, k, v, None, cu, cu, meta.max_seqlen, meta.max_seqlen, False, 0.0, causal, False,
                       scale=scale)
        return out[0]
