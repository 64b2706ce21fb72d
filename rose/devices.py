"""Which device and dtype an engine runs on, from what a caller or a flag names (None: the machine's default), and
whether that device still runs work."""

from __future__ import annotations

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(device: str | torch.device | None) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {device!r} requested but CUDA is not available")
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
    elif dev.type != "cpu":
        raise ValueError(f"unsupported device {device!r}; expected cpu, cuda or cuda:N")
    return dev


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    if dtype is None:
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return DTYPES[dtype]
    except KeyError:
        raise ValueError(f"unsupported dtype {dtype!r}; expected one of {', '.join(DTYPES)}") from None


def device_runs(device: torch.device) -> bool:
    """Whether `device` still runs work: a tiny step and its copy back on a stream of their own, waited for by that
    stream alone (no device-wide synchronize, which a graph capture on another thread must not meet). After a CUDA
    error that poisons the context (an illegal address, a device-side assert, an uncorrectable ECC error, a GPU
    gone from the bus) every later call fails, this one too; an error of one batch's own (out of memory, a bad
    input) leaves it True. A CPU always runs (tulip.device_check, RELIABILITY 62)."""
    if device.type != "cuda":
        return True
    try:
        with torch.cuda.device(device), torch.cuda.stream(torch.cuda.Stream(device)):
            return float((torch.ones(1, device=device) + 1).cpu()) == 2.0
    except torch.OutOfMemoryError:  # memory is full, not the context poisoned: a later batch may fit
        return True
    except Exception:  # noqa: BLE001 - whatever else the runtime raises, the device did not run the step
        return False
