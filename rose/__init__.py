"""ROSE: the Runtime-Optimized Serving Engine (a library that Tulip drives in-process).

This module imports no torch: the gateway imports ``rose.tokenizer`` and ``rose.spec`` only, and its
image carries no torch. ``rose.Engine`` is resolved lazily on first access.
"""

from rose.batch import Batch
from rose.head import Encoding, OutputOptions, apply_head

__version__ = "0.1.0"
__all__ = ["Batch", "Encoding", "OutputOptions", "apply_head", "Engine", "LazyTensor", "__version__"]


def __getattr__(name: str):
    if name == "Engine":
        from rose.engine import Engine

        return Engine
    if name == "LazyTensor":
        from rose.lazy import LazyTensor

        return LazyTensor
    raise AttributeError(f"module 'rose' has no attribute {name!r}")
