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

SMs held back (`reserved_sms` > 0, rose.green): while the lane has stepped within the last HOLD_S, the bulk
lane's steps run on a green-context stream of the other SMs, so the query's kernels find SMs with no bulk
blocks on them instead of waiting for running ones to retire (NOTES, "SMs held for the express lane").

Graphs are bucketed as usual, up to the smallest token bucket that holds `max_tokens` (the caller, Tulip's
express worker, caps its batches at that); larger batches run eagerly on the express stream. What is
shared is read-only: the weights, the pooler and output transform, the pinned pool (thread-safe).
"""

from __future__ import annotations

import logging
import threading
import time

import torch

from rose.attention import make_backend
from rose.graphs import CudaGraphs
from rose.green import green_stream

log = logging.getLogger("rose.express")

EXPRESS_PRIORITY = -1  # torch maps it to the device's higher priority range (bulk runs at 0)
PREWARM_SEQS = 2  # the express lane prewarms the engine's prewarm layouts of up to this many sequences that
# fit its budget (a query or two beside a bulk batch: 30 layouts of the default set, ~1.5 s on the H200);
# others are captured lazily, as on the main lane
HOLD_S = 0.05  # bulk steps begun within this long of an express step run on the held-back stream


class ExpressLane:
    def __init__(self, max_tokens: int, backend, stream, graphs: CudaGraphs | None) -> None:
        self.max_tokens = int(max_tokens)
        self.backend = backend
        self.stream = stream
        self.graphs = graphs
        self.lock = threading.Lock()
        self.last_step = float("-inf")  # time.monotonic() of the last express step
        self.reserved_sms = 0
        self.bulk_stream = None  # hold_sms(): the green-context stream bulk steps run on while queries are about
        self._green = None  # its context, kept alive with it
        self.held_steps = 0

    def hold_sms(self, reserved: int, device) -> None:
        """Keep `reserved` SMs free of bulk blocks while the lane is in use (rose.green); raises
        rose.green.GreenContextUnavailable where the build or driver cannot."""
        total = torch.cuda.get_device_properties(device).multi_processor_count
        if not 0 < reserved < total:
            raise ValueError(f"reserved SMs must be in 1..{total - 1}, got {reserved}")
        self._green, self.bulk_stream = green_stream(total - reserved, device)
        self.reserved_sms = reserved
        log.info("express lane: bulk held to %d of %d SMs while queries are about", total - reserved, total)

    def bulk_stream_now(self):
        """The stream a bulk step begun now runs on: the held-back one within HOLD_S of an express step."""
        if self.bulk_stream is None or time.monotonic() - self.last_step > HOLD_S:
            return None
        self.held_steps += 1
        return self.bulk_stream

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
        log.info("express lane: batches up to %d tokens on a priority-%d stream, %s", max_tokens,
                 EXPRESS_PRIORITY, "own CUDA graphs" if graphs is not None else "eager")
        return cls(max_tokens, backend, stream, graphs)

    def prewarm_shapes(self, shapes) -> list:
        """Of the engine's prewarm (tokens, sequences, rows, longest) shapes, those this lane prewarms."""
        return [s for s in shapes if s[0] <= self.max_tokens and s[1] <= PREWARM_SEQS]

    def stats(self) -> dict:
        g = self.graphs
        return {"express_reserved_sms": self.reserved_sms, "express_bulk_steps_held": self.held_steps,
                "express_graphs_captured": len(g.graphs) if g else 0,
                "express_graph_capture_seconds": g.capture_seconds if g else 0.0,
                "express_captures_failed": g.captures_failed if g else 0,
                "express_graphs_refused": g.graphs_refused if g else 0}
