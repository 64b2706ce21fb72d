"""The FCFS sequence queue and its token-budget packer: CPU-only decisions, no engine, no gRPC.

Sequences (not requests) leave the queue in arrival order. A batch takes from the head while the next
sequence fits `max_batch_tokens` and `max_batch_seqs`; it never skips ahead to a smaller sequence, so
nothing starves. A sequence longer than the budget runs alone. Sequences of cancelled or expired
requests are dropped here, before batching, so they never reach the engine.

The queue is shared by the gRPC event loop (push, cancel: short critical sections, no waiting) and the
worker's launcher thread (next_batch, which blocks while the queue is empty).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np

from tulip.errors import QueueClosed, QueueFull


class Ticket:
    """What the queue needs to know of a request. `cancelled` and the queued counters are guarded
    by the queue's lock; `deadline` is a time.monotonic() value or None."""

    def __init__(self, deadline: float | None = None) -> None:
        self.deadline = deadline
        self.cancelled = False
        self.expired = False
        self.queued_tokens = 0
        self.queued_seqs = 0


@dataclass(eq=False, slots=True)
class QueuedSequence:
    ticket: Ticket
    tokens: np.ndarray  # int32 [n] this sequence's ids
    spans: np.ndarray  # int32 [k, 2] spans to pool, relative to the sequence
    rows: np.ndarray  # int [k] where each span's row goes in the request's output
    enqueued_at: float = 0.0

    @property
    def num_tokens(self) -> int:
        return int(self.tokens.shape[0])


@dataclass
class PackedBatch:
    sequences: list[QueuedSequence] = field(default_factory=list)
    expired: list[Ticket] = field(default_factory=list)  # requests whose deadline passed in the queue
    tokens: int = 0
    taken_at: float = 0.0
    skipped: int = 0  # sequences of cancelled/expired requests removed without running


class SequenceQueue:
    def __init__(self, max_batch_tokens: int, max_batch_seqs: int, max_queue_tokens: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_seqs = max_batch_seqs
        self.max_queue_tokens = max_queue_tokens
        self._clock = clock
        self._items: deque[QueuedSequence] = deque()
        self._tokens = 0  # tokens of live (not cancelled/expired) queued sequences
        self._seqs = 0
        self._closed = False
        self._cond = threading.Condition(threading.Lock())

    # -- producer side (event loop) -------------------------------------------------------------

    def push(self, ticket: Ticket, sequences: Iterable[QueuedSequence]) -> None:
        """Admit all of a request's sequences, or none: raises QueueFull / QueueClosed."""
        seqs = list(sequences)
        tokens = sum(s.num_tokens for s in seqs)
        with self._cond:
            if self._closed:
                raise QueueClosed("tulip is shutting down and takes no new work; retry on another replica")
            if tokens > self.max_queue_tokens:
                raise QueueFull(f"request has {tokens} tokens; the queue holds at most "
                                f"{self.max_queue_tokens} (max_queue_tokens): split the request")
            if self._tokens + tokens > self.max_queue_tokens:
                raise QueueFull(f"queue full: {self._tokens} tokens waiting + {tokens} requested exceeds "
                                f"max_queue_tokens {self.max_queue_tokens}; retry later or on another replica")
            now = self._clock()
            for s in seqs:
                s.enqueued_at = now
            self._items.extend(seqs)
            ticket.queued_tokens += tokens
            ticket.queued_seqs += len(seqs)
            self._tokens += tokens
            self._seqs += len(seqs)
            self._cond.notify()

    def cancel(self, ticket: Ticket) -> None:
        """Drop a request's queued sequences (client gone or deadline hit): they free queue space now
        and are skipped, unbatched, when they reach the head."""
        with self._cond:
            self._drop_locked(ticket)

    # -- consumer side (launcher thread) --------------------------------------------------------

    def next_batch(self, timeout: float | None = None) -> PackedBatch | None:
        """Block until there is work, then take one FCFS batch. None on timeout, or when the queue is
        closed and empty. A result may hold only expired tickets (to be failed) and no sequences."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                if self._items:
                    packed = self._take_locked()
                    if packed.sequences or packed.expired or packed.skipped:
                        return packed
                if self._closed:
                    return None
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return None
                self._cond.wait(remaining)

    def hold(self, until: float, stop: Callable[[], bool]) -> None:
        """Wait (the launcher, before packing late) until the clock reaches `until`, a full batch is
        queued, the queue closes, or `stop()` is true; `stop` is re-checked at every poke()."""
        with self._cond:
            while not (self._closed or self._tokens >= self.max_batch_tokens or self._seqs >= self.max_batch_seqs
                       or stop()):
                remaining = until - self._clock()
                if remaining <= 0:
                    return
                self._cond.wait(remaining)

    def poke(self) -> None:
        """Wake a waiting hold() to re-check its stop condition."""
        with self._cond:
            self._cond.notify_all()

    def close(self) -> None:
        """Refuse new work; what is queued is still handed out (drain), then next_batch returns None."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    @property
    def closed(self) -> bool:
        return self._closed

    def depth(self) -> tuple[int, int]:
        """(sequences, tokens) waiting, not counting cancelled ones."""
        with self._cond:
            return self._seqs, self._tokens

    # -- internals ------------------------------------------------------------------------------

    def _drop_locked(self, ticket: Ticket) -> None:
        if ticket.cancelled:
            return
        ticket.cancelled = True
        self._tokens -= ticket.queued_tokens
        self._seqs -= ticket.queued_seqs
        ticket.queued_tokens = 0
        ticket.queued_seqs = 0

    def _take_locked(self) -> PackedBatch:
        now = self._clock()
        packed = PackedBatch(taken_at=now)
        items = self._items
        while items:
            head = items[0]
            ticket = head.ticket
            if ticket.cancelled:  # already discounted when it was cancelled
                items.popleft()
                packed.skipped += 1
                continue
            if ticket.deadline is not None and ticket.deadline <= now:
                items.popleft()
                packed.skipped += 1
                ticket.expired = True
                self._drop_locked(ticket)
                packed.expired.append(ticket)
                continue
            n = head.num_tokens
            if packed.sequences and (packed.tokens + n > self.max_batch_tokens
                                     or len(packed.sequences) >= self.max_batch_seqs):
                break  # FCFS: never skip ahead to a smaller sequence
            items.popleft()
            packed.sequences.append(head)
            packed.tokens += n
            ticket.queued_tokens -= n
            ticket.queued_seqs -= 1
            self._tokens -= n
            self._seqs -= 1
            if packed.tokens >= self.max_batch_tokens:
                break  # full, or one over-long sequence running alone
        return packed
