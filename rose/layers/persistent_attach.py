"""Which model gets the persistent decoder (rose.layers.persistent_decoder), and from when it serves: `attach`
builds it where the setting (rose.persistent_routing) and the model allow, `enable` compiles and launches it and
routes the model's small batches to it (the engine's warm-up, after the kernels compiled ahead), `bound_for` is
the largest batch it takes."""

from __future__ import annotations

import logging

import torch

from rose.layers import persistent_decoder
from rose.layers.persistent_decoder import PersistentDecoder
from rose.layers.persistent_models import is_encoder, shapes, unsupported
from rose.persistent_routing import AUTO, MAX_TOKENS, MEASURED, ON, ROUTED_TOKENS

log = logging.getLogger("rose.persistent_decoder")  # its messages under the name they always had


def bound_for(model, routed: int) -> int:
    """routed_tokens' setting -> the largest batch routed to the kernel for this (supported) model: ON its
    family's, AUTO its shape's measured bound (0: not measured)."""
    family = "encoder" if is_encoder(model) else "decoder"
    if routed == ON:
        return ROUTED_TOKENS[family]
    return MEASURED.get((family, *shapes(model)), 0) if routed == AUTO else routed


def attach(model, backend, routed: int, warm: bool = True) -> PersistentDecoder | None:
    """Where `routed` (tokens, ON or AUTO: routed_tokens) is not 0, the model is supported (a Qwen3 decoder or a
    BERT-style encoder: persistent_models.unsupported) and its weights are bf16 or fp16 on CUDA: build the persistent
    decoder, compile and launch it for every token block it will serve (warm), and set it as `model.persistent`
    (the model's forward then runs batches of up to `routed` tokens through it, with `backend`'s forwards only).
    Returns it, or None with the reason logged. warm=False: built only, not yet routed to; `enable` warms it and
    routes to it later (the engine's warm-up: after the kernels compiled ahead, with the kernel manifest
    recording this kernel's variants too)."""
    if routed == 0 or persistent_decoder.triton is None or not hasattr(model, "persistent"):
        return None
    if routed < 0 and routed not in (ON, AUTO):
        raise ValueError(f"persistent decoder: {routed} tokens (off 0, on {ON}, auto {AUTO}, or a bound of 2 to "
                         f"{MAX_TOKENS})")
    weight = next(model.parameters())
    reason = unsupported(model) or ("weights not on CUDA" if not weight.is_cuda else None) or (
        None if weight.dtype in (torch.bfloat16, torch.float16) else f"{weight.dtype} weights (bf16 or fp16 only)")
    if reason:
        log.info("persistent decoder off: %s", reason)
        return None
    routed = bound_for(model, routed)
    if not routed:
        log.info("persistent decoder off: auto, and this layer shape %s was not measured faster", shapes(model))
        return None
    try:
        decoder = PersistentDecoder(model, routed=routed, backend=backend)
    except Exception as exc:  # noqa: BLE001 - the layer-by-layer path serves (it reads the same weights)
        log.warning("persistent decoder off: %s", exc)
        return None
    return decoder if not warm or enable(model, decoder) else None


def enable(model, decoder: PersistentDecoder) -> bool:
    """Warm `decoder` (attach's, built for `model`) and route `model`'s small batches to it; False, with the
    reason logged and the layers serving, when its launch fails or its grid stalls (fewer SMs than reported)."""
    try:
        decoder.warm()
    except Exception as exc:  # noqa: BLE001 - the layer-by-layer path serves (it reads the same weights)
        log.warning("persistent decoder off: %s", exc)
        return False
    model.persistent = decoder
    log.info("persistent decoder on for batches of up to %d tokens (%d programs)", decoder.routed, decoder.programs)
    return True
