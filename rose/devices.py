"""Which device and dtype an engine runs on, from what a caller or a flag names (None: the machine's default), and
whether that device still runs work."""

from __future__ import annotations

import ctypes
import logging
import threading

import torch

log = logging.getLogger("rose.devices")

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
    """Whether `device` still runs work: a tiny step and its copy back on a stream made for this alone (torch's
    pooled streams are shared, a graph capture's among them), waited for by that stream only (a device-wide
    synchronize must not meet a capture on another thread; the stream is a blocking one, so the step also waits for
    work already on the legacy default stream, the bulk lane's batch in flight). After a CUDA error that poisons the
    context (an illegal address, a device-side assert, an uncorrectable ECC error, a GPU gone from the bus) every
    later call fails, this one too; an error of one batch's own (a bad input, out of memory, here too) leaves it
    True, and so does a graph capture in progress (it is not asked then: the next failure asks again). A CPU always
    runs (tulip.device_check, RELIABILITY 62)."""
    if device.type != "cuda":
        return True
    from rose.graphs import capturing  # rose.graphs imports torch's CUDA graph machinery: only where a GPU is

    if capturing():
        return True
    try:
        with torch.cuda.device(device), torch.cuda.stream(_probe_stream(device)):
            return float((torch.ones(1, device=device) + 1).cpu()) == 2.0
    except torch.OutOfMemoryError:  # memory is full, not the context poisoned: a later batch may fit
        return True
    except Exception:  # noqa: BLE001 - whatever else the runtime raises, the device did not run the step
        return False


_probe_streams: dict[int, torch.cuda.ExternalStream] = {}
_probe_lock = threading.Lock()


def prepare_probe(device: torch.device) -> None:
    """Make device_runs' stream now (an engine's warm-up), not on the failure path, where a recoverable error (memory
    full) could fail its making and be read as a lost device; a failure here only logs (device_runs tries again)."""
    if device.type != "cuda":
        return
    try:
        _probe_stream(device)
    except Exception:  # noqa: BLE001
        log.warning("could not make the device probe's stream now; it is made when first needed", exc_info=True)


def _probe_stream(device: torch.device) -> torch.cuda.ExternalStream:
    """device_runs' own stream on `device`, made once (cudaStreamCreate: no pool shares it)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    with _probe_lock:  # the bulk and express workers' completers may both probe first
        stream = _probe_streams.get(index)
        if stream is None:
            handle = ctypes.c_void_p()
            with torch.cuda.device(index):
                torch.cuda.check_error(torch.cuda.cudart().cudaStreamCreate(ctypes.addressof(handle)))
            stream = torch.cuda.ExternalStream(handle.value, device=torch.device("cuda", index))
            _probe_streams[index] = stream
    return stream
