"""The sequence queue: CPU-only decisions, no engine, no gRPC. Which sequences make a batch is
tulip.packer's rule (shares, lanes, express); this file holds the waiting, the admission and the wake-ups.

"A request" is a flow: the tickets that share a non-empty `flow` key (EmbedRequest.flow, Ivy's own key for
each HTTP request, so the chunks of one HTTP request count as one request) or else the ticket alone; a flow's place is the
arrival of its oldest waiting sequence. Sequences of cancelled or expired requests are dropped here,
before batching, so they never reach the engine, and they leave the queue's memory when the request is dropped
(_drop_locked), not when the packer next walks past them: while the device holds every in-flight batch the
packer does not run, and the tokens a cancel frees admit more work at once.

The queue is shared by the gRPC event loop (push, cancel: short critical sections, no waiting) and the
worker's launcher thread (next_batch, which blocks while the queue is empty).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable

from tulip.errors import QueueClosed, QueueFull
from tulip.packer import LanePacker
from tulip.queue_types import BULK, EXPRESS, INTERACTIVE, LANES, MAIN, Flow, PackedBatch, QueuedSequence, Ticket

__all__ = ["BULK", "EXPRESS", "INTERACTIVE", "LANES", "MAIN", "REHOLD", "PackedBatch", "QueuedSequence", "SequenceQueue",
           "Ticket"]


REHOLD = PackedBatch()  # next_batch's answer when its rehold() said so: nothing taken, pace first


class SequenceQueue(LanePacker):
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
        self.share = share
        self.share_tokens = max(1, int(max_batch_tokens * share))  # of a full batch; a capped one's is less
        self.share_seqs = max(1, int(max_batch_seqs * share))
        self.bulk_reserve = int(max_batch_tokens * bulk_share)
        self._clock = clock
        self._lanes: tuple[dict[object, Flow], ...] = ({}, {})  # per lane, in arrival order
        self._bulk_owed = False  # the last batch carried no bulk while bulk waited: bulk goes first
        self._tokens = 0  # tokens of live (not cancelled/expired) queued sequences
        self._lane_tokens = [0, 0]
        self._seqs = 0
        self._unreported = 0  # sequences dropped from the lanes, not yet counted in a batch's `skipped`
        self._closed = False
        lock = threading.Lock()
        self._cond = threading.Condition(lock)  # the main worker's launcher waits on it
        self._express_cond = threading.Condition(lock)  # the express worker's (a wake-up of its own: a push
        # while no bulk is about wakes the main launcher alone, so express costs idle traffic nothing)
        self.express_tokens = 0  # > 0 while an express worker takes interactive work (enable_express)
        self._bulk_inflight = 0  # batches with bulk tokens taken by MAIN and not yet delivered (bulk_done)
        self._parked = False  # the main launcher is inside next_batch's wait (take_parked may take for it)
        self._handed: deque[PackedBatch] = deque()  # batches taken on the event loop for the launcher to run

    # -- producer side (event loop) -------------------------------------------------------------

    def push(self, ticket: Ticket, sequences: Iterable[QueuedSequence], wake: bool = True) -> None:
        """Admit all of a request's sequences, or none: raises QueueFull / QueueClosed. wake=False: the
        main launcher is not woken; the caller then calls take_parked() (it takes the batch or wakes it)."""
        seqs = list(sequences)
        lengths = [s.num_tokens for s in seqs]
        tokens = sum(lengths)
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
                flow = flows[key] = Flow()
            flow.extend(seqs)
            ticket.queued_tokens += tokens
            ticket.queued_seqs += len(seqs)
            ticket.longest = max(ticket.longest, max(lengths, default=0))
            self._tokens += tokens
            self._lane_tokens[ticket.lane] += tokens
            self._seqs += len(seqs)
            if wake:
                self._cond.notify()
            self._wake_express_locked()

    def take_parked(self) -> PackedBatch | None:
        """The event loop's inline launch (tulip.worker.Worker.launch_here): while the main launcher is parked
        waiting for work, take the next batch here, without waking it; else wake it and return None. A batch
        taken may hold no sequence (only expired or skipped tickets), as next_batch's may."""
        with self._cond:
            if self._parked and not self._handed and (self._lanes[0] or self._lanes[1]):
                packed = self._take_main_locked()
                if self._lanes[0] or self._lanes[1]:
                    self._cond.notify()  # what did not fit in this batch is the launcher's
                return packed
            self._cond.notify()
            return None

    def hand_over(self, packed: PackedBatch) -> None:
        """A batch taken by take_parked that must run on the launcher after all: its next_batch returns it first."""
        with self._cond:
            self._handed.append(packed)
            self._cond.notify()

    def drop_waiting(self, who: int) -> list[Ticket]:
        """Once the device is lost (tulip.device_check): drop every waiting request worker `who` answers (those it
        owns and the unowned ones), packing none, and return them for its completer to fail at once. The other
        worker's requests stay for it."""
        with self._cond:
            dropped = [ticket for flows in self._lanes for flow in list(flows.values())
                       for ticket in {id(s.ticket): s.ticket for s in flow if not s.ticket.cancelled}.values()
                       if ticket.owner in (None, who)]
            for ticket in dropped:
                ticket.owner = who  # its completer alone settles it
                self._discard_locked(ticket)
            return dropped

    def wake(self) -> None:
        """Wake the main launcher (after a push with wake=False that take_parked did not follow)."""
        with self._cond:
            self._cond.notify()

    def cancel(self, ticket: Ticket) -> None:
        """Drop a request's queued sequences (client gone or deadline hit): they free queue space and leave
        the lanes now (_drop_locked), and never reach the engine."""
        with self._cond:
            self._discard_locked(ticket)

    def _discard_locked(self, ticket: Ticket) -> None:
        """cancel and drop_waiting's work, under the lock: drop the ticket (_drop_locked), remove its flow if that
        emptied it (the packer, which removes the flows it empties, is not walking them now), and wake the workers
        when the drop may uncover a request the other one takes."""
        self._drop_locked(ticket)
        flows = self._lanes[ticket.lane]
        key = ticket.flow or ticket
        if key in flows and not flows[key]:
            del flows[key]
        if self.express_tokens:
            self._cond.notify()
            self._express_cond.notify()

    # -- consumer side (launcher thread) --------------------------------------------------------

    def next_batch(self, timeout: float | None = None, rehold: Callable[[], bool] | None = None) -> PackedBatch | None:
        """Block until there is work, then take one FCFS batch. None on timeout, or when the queue is
        closed and empty. A result may hold only expired tickets (to be failed) and no sequences.
        rehold: asked when a wait ends; true = return REHOLD without taking (the launcher paces first)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                if self._handed:
                    return self._handed.popleft()
                if self._lanes[0] or self._lanes[1]:
                    packed = self._take_main_locked()
                    if packed is not None:
                        return packed
                if self._closed and not (self._lanes[0] or self._lanes[1]):  # what is left, express takes
                    return None
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return None
                self._parked = True
                try:
                    self._cond.wait(remaining)
                finally:
                    self._parked = False
                if rehold is not None and not self._handed and not self._closed and rehold():
                    return REHOLD

    def next_express(self, timeout: float | None = None) -> PackedBatch | None:
        """The express worker's next batch (module docstring): interactive requests only, at most
        express_tokens, taken while bulk is busy (and those it already owns at any time). None on timeout,
        or once the queue is closed and nothing is left for it (express is then off: the rest goes to MAIN)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                if self._lanes[INTERACTIVE] and self.express_tokens:
                    packed = PackedBatch(taken_at=self._clock())
                    self._cap = self.express_tokens
                    self._fill_lane_locked(INTERACTIVE, packed, self.express_tokens, EXPRESS)
                    if packed.sequences or packed.expired or packed.skipped:
                        if self._lanes[INTERACTIVE]:
                            self._cond.notify()  # it may have uncovered a request that is the main worker's
                        return packed
                remaining = None if deadline is None else deadline - time.monotonic()
                if self._closed or not self.express_tokens or (remaining is not None and remaining <= 0):
                    if self._closed:
                        self.express_tokens = 0
                        self._cond.notify_all()
                    return None
                self._express_cond.wait(remaining)

    def enable_express(self, tokens: int) -> None:
        """An express worker takes interactive work from now on (unless the queue closed meanwhile)."""
        with self._cond:
            if not self._closed:
                self.express_tokens = tokens
                self._wake_express_locked()

    def bulk_done(self) -> None:
        """A batch of MAIN's that carried bulk tokens left the device (delivered, or failed to launch)."""
        with self._cond:
            self._bulk_inflight -= 1
            if not self._express_time_locked() and self._lanes[INTERACTIVE]:
                self._cond.notify()  # interactive requests no one owns are the main worker's again

    def _wake_express_locked(self) -> None:
        if self._lanes[INTERACTIVE] and self._express_time_locked():
            self._express_cond.notify()

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
            self._express_cond.notify_all()

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

    def _take_main_locked(self) -> PackedBatch | None:
        """The main worker's next batch from what waits; None when none of it is the main worker's to take
        (the express worker owns it). A batch may hold only expired or skipped tickets."""
        packed = self._take_locked()
        if packed.sequences or packed.expired or packed.skipped:
            self._wake_express_locked()  # its bulk began express time, or it uncovered express's
            return packed
        return None

    def _drop_locked(self, ticket: Ticket) -> None:
        """Discount a cancelled or expired request and free its queued sequences. A flow of its own is
        emptied now; in a flow shared with live requests (Ivy's chunks) its sequences are compacted away once
        the dead ones are as many as the live ones: a compaction costs at most twice the sequences it frees, and
        after every drop a flow holds fewer dead sequences than live ones. A flow keeps its place, and an emptied one stays
        in its lane for the caller to remove (the packer may be walking the lane)."""
        if ticket.cancelled:
            return
        ticket.cancelled = True
        flow = self._lanes[ticket.lane].get(ticket.flow or ticket) if ticket.queued_seqs else None
        if flow is not None:  # it holds all of the ticket's queued sequences: flows are removed only when empty
            flow.dead += ticket.queued_seqs
            if 2 * flow.dead >= len(flow):
                live = [s for s in flow if not s.ticket.cancelled] if flow.dead < len(flow) else []
                self._unreported += len(flow) - len(live)  # still counted as skipped (a metric), with the next batch
                flow.clear()
                flow.extend(live)
                flow.dead = 0
        self._tokens -= ticket.queued_tokens
        self._lane_tokens[ticket.lane] -= ticket.queued_tokens
        self._seqs -= ticket.queued_seqs
        ticket.queued_tokens = 0
        ticket.queued_seqs = 0
