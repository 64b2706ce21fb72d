"""Kernels that compile on first use (FlashInfer's JIT, FlashAttention 4's CuTe DSL), built ahead of serving.

Why: FlashInfer compiles its prefill module the first time a (dtype, head dim) is planned (fa2 about 23 s,
fa3 about 83 s on the H200); a replica that did that at start would miss its start-to-ready budget. The
image build runs `rose build-kernels MODEL_DIR --cache-dir DIR` once; serving points the same variable
(ROSE_KERNEL_CACHE_DIR=DIR) at it and loads the compiled modules in well under a second.

Both libraries read their cache location from the environment when they are imported, so
use_kernel_cache() must run before either is imported (the backends call it just before importing).
FlashInfer: FLASHINFER_WORKSPACE_BASE (its cache lives under BASE/.cache/flashinfer/<version>/<arch>).
FA4: FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 and FLASH_ATTENTION_CUTE_DSL_CACHE_DIR.
ROSE's own Triton kernels compile at a replica's first start too: TRITON_CACHE_DIR goes under the same directory
when it is writable (rose.kernel_cache.use_kernel_cache), and rose.kernel_ahead compiles them ahead.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from rose.attention.shape import AttentionShape
from rose.kernel_cache import use_kernel_cache
from rose.windows import FULL

log = logging.getLogger("rose.attention")
JIT_BACKENDS = ("flashinfer-fa2", "flashinfer-fa3", "fa4")


def import_kernel_package(importer: Callable[[], Any], needs: str, package: str, pip_hint: str) -> Any:
    """importer() with the kernel cache pointed at ROSE_KERNEL_CACHE_DIR first. A missing package is an
    AttentionBackendError naming the pip extra; a broken install (CUDA libraries, ABI, DSL) one too, never a
    crash of the backend factory."""
    from rose.attention.base import AttentionBackendError

    use_kernel_cache()
    try:
        return importer()
    except ImportError as exc:
        raise AttentionBackendError(f"attention '{needs}' needs {package}: {pip_hint} ({exc})") from None
    except Exception as exc:  # noqa: BLE001 - see the docstring
        raise AttentionBackendError(f"{package} is installed but does not import: {type(exc).__name__}: {exc}") from None


def build_kernels(shape: AttentionShape, backends=JIT_BACKENDS, device: torch.device | None = None,
                  dtype: torch.dtype = torch.bfloat16, tokens: int = 256) -> list[dict]:
    """Plan and run each backend once on a small ragged batch of `shape`, which compiles (or loads from the
    cache) every kernel it serves with: one FlashInfer module covers causal and bidirectional; FA4 compiles
    per mask, so it runs both. One record per backend: status built | unavailable (cannot run here: package
    missing, GPU or shape unsupported) | failed (the build or the run broke), seconds of first use, error.
    A model with sliding-window layers runs its window too (FA4 compiles local attention separately)."""
    from rose.attention import AttentionBackendError, make_backend
    from rose.batch import Batch
    from rose.meta import ForwardMeta, MetaLayout, pack_batch

    device = device or torch.device("cuda", torch.cuda.current_device())
    batch = Batch.from_sequences([[1] * n for n in (tokens // 2, tokens // 4, tokens // 8)])
    host = pack_batch(batch, MetaLayout(tokens, 4, 4))
    meta = ForwardMeta.from_buffer(torch.from_numpy(host.packed).to(device), host.layout, tokens, host)
    gen = torch.Generator(device="cpu").manual_seed(0)
    q, k, v = (torch.randn(tokens, h, shape.head_dim, generator=gen).to(device, dtype)
               for h in (shape.num_qo_heads, shape.num_kv_heads, shape.num_kv_heads))
    out = []
    for name in backends:
        start = time.perf_counter()
        record = {"backend": name, "status": "built"}
        for causal in (shape.causal, not shape.causal) if name == "fa4" else (shape.causal,):
            try:
                backend = make_backend(name, device, dtype, shape=replace(shape, causal=causal))
            except AttentionBackendError as exc:
                record.update(status="unavailable", error=str(exc)[:400])
                break
            try:
                backend.plan(meta)
                for window in {FULL, shape.window}:  # a model's local layers compile a kernel of their own
                    o = backend.forward(q, k, v, meta, causal, shape.scale, backend.prepare(meta, causal, window),
                                        window)
                    torch.cuda.synchronize(device)
                    if not bool(torch.isfinite(o[: host.num_tokens]).all()):
                        raise RuntimeError("non-finite output")
            except Exception as exc:  # noqa: BLE001 - a JIT or kernel failure is reported, not raised
                record.update(status="failed", error=f"{type(exc).__name__}: {exc}"[:400])
                break
        record["seconds"] = round(time.perf_counter() - start, 2)
        out.append(record)
    return out
