"""CUDA green contexts: streams whose kernels run on a fixed subset of the GPU's SMs.

The express lane (rose.express) needs SMs that bulk kernels do not hold when a query arrives: on a stream of
higher priority alone, each of the query's ~300 kernels still waits for running bulk blocks to retire
(benchmarks/NOTES.md, "The express lane": 9.3 ms beside bulk against 1.34 ms idle). A green context of N SMs
confines whatever runs on its stream to those N; the bulk lane stepping on such a stream leaves the other SMs
free for the express lane, which stays on the whole device.

torch's API for it is in beta and changed between releases (`GreenContext.create(num_sms, device_id)` with
`set_context()` in 2.9-2.10, keyword arguments and `Stream()` later); `green_stream` takes either and raises
`GreenContextUnavailable` where the build, the driver or the API cannot give a stream.
"""

from __future__ import annotations

import torch


class GreenContextUnavailable(RuntimeError):
    """No green-context stream on this build, driver or device."""


def green_stream(num_sms: int, device: int | torch.device | None = None):
    """(context, stream): a CUDA stream whose work runs on `num_sms` SMs (rounded up by the driver to its
    partition granularity: 8 on Hopper). Keep the context alive as long as the stream is used."""
    if not torch.cuda.is_available():
        raise GreenContextUnavailable("CUDA is not available")
    try:
        from torch.cuda.green_contexts import GreenContext
    except ImportError as e:
        raise GreenContextUnavailable(f"torch {torch.__version__} has no torch.cuda.green_contexts") from e
    index = torch.device("cuda", torch.cuda.current_device()).index if device is None else torch.device(device).index
    index = torch.cuda.current_device() if index is None else index
    try:
        try:
            ctx = GreenContext.create(num_sms=num_sms, device_id=index)
        except TypeError:
            ctx = GreenContext.create(num_sms, index)
    except RuntimeError as e:
        raise GreenContextUnavailable(f"green context of {num_sms} SMs: {e}") from e
    if not hasattr(ctx, "Stream"):  # torch 2.9-2.10: only the calling thread's context can be switched
        raise GreenContextUnavailable(f"torch {torch.__version__}'s GreenContext has no Stream()")
    return ctx, ctx.Stream()
