"""The weight files of a Hugging Face folder, and one reader over both formats they come in.

Weights are safetensors (model.safetensors, or shards named by model.safetensors.index.json) or, in older
BERT / XLM-R checkpoints and some cross-encoders, PyTorch pickles (pytorch_model.bin, or shards named by
pytorch_model.bin.index.json: the same weight_map). Safetensors wins when both are there: it is read without
unpickling anything. `checkpoint_index` says which file holds each tensor; `iter_tensors` reads them file by
file through `open_weights`, whose readers answer the same three calls (keys, get, rows) for either format, so
the loader has one path.

Why weights_only=True: unpickling calls whatever callables the pickle names. torch's weights_only unpickler
allows tensors, their storages and plain containers, and raises UnpicklingError before calling anything else;
that becomes a WeightLoadError naming the file. Why mmap: a zip .bin (torch >= 1.6) is mapped rather than read,
so a shard costs page cache, not process memory, and a few rows of a huge tensor touch only their pages. The
legacy (non-zip) format cannot be mapped: it is read whole, one file at a time.
"""

from __future__ import annotations

import json
import pickle
import re
import zipfile
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors import safe_open

from rose.spec import ModelFolderError

FORMATS = (("model.safetensors", "model.safetensors.index.json"),  # (single file, sharded index), preferred first
           ("pytorch_model.bin", "pytorch_model.bin.index.json"))
_OTHER_WEIGHTS = ("*.bin", "*.pt", "*.pth", "*.ckpt", "*.h5", "*.msgpack")


class WeightLoadError(ModelFolderError):
    """A weight file or tensor is missing, unreadable or refused, or a tensor has the wrong shape."""


def checkpoint_index(model_dir: Path) -> dict[str, Path]:
    """tensor name -> the file holding it, from the first of FORMATS present (its single file, else its index).
    A single .bin is loaded here for its names and again when read: mapped, that costs its pickle, not its tensors."""
    for single, index in FORMATS:
        if (model_dir / single).is_file():
            with open_weights(model_dir / single) as f:
                return dict.fromkeys(f.keys(), model_dir / single)
        if (model_dir / index).is_file():
            return _sharded(model_dir / index)
    names = [name for pair in FORMATS for name in pair]
    others = sorted({p.name for pattern in _OTHER_WEIGHTS for p in model_dir.glob(pattern)})
    hint = f" (found {', '.join(others)}: convert to safetensors)" if others else ""
    raise WeightLoadError(f"{model_dir}: no {', '.join(names[:-1])} or {names[-1]}{hint}")


def _sharded(index: Path) -> dict[str, Path]:
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        out = {name: index.parent / shard for name, shard in weight_map.items()}
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError, UnicodeDecodeError) as exc:
        raise WeightLoadError(f"{index}: not a checkpoint index ({exc})") from None
    for shard in sorted(set(out.values())):
        if not shard.is_file():
            raise WeightLoadError(f"{shard}: shard named in {index.name} not found")
    return out


def iter_tensors(index: Mapping[str, Path], names: Iterable[str], device: str = "cpu",
                 rows: Mapping[str, list[int]] | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) for each of `names`, as stored, on `device`: file by file, each opened once and only one
    open at a time (a legacy .bin is held whole while it is read). rows[name] reads only those rows."""
    by_file: dict[Path, list[str]] = {}
    for name in dict.fromkeys(names):
        by_file.setdefault(index[name], []).append(name)
    for path, in_file in by_file.items():
        with open_weights(path, device) as f:
            for name in in_file:
                yield name, (f.rows(name, rows[name]) if rows and name in rows else f.get(name))
        del f  # a legacy .bin's state dict goes before the next file is read


@contextmanager
def open_weights(path: Path, device: str = "cpu") -> Iterator[SafetensorsFile | PickleFile]:
    """One weights file's reader, chosen by its suffix. On the CPU a tensor it returns may stay backed by the
    mapped file, for either format (safe_open maps too): nothing is copied that the caller does not convert."""
    if path.suffix == ".safetensors":
        with safe_open(str(path), framework="pt", device=device) as handle:
            yield SafetensorsFile(path, handle)
    else:
        yield PickleFile(path, _load_pickle(path), device)


class SafetensorsFile:
    """A safetensors file through safe_open: memory-mapped, each tensor read on request, slices without the rest."""

    def __init__(self, path: Path, handle) -> None:
        self.path, self._f = path, handle

    def keys(self) -> list[str]:
        return list(self._f.keys())

    def get(self, name: str) -> torch.Tensor:
        return self._f.get_tensor(name)

    def rows(self, name: str, rows: list[int]) -> torch.Tensor:
        part = self._f.get_slice(name)
        _check_rows(self.path, name, rows, int(part.get_shape()[0]))
        return torch.cat([part[r:r + 1] for r in rows], dim=0)


class PickleFile:
    """A .bin's state dict, loaded once (its tensors mapped from the file when it is a zip)."""

    def __init__(self, path: Path, state: dict[str, torch.Tensor], device: str) -> None:
        self.path, self._state, self._device = path, state, device

    def keys(self) -> list[str]:
        return list(self._state)

    def get(self, name: str) -> torch.Tensor:
        return self._state[name].to(self._device)

    def rows(self, name: str, rows: list[int]) -> torch.Tensor:
        tensor = self._state[name]
        _check_rows(self.path, name, rows, tensor.shape[0])
        return tensor[rows].to(self._device)  # indexing gathers a copy of those rows only


def _check_rows(path: Path, name: str, rows: list[int], n: int) -> None:
    if any(not 0 <= r < n for r in rows):
        raise WeightLoadError(f"{path}: rows {rows} of {name!r} outside its {n}")


def _load_pickle(path: Path) -> dict[str, torch.Tensor]:
    """torch.load with weights_only=True (never anything else), mapped when the file is a zip."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=zipfile.is_zipfile(path))
    except pickle.UnpicklingError as exc:
        found = re.search(r"WeightsUnpickler error:\s*(.+?)(?:\.\s|\n|$)", str(exc))
        raise WeightLoadError(
            f"{path}: refused: not a plain state dict of tensors{f' ({found.group(1)})' if found else ''}; ROSE "
            f"reads .bin files with torch.load(weights_only=True) and never runs what a pickle names (convert a "
            f"checkpoint you trust to safetensors)") from None
    except Exception as exc:  # noqa: BLE001 - torch raises EOFError, KeyError, RuntimeError... on damaged files
        raise WeightLoadError(f"{path}: not a readable PyTorch checkpoint ({type(exc).__name__}: {exc})") from None
    if not isinstance(state, Mapping):
        raise WeightLoadError(f"{path}: holds a {type(state).__name__}, not a state dict of tensors")
    return {name: t for name, t in state.items() if isinstance(t, torch.Tensor)}
