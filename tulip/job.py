"""One accepted Embed call while it is in Tulip: its sequences' rows are gathered here until all are back.

Threads: the event loop creates the Job and awaits `future`; the worker's completer thread is the only one
that writes rows and settles the job (finish / fail), handing the result to the loop with
call_soon_threadsafe. `cancelled`/`expired` (from Ticket) belong to the queue's lock.

Every call_soon_threadsafe writes to the loop's self-pipe and wakes it: with 16 requests in one batch that
was 16 wake-ups. The completer therefore settles a whole batch through one `Handoff` (one wake-up per
batch and loop); finish()/fail() without a Handoff still hand over at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

import numpy as np

from protos import embed_pb2
from rose.head import OutputOptions, apply_head
from tulip.errors import TulipError
from tulip.request import ParsedRequest
from tulip.scheduler import QueuedSequence, Ticket

log = logging.getLogger("tulip.job")


@dataclass(frozen=True)
class EmbedResult:
    embeddings: bytes
    rows: int
    dimensions: int
    encoding: int
    tokens: int
    cold: bool = False  # some sequence ran in a batch of a graph layout not yet captured
    queue_us: int = 0  # received -> its first batch launched (EmbedResponse.queue_us)
    inference_us: int = 0  # that launch -> its last rows on the host
    received_at: float = 0.0  # time.perf_counter() when Tulip read the request

    def proto(self) -> embed_pb2.EmbedResponse:
        """The reply, its batcher_us measured now: call it where the answer leaves."""
        batcher_us = _us(time.perf_counter() - self.received_at) if self.received_at else 0
        return embed_pb2.EmbedResponse(embeddings=self.embeddings, rows=self.rows, dimensions=self.dimensions,
                                       encoding=self.encoding, tokens=self.tokens, cold=self.cold,
                                       queue_us=self.queue_us, inference_us=self.inference_us,
                                       batcher_us=batcher_us)


def _us(seconds: float) -> int:
    """Seconds as whole microseconds for a uint32 field (0 below 0, capped at about 71 minutes)."""
    return min(0xFFFFFFFF, max(0, int(seconds * 1e6)))


class Job(Ticket):
    def __init__(self, parsed: ParsedRequest, *, native_dimensions: int, loop: asyncio.AbstractEventLoop,
                 deadline: float | None = None, request_id: str = "", flow: str = "", lane: int = 0,
                 received_at: float | None = None) -> None:
        super().__init__(deadline, flow=flow, lane=lane)  # the chunks of one Ivy request share one place in the queue
        # time.perf_counter() stamps: read (the caller's, before parsing), first launch (the worker's), last rows
        self.received_at = time.perf_counter() if received_at is None else received_at
        self.launched_at = 0.0  # its first batch's step (its batches reach the one completer in launch order)
        self.rows_at = 0.0
        self.request_id = request_id
        self.options: OutputOptions = parsed.options
        self.num_tokens = parsed.num_tokens
        self.loop = loop
        self.future: asyncio.Future[EmbedResult] = loop.create_future()
        types = parsed.token_types or [None] * len(parsed.sequences)
        self.sequences = [QueuedSequence(ticket=self, tokens=t, spans=s, rows=r, types=y)
                          for t, s, r, y in zip(parsed.sequences, parsed.spans, parsed.rows, types)]
        self._columns = parsed.columns  # the requested output's columns of the native rows (None: all)
        self._normalize_default = parsed.normalize_default
        width = parsed.columns[1] if parsed.columns is not None else native_dimensions
        self._out = np.empty((parsed.num_rows, width), dtype=np.float32)
        self._pending = len(self.sequences)
        self.settled = False
        self.cold = False  # set by the completer: a batch of this job's ran without its CUDA graph yet
        # tulip.framed's direct answers: the completer calls `answer_via.answer(stream_id, job, result)`, which
        # writes the reply and marks the job `answered` when it did (the loop then settles the future without
        # sending); `withdrawn` is set under that stream's lock by a cancel. The carrier and the id, not a
        # closure: nothing more to allocate per request
        self.answer_via = None
        self.stream_id = 0
        self.answered = False
        self.withdrawn = False

    # -- completer thread ----------------------------------------------------------------------

    def receive(self, seq: QueuedSequence, rows: np.ndarray, launched_at: float = 0.0, at: float = 0.0) -> bool:
        """Store one sequence's pooled rows, from a batch stepped at `launched_at` and on the host since `at`
        (perf_counter stamps); True when this was the job's last outstanding sequence."""
        if self.settled:
            return False
        self.launched_at = self.launched_at or launched_at
        self.rows_at = max(self.rows_at, at)
        if self._columns is not None:
            rows = rows[:, self._columns[0]:self._columns[0] + self._columns[1]]
        self._out[seq.rows] = rows
        self._pending -= 1
        return self._pending == 0

    def finish(self, *, native_int8: bool, default_normalize: bool, handoff: Handoff | None = None) -> None:
        """Apply the request's output head (off the event loop) and hand the bytes to the caller."""
        if self.settled:
            return
        if self._normalize_default is not None:  # the output's own default (BGE-M3's ColBERT vectors: normalized)
            default_normalize = self._normalize_default
        try:
            out = apply_head(self._out, self.options, native_int8=native_int8, default_normalize=default_normalize)
        except ValueError as exc:  # validated at admission; here only if the engine's width changed
            self.fail(TulipError(f"output head failed: {exc}"), handoff)
            return
        if out.dtype.byteorder == ">":
            out = out.astype(out.dtype.newbyteorder("<"))
        dims = self.options.dimensions or self._out.shape[1]
        launched = self.launched_at or self.received_at
        result = EmbedResult(embeddings=out.tobytes(), rows=int(out.shape[0]), dimensions=int(dims),
                             encoding=int(self.options.encoding), tokens=self.num_tokens, cold=self.cold,
                             queue_us=_us(launched - self.received_at),
                             inference_us=_us(self.rows_at - launched) if self.rows_at else 0,
                             received_at=self.received_at)
        self.settled = True
        self._out = None  # type: ignore[assignment]
        if self.answer_via is not None:
            try:
                self.answer_via.answer(self.stream_id, self, result)
            except Exception:
                log.exception("direct answer failed for request %s; the event loop sends it", self.request_id or "-")
        (handoff or Handoff()).add(self, result, None, flush=handoff is None)

    def fail(self, error: BaseException, handoff: Handoff | None = None) -> None:
        if self.settled:
            return
        self.settled = True
        self._out = None  # type: ignore[assignment]
        (handoff or Handoff()).add(self, None, error, flush=handoff is None)


class Handoff:
    """Settled jobs waiting to reach their event loop: flush() wakes each loop once for all of them."""

    __slots__ = ("_by_loop",)

    def __init__(self) -> None:
        self._by_loop: dict[asyncio.AbstractEventLoop, list] = {}

    def add(self, job: Job, result, error, *, flush: bool = False) -> None:
        self._by_loop.setdefault(job.loop, []).append((job.future, result, error))
        if flush:
            self.flush()

    def flush(self) -> None:
        by_loop, self._by_loop = self._by_loop, {}
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_settle_all, items)
            except RuntimeError:  # the event loop is already closed: nobody is waiting any more
                pass


def _settle_all(items: list) -> None:
    for future, result, error in items:
        _settle(future, result, error)


def _settle(future: asyncio.Future, result, error) -> None:
    if future.done():  # the handler was cancelled (client gone, deadline) before the result came
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
