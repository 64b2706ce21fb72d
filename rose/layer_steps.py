"""A batch stepped one decoder layer at a time, so other work can reach the device between its layers.

On one CUDA stream a query queued behind a bulk batch waits for the whole batch (the Qwen3-0.6B on the H200:
~30 ms for 8192 tokens), and beside it on a higher-priority stream it still crawls, its kernels taking SMs
only as the bulk's blocks drain (rose/express.py; `benchmarks/NOTES.md`, "The express lane"). Stepped layer
by layer, with the caller putting at most a layer or two of it on the stream ahead of time, the bulk batch
leaves a query behind at most that much (~1 ms a layer at 8192 tokens), and the query's own batch (a graph
replay, or a step of its own) follows on the same stream at full speed.

`step_layers(runner, batch)` is a generator: each `next()` enqueues one more layer's kernels (the first also
packs, stages and plans the batch, eagerly at its exact size: ModelRunner.eager_meta) and yields None; the
`next()` after the last layer enqueues the pooling and the copy back and yields the LazyTensor of the rows:

    steps = step_layers(runner, batch)
    while (lazy := next(steps)) is None: ...   # between layers: pace, or step another batch

The runner's lock is held only while a layer is enqueued, so another thread's `runner.step` may enqueue its
batch between two layers. A backend whose plan leaves state for the eager forwards after it (FlashInfer's one
eager slot: `host_plan_state`) is planned again for this batch before each layer, since a batch stepped
between two layers may have planned it for itself. Only models with `forward_layers` (rose.models.qwen3: Qwen3,
Qwen3-Embedding, pplx-embed, Qwen2, Mistral) can be stepped so; the others raise TypeError.
"""

from __future__ import annotations

from collections.abc import Generator

import torch

from rose.batch import Batch
from rose.lazy import LazyTensor


def step_layers(runner, batch: Batch) -> Generator[LazyTensor | None, None, None]:
    """Yields None after each layer, then the LazyTensor of `batch`'s rows (module docstring). `runner` is a
    rose.runner.ModelRunner."""
    layers = getattr(runner.model, "forward_layers", None)
    if layers is None:
        raise TypeError(f"{type(runner.model).__name__} cannot be stepped layer by layer (no forward_layers)")
    host = runner.pack(batch)
    if host.num_rows == 0:
        yield LazyTensor(None, None, (0, runner.dimensions))
        return
    buf = runner.pool.acquire(runner._buffer_bytes(host))
    lock = runner._lock
    try:
        with lock, torch.inference_mode(), runner.device_scope():
            meta = runner.eager_meta(host, runner._stage(host, buf))
            hidden = layers(meta, runner.backend)
        replan = bool(getattr(runner.backend, "host_plan_state", False))
        last = None  # the hidden states after the latest layer
        while True:
            with lock, torch.inference_mode(), runner.device_scope():
                if last is None or replan:  # the lock was let go since the last plan: plan under it
                    runner.backend.plan(meta)
                h = next(hidden, None)
                if h is not None:
                    last = h
                else:
                    event = runner._copy_back(runner.pooled_rows(last, meta), host, buf)
                    runner._count(host, None, "eager")
                    break
            yield None
    except BaseException:
        runner._release_after_failure(buf)
        raise
    lazy = LazyTensor(runner.pool, buf, (host.num_rows, runner.dimensions), event)
    lazy.padded_tokens = host.layout.tokens
    yield lazy
