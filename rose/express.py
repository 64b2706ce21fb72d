"""The express lane: small latency-bound batches run beside a long one, not after it.

A batch runs to completion on its stream, so an interactive query that reaches the device while an
8192-token bulk batch runs waits for that batch, and then for the one behind it (benchmarks/NOTES.md,
"Priority lanes": 4.4 ms idle p99, 54 ms beside bulk). Lanes in the queue cannot fix that. The express lane
gives such batches a path of their own through the same weights:

- a CUDA stream of higher priority than the bulk stream: the block scheduler issues the express kernels'
  blocks ahead of the bulk kernels' waiting blocks, so the query's ~300 small kernels run between the bulk
  kernels' blocks instead of after the whole bulk graph;
- its own CUDA graphs in their own memory pool (rose.graphs.CudaGraphs): graphs of one pool share their
  intermediate buffers and must never run concurrently, and a bulk graph replays while an express one does;
- its own attention backend object (a backend's host-side plan state, FlashInfer's wrappers, is per lane);
- its own lock, so an express step never waits for the bulk launcher's (which may be capturing).

Graphs are bucketed as usual, up to the smallest token bucket that holds `max_tokens` (the caller, Tulip's
express worker, caps its batches at that); larger batches run eagerly on the express stream. What is
shared is read-only: the weights, the pooler and output transform, the pinned pool (thread-safe).
"""

from __future__ import annotations

import logging
import threading

import torch

from rose.attention import make_backend
from rose.graphs import CudaGraphs

log = logging.getLogger("rose.express")

EXPRESS_PRIORITY = -1  # torch maps it to the device's higher priority range (bulk runs at 0)
PREWARM_SEQS = 2  # the express lane prewarms the engine's prewarm layouts of up to this many sequences that
# fit its budget (a query or two beside a bulk batch: 30 layouts of the default set, ~1.5 s on the H200);
# others are captured lazily, as on the main lane


class ExpressLane:
    def __init__(self, max_tokens: int, backend, stream, graphs: CudaGraphs | None) -> None:
        self.max_tokens = int(max_tokens)
        self.backend = backend
        self.stream = stream
        self.graphs = graphs
        self.lock = threading.Lock()

    @classmethod
    def build(cls, runner, max_tokens: int) -> ExpressLane:
        """The lane for `runner` (CUDA): backend rebuilt by the runner's attention choice, graphs when the
        runner has them, over the token buckets up to the one that holds max_tokens."""
        if max_tokens <= 0:
            raise ValueError(f"express max_tokens must be positive, got {max_tokens}")
        backend = make_backend(runner.attention, runner.device, runner.dtype, runner.spec)
        stream = torch.cuda.Stream(runner.device, priority=EXPRESS_PRIORITY)
        graphs = None
        if runner.graphs is not None:  # so the runner's backend, of this one's kind, is graph-safe
            buckets = runner.graphs.token_buckets
            top = next((t for t in buckets if t >= max_tokens), buckets[-1])
            graphs = CudaGraphs(lambda meta: runner.forward(meta, backend), backend.plan,
                                lambda host, staged: runner.eager(host, staged, backend), runner.device,
                                token_buckets=[t for t in buckets if t <= top],
                                seq_buckets=runner.graphs.seq_buckets, capture_after=runner.graphs.capture_after)
            graphs.scores = runner.graphs.scores
        log.info("express lane: batches up to %d tokens on a priority-%d stream, %s", max_tokens,
                 EXPRESS_PRIORITY, "own CUDA graphs" if graphs is not None else "eager")
        return cls(max_tokens, backend, stream, graphs)

    def prewarm_shapes(self, shapes) -> list:
        """Of the engine's prewarm (tokens, sequences, rows, longest) shapes, those this lane prewarms."""
        return [s for s in shapes if s[0] <= self.max_tokens and s[1] <= PREWARM_SEQS]

    def stats(self) -> dict:
        g = self.graphs
        return {"express_graphs_captured": len(g.graphs) if g else 0,
                "express_graph_capture_seconds": g.capture_seconds if g else 0.0,
                "express_captures_failed": g.captures_failed if g else 0,
                "express_graphs_refused": g.graphs_refused if g else 0}
