"""The express worker: interactive requests beside a running bulk batch, on ROSE's express lane.

Under priority lanes alone a query that arrives while a bulk batch runs waits for that batch and rides in
the next one, which bulk fills again: ~3 bulk batch times (benchmarks/NOTES.md, "Priority lanes"). With
express on (`TULIP_EXPRESS_BATCH_TOKENS` > 0 and an engine with an express lane, rose.express), a second
worker, a launcher and a completer of its own (tulip.worker.Worker's loops), takes interactive requests
whenever bulk work is queued or on the device (SequenceQueue.next_express), packs them into batches of at
most that many tokens at once (no pacing: the bulk lane's schedule is not its own), and steps them on the
express lane: a higher-priority CUDA stream with its own graphs, so the query runs beside the bulk batch.
While no bulk is about, interactive requests go through the main worker as before, so interactive-only
traffic keeps its batching and graphs.

A request's sequences all run on the worker that took its first one (Ticket.owner): each worker's
completer alone touches its requests. The watchdog watches the main worker only.
"""

from __future__ import annotations

from tulip.scheduler import PackedBatch
from tulip.worker import Worker


class ExpressWorker(Worker):
    express = True
    name = "tulip-express"

    def __init__(self, engine, queue, *, max_inflight: int = 2, metrics=None) -> None:
        super().__init__(engine, queue, max_inflight=max_inflight, metrics=metrics)

    def _next_batch(self) -> PackedBatch | None:
        return self.queue.next_express()
