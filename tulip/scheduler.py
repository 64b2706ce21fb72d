"""The sequence queue and its token-budget packer: CPU-only decisions, no engine, no gRPC.

The rule (it replaces plain first-come-first-served, under which one maximum-size request held every
request behind it for its whole run, RELIABILITY 30): requests are served in arrival order, but no request
may take a whole batch while others wait. A batch is filled in two passes over the waiting requests,
oldest first:
1. each request takes its next sequences up to its share of the batch (`share` of `max_batch_tokens` and
   of `max_batch_seqs`, at least one sequence);
2. the room left is filled from the requests in the same order, each taking what fits.
So a small request that arrives behind a huge one rides in the next batch, while the huge one still fills
the rest of it (a batch is as full as before). A request's own sequences always leave in their order and a
batch never skips one of them for a smaller one; a request whose next sequence does not fit beside the
others waits for a later batch, but the oldest request is served first into an empty batch, so nothing
starves. A sequence longer than the budget runs alone. `share` = 1 gives back request-level FCFS.

Lanes (issue 17): each request is in the interactive or the bulk lane (Ticket.lane); the rule above holds
within a lane. A batch is filled from the interactive lane first, then bulk, then interactive again with
any room bulk left. While bulk waits, interactive stops at (1 - bulk_share) of the token budget, so bulk
gets at least `bulk_share` of each batch's tokens; when a batch still carried no bulk (an interactive
sequence larger than its room), the next batch starts with bulk (aging): neither lane starves.
A batch runs to completion on the device, so an interactive query that arrives while a full bulk batch runs
waits for it, and its own batch is as long as the bulk that fills it (benchmarks/results/lanes.json: 4.6 →
54 ms p99 beside 8192-token bulk batches). `interactive_batch_tokens` (0 = off) caps every batch at that
many tokens while interactive requests wait or arrived within the last `interactive_recent_s`: both
waits shrink to the device time of the cap, at bulk's cost in efficiency (smaller batches).

"A request" is a flow: the tickets that share a non-empty `flow` key (Tulip passes Ivy's request id, so
the chunks of one HTTP request count as one request) or else the ticket alone; a flow's place is the
arrival of its oldest waiting sequence. Sequences of cancelled or expired requests are dropped here,
before batching, so they never reach the engine.

The queue is shared by the gRPC event loop (push, cancel: short critical sections, no waiting) and the
worker's launcher thread (next_batch, which blocks while the queue is empty).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable

from tulip.errors import QueueClosed, QueueFull
from tulip.queue_types import BULK, INTERACTIVE, LANES, PackedBatch, QueuedSequence, Ticket

__all__ = ["BULK", "INTERACTIVE", "LANES", "PackedBatch", "QueuedSequence", "SequenceQueue", "Ticket"]


class SequenceQueue:
    def __init__(self, max_batch_tokens: int, max_batch_seqs: int, max_queue_tokens: int,
                 clock: Callable[[], float] = time.monotonic, share: float = 0.125,
                 bulk_share: float = 0.25, interactive_batch_tokens: int = 0,
                 interactive_recent_s: float = 0.1) -> None:
        self.max_batch_tokens = max_batch_tokens
        self.bulk_share = bulk_share
        self.interactive_batch_tokens = interactive_batch_tokens
        self.interactive_recent_s = interactive_recent_s
        self._last_interactive = float("-inf")  # when an interactive request was last queued
        self._cap = max_batch_tokens  # the batch being taken: its token budget
        self.max_batch_seqs = max_batch_seqs
        self.max_queue_tokens = max_queue_tokens
        self.share_tokens = max(1, int(max_batch_tokens * share))
        self.share_seqs = max(1, int(max_batch_seqs * share))
        self.bulk_reserve = int(max_batch_tokens * bulk_share)
        self._clock = clock
        self._lanes: tuple[dict[object, deque[QueuedSequence]], ...] = ({}, {})  # per lane, in arrival order
        self._bulk_owed = False  # the last batch carried no bulk while bulk waited: bulk goes first
        self._tokens = 0  # tokens of live (not cancelled/expired) queued sequences
        self._lane_tokens = [0, 0]
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
            if ticket.lane == INTERACTIVE:
                self._last_interactive = now
            flows = self._lanes[ticket.lane]
            key = ticket.flow or ticket
            flow = flows.get(key)
            if flow is None:
                flow = flows[key] = deque()
            flow.extend(seqs)
            ticket.queued_tokens += tokens
            ticket.queued_seqs += len(seqs)
            self._tokens += tokens
            self._lane_tokens[ticket.lane] += tokens
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
                if self._lanes[0] or self._lanes[1]:
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

    def lane_tokens(self, lane: int) -> int:
        """Tokens waiting in one lane, not counting cancelled ones (read without the lock: a gauge, or the
        event loop's admission check, which is the only writer's thread for pushes)."""
        return self._lane_tokens[lane]

    # -- internals ------------------------------------------------------------------------------

    def _drop_locked(self, ticket: Ticket) -> None:
        if ticket.cancelled:
            return
        ticket.cancelled = True
        self._tokens -= ticket.queued_tokens
        self._lane_tokens[ticket.lane] -= ticket.queued_tokens
        self._seqs -= ticket.queued_seqs
        ticket.queued_tokens = 0
        ticket.queued_seqs = 0

    def batch_cap(self, now: float) -> int:
        """This batch's token budget: interactive_batch_tokens while interactive traffic is about, else the
        full budget (module docstring)."""
        if self.interactive_batch_tokens and (self._lane_tokens[INTERACTIVE] > 0
                                              or now - self._last_interactive < self.interactive_recent_s):
            return min(self.max_batch_tokens, self.interactive_batch_tokens)
        return self.max_batch_tokens

    def _take_locked(self) -> PackedBatch:
        packed = PackedBatch(taken_at=self._clock())
        cap = self._cap = self.batch_cap(packed.taken_at)
        reserve = self.bulk_reserve if cap == self.max_batch_tokens else int(cap * self.bulk_share)
        both = self._lane_tokens[BULK] > 0 and self._lane_tokens[INTERACTIVE] > 0
        room = cap - (reserve if both else 0)  # interactive's, while bulk waits
        if self._bulk_owed and both:
            plan = ((BULK, reserve or 1), (INTERACTIVE, cap), (BULK, cap))
        else:
            plan = ((INTERACTIVE, room), (BULK, cap), (INTERACTIVE, cap))
        for lane, limit in plan:
            if self._fill_lane_locked(lane, packed, limit):
                break
        self._bulk_owed = both and packed.lane_tokens[BULK] == 0
        return packed

    def _fill_lane_locked(self, lane: int, packed: PackedBatch, limit: int) -> bool:
        """One lane's two passes (its requests' shares, then the room left up to `limit`); True when full."""
        flows = self._lanes[lane]
        full = False
        emptied = []
        for share_tokens, share_seqs in ((self.share_tokens, self.share_seqs), (None, None)):  # the two passes
            for key, flow in flows.items():
                if not flow:
                    continue  # emptied in the first pass
                full = self._take_from_locked(flow, packed, share_tokens, share_seqs, limit)
                if not flow:
                    emptied.append(key)
                if full:
                    break
            if full:
                break
        for key in emptied:
            del flows[key]
        return full

    def _take_from_locked(self, flow: deque[QueuedSequence], packed: PackedBatch, share_tokens: int | None,
                          share_seqs: int | None, limit: int) -> bool:
        """Move one flow's next sequences into `packed` (within its share, when given); True when full."""
        now = packed.taken_at
        tokens = seqs = 0
        while flow:
            head = flow[0]
            ticket = head.ticket
            if ticket.cancelled:  # already discounted when it was cancelled
                flow.popleft()
                packed.skipped += 1
                continue
            if ticket.deadline is not None and ticket.deadline <= now:
                flow.popleft()
                packed.skipped += 1
                ticket.expired = True
                self._drop_locked(ticket)
                packed.expired.append(ticket)
                continue
            n = head.num_tokens
            if packed.sequences and packed.tokens + n > limit:
                return False  # does not fit beside the others; never skip to this flow's smaller sequence
            if share_tokens is not None and seqs and (tokens + n > share_tokens or seqs >= share_seqs):
                return False  # its share is taken: the next flow's turn
            flow.popleft()
            packed.sequences.append(head)
            packed.tokens += n
            packed.lane_tokens[ticket.lane] += n
            tokens += n
            seqs += 1
            ticket.queued_tokens -= n
            ticket.queued_seqs -= 1
            self._tokens -= n
            self._lane_tokens[ticket.lane] -= n
            self._seqs -= 1
            if packed.tokens >= self._cap or len(packed.sequences) >= self.max_batch_seqs:
                return True  # full, or one over-long sequence running alone
        return False
