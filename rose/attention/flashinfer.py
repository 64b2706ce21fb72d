"""FlashInfer's ragged prefill (its fa2 or fa3 kernels) behind ROSE's attention interface.

FlashInfer splits attention in two: `plan()` on the host turns cu_seqlens into a work schedule (which
query tile of which sequence each CTA runs) and copies it into an int workspace on the device; `run()`
launches the kernels that read it. ROSE maps plan() to backend.plan (outside any CUDA graph, before every
replay) and run() to forward (captured). GQA is native (K/V keep their own heads); bidirectional and
causal are one flag of the plan.

Why one wrapper per bucket layout (Tb, Sb): in CUDA-graph mode FlashInfer bakes the batch size
(len(indptr) - 1), the total rows of the first plan and the buffers' addresses into the captured kernels,
and re-plans each new batch into the same fixed buffers. A ROSE layout fixes both numbers (padding is its
own pseudo-sequence and cu_seqlens always has Sb + 1 entries ending at Tb), so every graph layout gets a
wrapper with fixed indptr buffers and its own int workspace (layouts that differ only in their max-seqlen
bound share it). Which metas are graph metas is explicit (`ForwardMeta.graph`, set by rose.graphs), never
guessed from the shapes: every eager batch, padded or exact, is planned into one ordinary (non-graph)
wrapper. At most MAX_GRAPH_WRAPPERS graph layouts get a wrapper; planning a graph meta of a new layout past
that raises GraphSlotsExhausted (a captured graph keeps its wrapper's buffers, so none can be evicted), and
the graph runner then runs that layout eagerly.

Split-KV is disabled: in graph mode FlashInfer would otherwise always split and merge; ROSE's prefill
batches have enough query tiles to fill the GPU, and unsplit results do not depend on batch neighbours.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from typing import Any

import torch

from rose.attention.base import FULL, AttentionBackend, AttentionBackendError
from rose.attention.shape import AttentionShape
from rose.meta import ForwardMeta

VARIANTS = ("fa2", "fa3")
FA3_HEAD_DIMS = (64, 128, 256)  # the head dims FlashInfer's Hopper prefill kernels instantiate
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)
FLOAT_WORKSPACE_BYTES = 16 << 20  # split-KV temporaries; unused with split-KV off, but the wrapper needs one
EAGER_INT_WORKSPACE_BYTES = 8 << 20  # FlashInfer's default, for batches of any size
MAX_GRAPH_WRAPPERS = 256  # graph layouts with a wrapper of their own; later ones cannot be captured
PIP_HINT = "pip install 'ivy-tulip-rose[flashinfer]' (the flashinfer-python package)"


class GraphSlotsExhausted(AttentionBackendError):
    """Every graph wrapper is taken: this layout cannot be captured (it runs eagerly)."""


def import_flashinfer():
    """The flashinfer module, with its JIT cache pointed at ROSE_KERNEL_CACHE_DIR when that is set."""
    from rose.attention.kernels import import_kernel_package

    def load():
        import flashinfer

        return flashinfer

    return import_kernel_package(load, "flashinfer", "FlashInfer", PIP_HINT)


def check_supported(variant: str, device: torch.device, dtype: torch.dtype, shape: AttentionShape) -> None:
    """Raise AttentionBackendError when `variant` cannot run this shape here (before any import or JIT)."""
    name = f"flashinfer-{variant}"
    if variant not in VARIANTS:
        raise AttentionBackendError(f"unknown FlashInfer variant {variant!r}; expected one of {VARIANTS}")
    if device.type != "cuda" or not torch.cuda.is_available():
        raise AttentionBackendError(f"attention '{name}' runs on CUDA only; use 'sdpa' on a CPU")
    if dtype not in SUPPORTED_DTYPES:
        raise AttentionBackendError(f"attention '{name}' needs float16 or bfloat16, not {dtype}")
    major, minor = torch.cuda.get_device_capability(device)
    if variant == "fa3" and major != 9:
        raise AttentionBackendError(f"attention '{name}' needs a Hopper GPU (sm90); this one is sm{major}{minor}")
    if major < 8:
        raise AttentionBackendError(f"attention '{name}' needs sm80 or newer; this GPU is sm{major}{minor}")
    if variant == "fa3" and shape.head_dim not in FA3_HEAD_DIMS:
        raise AttentionBackendError(f"attention '{name}' supports head dims {FA3_HEAD_DIMS}, not {shape.head_dim}")
    if shape.num_qo_heads % shape.num_kv_heads:
        raise AttentionBackendError(f"{shape.num_qo_heads} query heads are not a multiple of {shape.num_kv_heads} KV heads")
    if shape.window != FULL:  # one plan per batch bakes one window in; mixed local/global layers would need two
        raise AttentionBackendError(f"attention '{name}' does not plan sliding-window layers here; use varlen or fa4")


def int_workspace_bytes(tokens: int, seqs: int, shape: AttentionShape) -> int:
    """Twice the most FlashInfer's plan writes for one graph layout (its scheduler, 0.7): fa2 keeps about
    13 bytes per CTA slot, slots <= ceil(Tb * group / 16) + Sb (or the split bound, < 1024 CTAs); fa3 keeps
    7 int32 per work item, items <= (ceil(Tb / 128) + Sb) * Hq. Floor 1 MiB."""
    fa2 = 16 * (math.ceil(tokens * shape.group / 16) + seqs + 1024) + 4 * (seqs + 2) + 4096
    fa3 = 28 * (math.ceil(tokens / 64) + seqs) * shape.num_qo_heads + 4 * 1024 + 4096
    return max(1 << 20, 2 * max(fa2, fa3))


@dataclass
class _Slot:
    """One FlashInfer wrapper and the buffers it was built around."""

    wrapper: Any
    planned: tuple[int, int] | None = None  # (Tb, Sb) of the last plan
    copied: torch.cuda.Event | None = None  # after the last plan's copy out of the wrapper's pinned buffer


class FlashInferBackend(AttentionBackend):
    graph_safe = True
    host_plan_state = True  # eager batches share one planned slot
    bidirectional_window = False  # plans no window at all (and FlashInfer's own is window_left: one-sided)

    def __init__(self, device: torch.device, dtype: torch.dtype, shape: AttentionShape, variant: str = "fa2") -> None:
        check_supported(variant, device, dtype, shape)
        self.name = f"flashinfer-{variant}"
        self.device, self.dtype, self.shape, self.variant = device, dtype, shape, variant
        self._fi = import_flashinfer()
        self._float_ws = torch.empty(FLOAT_WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        self._graph_slots: dict[tuple[int, int], _Slot] = {}
        self._eager: _Slot | None = None
        self._plan_kwargs = self._plan_options()

    def _plan_options(self) -> dict[str, Any]:
        params = inspect.signature(self._fi.BatchPrefillWithRaggedKVCacheWrapper.plan).parameters
        kwargs = {"causal": self.shape.causal, "sm_scale": self.shape.scale,
                  "q_data_type": self.dtype, "kv_data_type": self.dtype}
        if "disable_split_kv" not in params:  # split-KV would need hundreds of MiB of float workspace
            raise AttentionBackendError(f"this FlashInfer's plan() has no disable_split_kv: {PIP_HINT}, >= 0.7")
        kwargs["disable_split_kv"] = True
        if "non_blocking" in params:
            kwargs["non_blocking"] = True
        return kwargs

    # -- wrappers ---------------------------------------------------------------------------------
    def _new_wrapper(self, graph_layout: tuple[int, int] | None) -> _Slot:
        cls = self._fi.BatchPrefillWithRaggedKVCacheWrapper
        if graph_layout is None:
            return _Slot(cls(self._float_ws, "NHD", backend=self.variant))
        tokens, seqs = graph_layout
        qo = torch.zeros(seqs + 1, dtype=torch.int32, device=self.device)
        kv = torch.zeros(seqs + 1, dtype=torch.int32, device=self.device)
        wrapper = cls(self._float_ws, "NHD", use_cuda_graph=True, qo_indptr_buf=qo, kv_indptr_buf=kv,
                      backend=self.variant)
        int_ws = torch.empty(int_workspace_bytes(tokens, seqs, self.shape), dtype=torch.uint8, device=self.device)
        wrapper.reset_workspace_buffer(self._float_ws, int_ws)  # sized for this layout, not FlashInfer's 8 MiB
        return _Slot(wrapper)

    def _slot(self, meta: ForwardMeta, create: bool) -> _Slot | None:
        """The graph wrapper of meta's layout for a graph meta, else the one eager wrapper; None when
        not created yet and `create` is off."""
        if not meta.graph:
            if self._eager is None and create:
                self._eager = self._new_wrapper(None)
            return self._eager
        key = (meta.layout.tokens, meta.layout.seqs)
        slot = self._graph_slots.get(key)
        if slot is None and create:
            if len(self._graph_slots) >= MAX_GRAPH_WRAPPERS:
                raise GraphSlotsExhausted(f"{self.name}: all {MAX_GRAPH_WRAPPERS} graph wrappers are taken; "
                                          f"layout {meta.layout} cannot be captured")
            slot = self._graph_slots[key] = self._new_wrapper(key)
        return slot

    # -- the backend interface ------------------------------------------------------------------------
    def plan(self, meta: ForwardMeta) -> None:
        host = meta.host
        if host is None:
            raise AttentionBackendError(f"{self.name} plans on the host: the ForwardMeta has no HostMeta")
        slot = self._slot(meta, create=True)
        if slot.copied is not None:
            # The one host wait of this backend: FlashInfer's plan writes the schedule into a pinned buffer
            # and copies it to the device asynchronously; the previous plan's copy must have left that
            # buffer before it is overwritten (it has, unless the GPU is more than one batch behind).
            slot.copied.synchronize()
        cu = torch.from_numpy(host.cu_seqlens.astype("int32", copy=True))  # pageable: copied before return
        slot.wrapper.plan(cu, cu, self.shape.num_qo_heads, self.shape.num_kv_heads, self.shape.head_dim,
                          **self._plan_kwargs)
        slot.copied = torch.cuda.Event()
        slot.copied.record()
        slot.planned = (meta.layout.tokens, meta.layout.seqs)

    def prepare(self, meta: ForwardMeta, causal: bool, window: int = FULL) -> Any:
        if window != FULL:
            raise AttentionBackendError(f"{self.name} was planned without a sliding window, asked for {window}")
        if causal != self.shape.causal:
            raise AttentionBackendError(f"{self.name} was planned for causal={self.shape.causal}, asked for {causal}")
        return None

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: ForwardMeta,
                causal: bool, scale: float, state: Any = None, window: int = FULL) -> torch.Tensor:
        slot = self._slot(meta, create=False)
        if slot is None or slot.planned != (meta.layout.tokens, meta.layout.seqs):
            raise AttentionBackendError(f"{self.name}: plan(meta) must run before forward for layout {meta.layout}")
        if slot is self._eager and torch.cuda.is_current_stream_capturing():
            raise AttentionBackendError(f"{self.name}: layout {meta.layout} is planned eagerly and cannot be captured "
                                        "(capture with a ForwardMeta built with graph=True)")
        if abs(scale - self.shape.scale) > 1e-6 * self.shape.scale:
            raise AttentionBackendError(f"{self.name} was planned with scale {self.shape.scale}, asked for {scale}")
        q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
        return slot.wrapper.run(q, k, v)
