"""Weights from a Hugging Face folder into a model built on the meta device.

Why meta: no memory is touched and no random init runs for weights that are about to be overwritten;
each tensor is read once from safetensors (memory-mapped) straight onto the target device and dtype.
Checkpoint names map onto the model's by (1) stripping a wrapper prefix ("model.", "bert.", "mpnet.", ...),
(2) concatenating the parts of fused projections (the model's FUSED table), (3) old LayerNorm names.
Tensors the model does not use (pooler, lm_head, MLM heads, position_ids buffers) are ignored.
"""

from __future__ import annotations

import json
from contextlib import ExitStack
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from rose.models import build_model
from rose.spec import ModelFolderError, ModelSpec

PREFIXES = ("", "model.", "bert.", "roberta.", "xlm_roberta.", "base_model.", "encoder_model.", "mpnet.",
            "distilbert.", "new.")
_ALT_NAMES = {"LayerNorm.weight": "LayerNorm.gamma", "LayerNorm.bias": "LayerNorm.beta"}
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


class WeightLoadError(ModelFolderError):
    """A weight file or tensor is missing, or a tensor has the wrong shape."""


def checkpoint_index(model_dir: Path) -> dict[str, Path]:
    """tensor name -> the safetensors file holding it (single file, or sharded with an index)."""
    single, index = model_dir / SINGLE_FILE, model_dir / INDEX_FILE
    if single.is_file():
        with safe_open(str(single), framework="pt") as f:
            return {name: single for name in f.keys()}
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (json.JSONDecodeError, KeyError, UnicodeDecodeError) as exc:
            raise WeightLoadError(f"{index}: not a safetensors index ({exc})") from None
        out = {name: model_dir / shard for name, shard in weight_map.items()}
        for shard in sorted(set(out.values())):
            if not shard.is_file():
                raise WeightLoadError(f"{shard}: shard named in {INDEX_FILE} not found")
        return out
    others = sorted(p.name for p in model_dir.glob("*.bin")) + sorted(p.name for p in model_dir.glob("*.pt"))
    hint = f" (found {', '.join(others)}: convert to safetensors)" if others else ""
    raise WeightLoadError(f"{model_dir}: no {SINGLE_FILE} or {INDEX_FILE}{hint}")


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


def load_tensors(model_dir: Path, names: dict[str, tuple[str, ...]],
                 rows: dict[str, list[int]] | None = None) -> dict[str, torch.Tensor]:
    """Checkpoint tensors by name (wrapper prefixes tried as for the model), on the CPU as stored: for each key
    of `names` the first of its candidate names found. `rows` reads only those rows of a tensor (two rows of a
    150k-row lm_head, not all of it). Raises WeightLoadError naming the candidates when none is there."""
    index = checkpoint_index(model_dir)
    out: dict[str, torch.Tensor] = {}
    for key, candidates in names.items():
        found = next((k for k in (_find(c, index) for c in candidates) if k is not None), None)
        if found is None:
            files = ", ".join(sorted({p.name for p in index.values()}))
            raise WeightLoadError(f"{model_dir}: none of {list(candidates)} found in {files}")
        with safe_open(str(index[found]), framework="pt", device="cpu") as f:
            if rows is not None and key in rows:
                part = f.get_slice(found)
                n = int(part.get_shape()[0])
                if any(not 0 <= r < n for r in rows[key]):
                    raise WeightLoadError(f"{model_dir}: rows {rows[key]} of {found!r} outside its {n}")
                out[key] = torch.cat([part[r:r + 1] for r in rows[key]], dim=0)
            else:
                out[key] = f.get_tensor(found)
    return out


def load_model(spec: ModelSpec, device: torch.device, dtype: torch.dtype) -> nn.Module:
    """The model of `spec` with its weights on `device` in `dtype`, in eval mode, without grads."""
    with torch.device("meta"):
        model = build_model(spec)
    index = checkpoint_index(spec.model_dir)
    fused = getattr(model, "FUSED", {})
    expected = model.state_dict()
    state: dict[str, torch.Tensor] = {}
    load_device = str(device) if device.type == "cuda" else "cpu"
    with ExitStack() as stack:
        handles: dict[Path, object] = {}

        def read(key: str) -> torch.Tensor:
            path = index[key]
            if path not in handles:
                handles[path] = stack.enter_context(safe_open(str(path), framework="pt", device=load_device))
            return handles[path].get_tensor(key)  # type: ignore[attr-defined]

        for name, meta_tensor in expected.items():
            parts = []
            for source in checkpoint_sources(name, fused):
                key = _find(source, index)
                if key is None:
                    files = ", ".join(sorted({p.name for p in index.values()}))
                    raise WeightLoadError(f"{spec.model_dir}: tensor {source!r} not found in {files}")
                parts.append(read(key))
            tensor = parts[0] if len(parts) == 1 else torch.cat(parts, dim=0)
            if tuple(tensor.shape) != tuple(meta_tensor.shape):
                raise WeightLoadError(
                    f"{spec.model_dir}: tensor {name!r} has shape {tuple(tensor.shape)}, "
                    f"config.json implies {tuple(meta_tensor.shape)}")
            state[name] = tensor.to(device=device, dtype=dtype)
    model.load_state_dict(state, strict=True, assign=True)
    for module in model.modules():  # non-persistent buffers (RoPE frequencies) were built on the CPU
        for bname, buf in list(module._buffers.items()):
            if buf is not None and buf.device != device:
                module._buffers[bname] = buf.to(device)
    model.eval()
    model.requires_grad_(False)
    return model
