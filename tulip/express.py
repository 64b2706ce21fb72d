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

With `TULIP_BULK_LAYERS_AHEAD` > 0 and a model that can be stepped layer by layer (rose.layer_steps: the Qwen3
family), the main worker steps every batch that carries bulk work one decoder layer at a time (per-layer CUDA
graphs), keeping at most that many layers on the device, and this worker steps its batches on the main lane
instead: each waits for at most those layers, then runs at full speed, where beside bulk on the express lane
its kernels crawl between the bulk's blocks (`benchmarks/NOTES.md`, "Bulk's layers replayed from per-layer CUDA
graphs"). The express lane is then not prewarmed.

A request's sequences all run on the worker that took its first one (Ticket.owner): each worker's
completer alone touches its requests. The watchdog watches both workers.

The express lane's graphs are prewarmed here, on the express launcher, after the replica is ready (not on
its start-up: ~1.5 s for a 0.6B); express turns on (SequenceQueue.enable_express) once they are captured
and verified. Until then, or for good when that prewarm fails (logged), interactive requests go through
the main worker as with express off.
"""

from __future__ import annotations

import logging

from tulip.completer import STOP
from tulip.scheduler import PackedBatch
from tulip.worker import Worker

log = logging.getLogger("tulip.express")


class ExpressWorker(Worker):
    express = True
    name = "tulip-express"

    def __init__(self, engine, queue, *, express_tokens: int, max_inflight: int = 2, metrics=None,
                 main_lane: bool = False, busy_spans=None, device_check=None) -> None:
        """main_lane: step on ROSE's main lane, between the layers of the bulk batch the main worker steps layer
        by layer (its layers_ahead), instead of on the express lane (module docstring)."""
        super().__init__(engine, queue, max_inflight=max_inflight, metrics=metrics, busy_spans=busy_spans,
                         device_check=device_check)
        self.express_tokens = express_tokens
        self.express_lane = not main_lane
        self.prewarm_failed = False

    def _launch_loop(self) -> None:
        if not self.express_lane:  # the main lane's graphs serve: nothing of the express lane's to prewarm
            log.info("interactive batches between bulk's layers: batches up to %d tokens", self.express_tokens)
            self.queue.enable_express(self.express_tokens)
            return super()._launch_loop()
        prewarm = getattr(self.engine, "prewarm_express", None)
        try:
            verified = prewarm() if callable(prewarm) else []
        except Exception:  # noqa: BLE001 - serving goes on without the lane
            log.exception("express lane prewarm failed: express stays off (interactive requests wait for bulk)")
            self.prewarm_failed = True
            self._launched.put(STOP)
            return
        log.info("express lane on: %d graphs prewarmed, batches up to %d tokens", len(verified), self.express_tokens)
        self.queue.enable_express(self.express_tokens)
        super()._launch_loop()

    def _next_batch(self) -> PackedBatch | None:
        return self.queue.next_express()
