"""Weights from a Hugging Face folder into a model built on the meta device.

Why meta: no memory is touched and no random init runs for weights that are about to be overwritten; each
tensor is read once from its file (memory-mapped: safetensors, or a zip pytorch_model.bin through
torch.load(weights_only=True), see rose.checkpoint) and converted straight to the target device and dtype.
Checkpoint names map onto the model's by (1) stripping a wrapper prefix ("model.", "bert.", "mpnet.", ...),
(2) concatenating the parts of fused projections (the model's FUSED table), (3) old LayerNorm names.
Tensors the model does not use (pooler, lm_head, MLM heads, position_ids buffers) are ignored.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from rose.checkpoint import WeightLoadError, checkpoint_index, iter_tensors
from rose.models import build_model
from rose.spec import ModelSpec

PREFIXES = ("", "model.", "bert.", "roberta.", "xlm_roberta.", "base_model.", "encoder_model.", "mpnet.",
            "distilbert.", "new.")
_ALT_NAMES = {"LayerNorm.weight": "LayerNorm.gamma", "LayerNorm.bias": "LayerNorm.beta"}


def checkpoint_sources(name: str, fused: dict[str, tuple[str, ...]]) -> list[str]:
    """The checkpoint names (before prefixes) whose concatenation is the model's tensor `name`."""
    for target, parts in fused.items():
        marker = target + "."
        if name.startswith(marker) or ("." + marker) in name:
            return [name.replace(marker, part + ".", 1) for part in parts]
    return [name]


def _find(name: str, index: dict[str, Path]) -> str | None:
    candidates = [name]
    for new, old in _ALT_NAMES.items():
        if name.endswith(new):
            candidates.append(name[: -len(new)] + old)
    for prefix in PREFIXES:
        for cand in candidates:
            if prefix + cand in index:
                return prefix + cand
    return None


def _files(index: dict[str, Path]) -> str:
    return ", ".join(sorted({p.name for p in index.values()}))


def load_tensors(model_dir: Path, names: dict[str, tuple[str, ...]],
                 rows: dict[str, list[int]] | None = None) -> dict[str, torch.Tensor]:
    """Checkpoint tensors by name (wrapper prefixes tried as for the model), on the CPU as stored: for each key
    of `names` the first of its candidate names found. `rows` reads only those rows of a tensor (two rows of a
    150k-row lm_head, not all of it). Raises WeightLoadError naming the candidates when none is there."""
    index = checkpoint_index(model_dir)
    found: dict[str, str] = {}
    for key, candidates in names.items():
        hit = next((k for k in (_find(c, index) for c in candidates) if k is not None), None)
        if hit is None:
            raise WeightLoadError(f"{model_dir}: none of {list(candidates)} found in {_files(index)}")
        found[key] = hit
    wanted_rows = {found[key]: ids for key, ids in (rows or {}).items() if key in found}
    tensors = dict(iter_tensors(index, found.values(), rows=wanted_rows))
    return {key: tensors[name] for key, name in found.items()}


def load_model(spec: ModelSpec, device: torch.device, dtype: torch.dtype) -> nn.Module:
    """The model of `spec` with its weights on `device` in `dtype`, in eval mode, without grads."""
    with torch.device("meta"):
        model = build_model(spec)
    index = checkpoint_index(spec.model_dir)
    fused = getattr(model, "FUSED", {})
    expected = model.state_dict()
    sources: dict[str, list[str]] = {}  # every name resolved before any file is read: a missing one fails fast
    for name in expected:
        sources[name] = []
        for source in checkpoint_sources(name, fused):
            key = _find(source, index)
            if key is None:
                raise WeightLoadError(f"{spec.model_dir}: tensor {source!r} not found in {_files(index)}")
            sources[name].append(key)
    load_device = str(device) if device.type == "cuda" else "cpu"
    wanted = [key for keys in sources.values() for key in keys]
    parts = {key: t.to(device=device, dtype=dtype) for key, t in iter_tensors(index, wanted, load_device)}
    state: dict[str, torch.Tensor] = {}
    for name, keys in sources.items():  # a fused projection's parts are dropped once concatenated
        tensor = parts[keys[0]] if len(keys) == 1 else torch.cat([parts.pop(k) for k in keys], dim=0)
        if tuple(tensor.shape) != tuple(expected[name].shape):
            raise WeightLoadError(
                f"{spec.model_dir}: tensor {name!r} has shape {tuple(tensor.shape)}, "
                f"config.json implies {tuple(expected[name].shape)}")
        state[name] = tensor
    del parts
    model.load_state_dict(state, strict=True, assign=True)
    for module in model.modules():  # non-persistent buffers (RoPE frequencies) were built on the CPU
        for bname, buf in list(module._buffers.items()):
            if buf is not None and buf.device != device:
                module._buffers[bname] = buf.to(device)
    model.eval()
    model.requires_grad_(False)
    return model
