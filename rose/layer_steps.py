"""A batch stepped one decoder layer at a time, so other work can reach the device between its layers.

On one CUDA stream a query queued behind a bulk batch waits for the whole batch (the Qwen3-0.6B on the H200:
~30 ms for 8192 tokens), and beside it on a higher-priority stream it still crawls, its kernels taking SMs
only as the bulk's blocks drain (rose/express.py; `benchmarks/NOTES.md`, "The express lane"). Stepped layer
by layer, with the caller putting at most a layer or two of it on the stream ahead of time, the bulk batch
leaves a query behind at most that much (~1 ms a layer at 8192 tokens), and the query's own batch (a graph
replay, or a step of its own) follows on the same stream at full speed.

`step_layers(runner, batch)` is a generator: each `next()` enqueues one more layer's kernels and yields None,
and the `next()` that enqueues the last layer also enqueues the pooling and the copy back and yields the
LazyTensor of the rows (so a model of L layers yields None L - 1 times):

    steps = step_layers(runner, batch)
    while (lazy := next(steps)) is None: ...   # between layers: pace, or step another batch

On a GPU with whole-model graphs the batch is padded to its bucket layout and its layers replay from a chain of
per-layer CUDA graphs (rose.layer_graphs: captured at the layout's second stepping, checked against eager;
`layers_per_graph` layers a step); otherwise, and with graphs=False, it runs eagerly (at its exact size, or at
the bucket layout while that layout's chain is not captured yet: rose.layer_graphs.eager_layer_steps).

The runner's lock is held only while a step is enqueued, so another thread's `runner.step` may enqueue its
batch between two layers. A backend whose plan leaves state for the eager forwards after it (FlashInfer's one
eager slot: `host_plan_state`) is planned again for this batch before each eager layer, since a batch stepped
between two layers may have planned it for itself; such a backend gets no chains. Only models with
`forward_layers` (rose.models.qwen3: Qwen3, Qwen3-Embedding, pplx-embed, Qwen2, Mistral) can be stepped so;
the others raise TypeError.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Generator

import torch

from rose.batch import Batch
from rose.layer_graphs import eager_layer_steps
from rose.lazy import LazyTensor


def step_layers(runner, batch: Batch, graphs: bool = True) -> Generator[LazyTensor | None, None, None]:
    """Yields None after each layer (or chain graph), then the LazyTensor of `batch`'s rows (module docstring).
    `runner` is a rose.runner.ModelRunner; graphs=False steps eagerly at the exact size whatever the runner has."""
    if getattr(runner.model, "forward_layers", None) is None:
        raise TypeError(f"{type(runner.model).__name__} cannot be stepped layer by layer (no forward_layers)")
    chains = runner.layer_chains() if graphs else None
    layout = None
    if chains is not None and batch.num_seqs:
        layout = chains.layout_for(batch.num_tokens, batch.num_seqs, batch.num_rows, int(batch.seq_lens.max()))
    host = runner.pack(batch, layout)
    if host.num_rows == 0:
        yield LazyTensor(None, None, (0, runner.dimensions))
        return
    buf = runner.pool.acquire(runner._buffer_bytes(host))
    lock, steps = runner._lock, None
    try:
        with lock, torch.inference_mode(), runner.device_scope():
            staged = runner._stage(host, buf)
            steps = chains.steps(host, staged) if layout is not None else eager_layer_steps(runner, host, staged)
        while True:
            with lock, torch.inference_mode(), runner.device_scope():
                last = next(steps)
                if last is not None:
                    rows, how = last
                    event = runner._copy_back(rows, host, buf)
                    runner._count(host, layout, how)
                    break
            yield None
    except BaseException:
        runner._release_after_failure(buf)
        raise
    finally:
        if steps is not None:
            steps.close()  # an abandoned or failed stepping lets go of the chains' lock now, not at collection
    lazy = LazyTensor(runner.pool, buf, (host.num_rows, runner.dimensions), event)
    lazy.padded_tokens = host.layout.tokens
    lazy.cold = layout is not None and how != "layers"  # a capture or an eager run of a graph layout
    yield lazy


def step_paced(runner, batch: Batch, ahead: int, graphs: bool = True) -> LazyTensor:
    """`batch` stepped to its end with at most `ahead` of its steps on the device ahead of the host: before each
    step the host waits (an event, the GIL released) until fewer than `ahead` are still on the stream. Returns
    the LazyTensor once the last step is enqueued, i.e. about `ahead` steps before the rows are ready; work
    another thread enqueues meanwhile (a query's step) runs between two of its steps. On a CPU it simply runs."""
    if ahead < 1:
        raise ValueError("ahead must be at least 1")
    marks: deque = deque()
    steps = step_layers(runner, batch, graphs)
    try:
        while (lazy := next(steps)) is None:
            if runner.on_cuda:
                with runner.device_scope():
                    marks.append(torch.cuda.Event())
                    marks[-1].record()
                while len(marks) >= ahead:
                    marks.popleft().synchronize()
    finally:
        steps.close()
    return lazy
