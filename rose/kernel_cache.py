"""Where compiled kernels live: ROSE_KERNEL_CACHE_DIR points the JIT libraries' caches into one directory.

FlashInfer reads FLASHINFER_WORKSPACE_BASE and FA4 FLASH_ATTENTION_CUTE_DSL_CACHE_DIR when they are imported, so
use_kernel_cache() runs before either is (rose.attention.kernels builds them ahead). ROSE's own Triton kernels
compile at a replica's first start (rose.kernel_ahead compiles them ahead): TRITON_CACHE_DIR goes under the
same directory when it is writable, so the next start finds them. Torch-free: Tulip points the caches before it
imports the engine.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

log = logging.getLogger("rose.kernel_cache")
CACHE_ENV = "ROSE_KERNEL_CACHE_DIR"


def use_kernel_cache(cache_dir: str | Path | None = None) -> Path | None:
    """Point the JIT caches at `cache_dir` (default: $ROSE_KERNEL_CACHE_DIR; None = the libraries' own
    defaults). An explicit directory wins over variables already set; the variable only fills gaps."""
    explicit = cache_dir is not None
    cache_dir = cache_dir or os.environ.get(CACHE_ENV)
    if not cache_dir:
        return None
    root = Path(cache_dir).expanduser().resolve()
    settings = {"FLASHINFER_WORKSPACE_BASE": str(root / "flashinfer"),
                "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED": "1",
                "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR": str(root / "fa4")}
    wants_triton = explicit or "TRITON_CACHE_DIR" not in os.environ
    if wants_triton and _writable(root / "triton"):  # a read-only cache would fail Triton's first compile
        settings["TRITON_CACHE_DIR"] = str(root / "triton")
    for key, value in settings.items():
        if explicit or key not in os.environ:
            os.environ[key] = value
    for module in ("flashinfer", "flash_attn.cute"):
        if module in sys.modules and explicit:
            log.warning("%s was imported before the kernel cache was set; it keeps its old cache dir", module)
    os.environ.setdefault(CACHE_ENV, str(root))
    return root


def _writable(path: Path) -> bool:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return os.access(path, os.W_OK)
