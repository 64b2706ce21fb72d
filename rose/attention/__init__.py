"""Attention backends behind one interface, and the one factory that picks among them.

Names: sdpa (torch SDPA; CPU and CUDA), varlen (torch's ragged FlashAttention-2; CUDA), flashinfer-fa2 and
flashinfer-fa3 (FlashInfer's ragged prefill; fa3 on Hopper only; extra `flashinfer`), fa4 (FlashAttention 4;
Hopper/Blackwell; extra `fa4`), triton (rose.attention.triton_varlen: ROSE's own ragged kernel; CUDA, Triton
ships with torch), and auto, the default:
- on CUDA in half precision with a serving profile beside the model (MODEL_DIR/rose_profile.json, written by
  `python -m benchmarks.attention_ab`): the measured winner per token bucket (rose.attention.profile);
  a backend the profile names that cannot run here falls back to the default below, with a warning;
- otherwise the documented default: on CUDA in float16/bfloat16, triton (ROSE's own kernel) where it runs the
  model's attention (Triton present, sm80+, a power-of-two head dim from 16 to 256), sliding windows (Gemma 3,
  Mistral, ModernBERT's local layers) and MPNet's position bias included; else varlen when torch has it; sdpa
  elsewhere. On the H200 triton beat torch's varlen at every token bucket of the Qwen3-0.6B and MiniLM shapes,
  varlen's window on ModernBERT-base (+8 % documents a second) and EmbeddingGemma-300m (+28 %), and MPNet's
  banded path 2.1 × (benchmarks/NOTES.md, "ROSE's own ragged attention in Triton").
A backend asked for by name that cannot run here raises AttentionBackendError naming the reason (and the
pip extra when its package is missing).
"""

from __future__ import annotations

import logging

import torch

from rose.attention.base import (
    AttentionBackend,
    AttentionBackendError,
    AttentionContext,
)
from rose.attention.profile import (
    PROFILE_NAME,
    ServingProfile,
    backend_from_profile,
    profile_path,
)
from rose.attention.sdpa import SdpaBackend
from rose.attention.shape import AttentionShape
from rose.attention.varlen import SUPPORTED_DTYPES as _VARLEN_DTYPES
from rose.attention.varlen import VarlenBackend, varlen_available

BACKENDS = ("auto", "sdpa", "varlen", "flashinfer-fa2", "flashinfer-fa3", "fa4", "triton")
log = logging.getLogger("rose.attention")

__all__ = ["BACKENDS", "PROFILE_NAME", "AttentionBackend", "AttentionBackendError", "AttentionContext",
           "AttentionShape", "ServingProfile", "default_backend_name", "make_backend"]


def default_backend_name(device: torch.device, dtype: torch.dtype, shape: AttentionShape | None = None) -> str:
    """What auto uses without a serving profile (module docstring)."""
    if device.type == "cuda" and shape is not None:
        from rose.attention.triton_varlen import check_supported

        try:
            check_supported(device, dtype, shape)
            return "triton"
        except AttentionBackendError:
            pass
    return "varlen" if device.type == "cuda" and varlen_available() and dtype in _VARLEN_DTYPES else "sdpa"


def make_backend(name: str, device: torch.device, dtype: torch.dtype, spec=None,
                 shape: AttentionShape | None = None, profile: ServingProfile | None = None) -> AttentionBackend:
    """The attention backend `name` for this device and dtype. `spec` (a ModelSpec) gives the attention
    shape and the profile's folder; `shape` and `profile` override them (benchmarks, tests)."""
    if shape is None and spec is not None:
        shape = AttentionShape.from_spec(spec)
    if name == "auto":
        return _auto(device, dtype, spec, shape, profile)
    if name == "sdpa":
        return SdpaBackend(device)
    if name == "varlen":
        return VarlenBackend(device, dtype)
    if name in ("flashinfer-fa2", "flashinfer-fa3"):
        if shape is None:
            raise AttentionBackendError(f"attention {name!r} plans per model: it needs the model's attention shape")
        from rose.attention.flashinfer import FlashInferBackend

        return FlashInferBackend(device, dtype, shape, variant=name.rsplit("-", 1)[1])
    if name == "fa4":
        from rose.attention.fa4 import Fa4Backend

        return Fa4Backend(device, dtype, shape)
    if name == "triton":
        from rose.attention.triton_varlen import TritonBackend

        return TritonBackend(device, dtype, shape)
    raise AttentionBackendError(f"unknown attention backend {name!r}; expected one of {', '.join(BACKENDS)}")


def _auto(device: torch.device, dtype: torch.dtype, spec, shape: AttentionShape | None,
          profile: ServingProfile | None) -> AttentionBackend:
    fallback = default_backend_name(device, dtype, shape)
    measured_here = device.type == "cuda" and dtype in (torch.float16, torch.bfloat16)  # what profiles measure
    if profile is None and spec is not None and measured_here:
        path = profile_path(spec.model_dir)
        if path.is_file():
            try:
                profile = ServingProfile.load(path)
            except AttentionBackendError as exc:
                log.warning("ignoring the serving profile: %s; attention %s", exc, fallback)
    if profile is None or not measured_here:
        return make_backend(fallback, device, dtype, shape=shape)
    if shape is not None and "causal" in profile.info and bool(profile.info["causal"]) != shape.causal:
        log.warning("the serving profile was measured with causal=%s attention; this model's is causal=%s",
                    profile.info["causal"], shape.causal)
    return backend_from_profile(profile, lambda n: make_backend(n, device, dtype, shape=shape), fallback,
                                log.warning)
