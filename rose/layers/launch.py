"""Programmatic dependent launch (PDL) for ROSE's Triton kernels, on Hopper and later.

Inside a whole-model CUDA graph a kernel node still starts only once its predecessor has finished and its
writes are flushed: its blocks are then dispatched and run their prologue, ~1-2 µs per edge that the small
batches' ~250 kernels pay in series. Launched with PDL, a kernel's blocks may start while the one before it
is still finishing; each block first does what needs nothing from that kernel (the norm weights), then waits
in `griddepcontrol.wait` (`tl.extra.cuda.gdc_wait`) until the predecessor has completed and flushed, and
only then reads its inputs and writes. After that wait it lets its own dependents launch
(`gdc_launch_dependents`): they wait for its completion in turn, so every edge keeps the stream's order for
memory. cuBLAS's kernels are launched without PDL and keep their ordinary edges.

ROSE_PROGRAMMATIC_LAUNCH=1 turns it on (compute capability 9.0 and later only; elsewhere it is never used).
"""

from __future__ import annotations

import os

import torch

ENABLED = os.environ.get("ROSE_PROGRAMMATIC_LAUNCH", "0").strip().lower() not in ("0", "false", "off", "no")
_CAPABLE: dict[int, bool] = {}


def programmatic(t: torch.Tensor) -> bool:
    """Whether kernels writing for `t`'s device launch with PDL (ENABLED, CUDA, compute capability >= 9)."""
    if not ENABLED or not t.is_cuda:
        return False
    index = t.device.index if t.device.index is not None else torch.cuda.current_device()
    capable = _CAPABLE.get(index)
    if capable is None:
        capable = _CAPABLE[index] = torch.cuda.get_device_capability(index)[0] >= 9
    return capable


def launch_options(pdl: bool) -> dict:
    """The Triton launch keyword for PDL, only when on (the CPU interpreter takes no such keyword)."""
    return {"launch_pdl": True} if pdl else {}
