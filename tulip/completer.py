"""The worker's completer half (tulip.worker): waits for each launched batch in turn, hands its rows to their
requests, frees the batch's pinned buffer and in-flight slot, then runs each finished request's output head
and hands the answers to the event loop in one call (tulip.job.Handoff).

A mixin of tulip.worker.Worker, whose launcher fills what it reads: `_launched` (the FIFO of Launched and
FailedBatch items, STOP last), `_count_lock`, `_inflight`, `_clock`, `_slots`, `_holding`, `queue`,
`device_times`, `device_check`, `metrics`, `_native_int8` and `_default_normalize`. Only the completer touches Job
state.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from tulip.errors import TulipError, engine_error
from tulip.job import Handoff
from tulip.packing import FailedBatch, Launched, jobs_of, release_lazy
from tulip.scheduler import BULK

log = logging.getLogger("tulip.worker")

STOP = object()  # the launcher's last item: the queue is closed and drained
FINITE_CHECK_ELEMENTS = 1 << 18  # rows of a batch up to this size are checked whole, larger ones first and last


class NonFiniteRows(RuntimeError):
    """The engine returned NaN or infinity for a batch."""


def check_finite(rows: np.ndarray) -> None:
    """Rows with NaN or infinity (a persistent kernel whose grid stalled poisons its whole batch; an fp16
    overflow) fail their requests instead of reaching a client as null or NaN: every element of a small batch,
    the first and last rows of a large one (tens of µs at most, on the completer thread)."""
    if rows.dtype.kind != "f" or not rows.size:
        return
    sample = rows if rows.size <= FINITE_CHECK_ELEMENTS else rows[[0, -1]]
    if not np.isfinite(sample).all():
        raise NonFiniteRows(f"the engine returned non-finite values in a batch of {rows.shape[0]} rows")


class Completer:
    def _complete_loop(self) -> None:
        while True:
            item = self._launched.get()
            if item is STOP:
                return
            if isinstance(item, FailedBatch):
                error = item.error
                if not isinstance(error, TulipError):  # what a launch raised (tulip.packing.FailedBatch)
                    error = self.device_check.error_for(error)
                self._fail_jobs(item.jobs, error)
                if item.slot:
                    self._slots.release()
                continue
            self._deliver(item)

    def _account_delivery(self, item: Launched) -> None:
        """One batch left the device: learn its device time, re-anchor the estimate of what is still on it."""
        now = item.done_mono or time.monotonic()
        with self._count_lock:
            self._inflight -= 1
            device_s = self._clock.delivered(now, item.launched_mono)
        if item.packed.lane_tokens[BULK]:
            self.queue.bulk_done()  # counted by the queue when it handed the batch out
        self.device_times.observe(item.packed.tokens, device_s)

    def _deliver(self, item: Launched) -> None:
        finished = []
        try:
            rows = item.lazy.wait()
            item.done_mono, done = time.monotonic(), time.perf_counter()
            check_finite(rows)
            cold = getattr(item.lazy, "cold", False)
            for seq, r0 in zip(item.packed.sequences, item.row_starts.tolist()):
                if seq.ticket.cancelled:
                    continue  # caller gone or deadline hit after launch: its rows are discarded
                if cold:
                    seq.ticket.cold = True
                if seq.ticket.receive(seq, rows[r0:r0 + seq.spans.shape[0]], item.launched_at, done):
                    finished.append(seq.ticket)
        except Exception as exc:
            log.exception("a batch of %d sequences failed on the engine", len(item.packed.sequences))
            self._fail_jobs(jobs_of(item.packed.sequences), self.device_check.error_for(exc))
            finished = []
        finally:
            release_lazy(item.lazy)
            self._account_delivery(item)
            self._slots.release()
            if self._holding:  # a launcher holding for this batch's end packs now
                self.queue.poke()
        if self.metrics is not None:
            self.metrics.observe_delivery(time.perf_counter() - item.launched_at)
        handoff = Handoff()
        for job in finished:
            try:
                job.finish(native_int8=self._native_int8, default_normalize=self._default_normalize,
                           handoff=handoff)
            except Exception as exc:  # keep the completer alive whatever one request's head does
                log.exception("output head failed for request %s", getattr(job, "request_id", "-"))
                job.fail(engine_error(exc), handoff)
        handoff.flush()

    def _fail_jobs(self, jobs: list, error: BaseException) -> None:
        """Fail `jobs` with `error` and drop their sequences still queued (RELIABILITY 36): a request that
        is answered with an error must not keep the device busy with the rest of its work. A batch's slot is
        released after this (here, or by the launcher once it has dropped them itself: tulip.worker), so the
        next batch cannot take those sequences."""
        handoff = Handoff()
        for job in jobs:
            self.queue.cancel(job)
            job.fail(error, handoff)
        handoff.flush()
