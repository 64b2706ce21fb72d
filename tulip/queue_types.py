"""The sequence queue's data: lanes, a request's Ticket, a QueuedSequence, and a PackedBatch (no logic).

tulip.scheduler (the queue and its packer) re-exports all of it. A Ticket is what the queue knows of one
request: its lane, its deadline and its `flow` key; tickets that share a non-empty flow count as one request
(tulip.scheduler's module docstring).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

INTERACTIVE, BULK = 0, 1  # = protos Lane values
LANES = ("interactive", "bulk")  # metric labels, by lane
MAIN, EXPRESS = 0, 1  # the workers that take from the queue (Ticket.owner; tulip.express)


class Ticket:
    """What the queue needs to know of a request. `cancelled` and the queued counters are guarded
    by the queue's lock; `deadline` is a time.monotonic() value or None."""

    def __init__(self, deadline: float | None = None, flow: str = "", lane: int = 0) -> None:
        self.deadline = deadline
        self.lane = BULK if lane == BULK else INTERACTIVE
        self.flow = flow  # tickets with the same non-empty flow share one place in the queue
        self.cancelled = False
        self.expired = False
        self.queued_tokens = 0
        self.queued_seqs = 0
        self.longest = 0  # its longest sequence (set by the queue's push): express takes none above its budget
        self.owner: int | None = None  # the worker (MAIN | EXPRESS) that took its first sequence: it takes
        # the rest too, so one completer thread alone touches the request (tulip.worker)


@dataclass(eq=False, slots=True)
class QueuedSequence:
    ticket: Ticket
    tokens: np.ndarray  # int32 [n] this sequence's ids
    spans: np.ndarray  # int32 [k, 2] spans to pool, relative to the sequence
    rows: np.ndarray  # int [k] where each span's row goes in the request's output
    enqueued_at: float = 0.0
    types: np.ndarray | None = None  # uint8 [n] token types (BERT cross-encoder pairs); None = all 0

    @property
    def num_tokens(self) -> int:
        return int(self.tokens.shape[0])


class Flow(deque):
    """One request's waiting sequences, in arrival order (a flow: tulip.scheduler's module docstring). `dead`:
    how many of them belong to cancelled or expired tickets and wait to be compacted away or skipped."""

    __slots__ = ("dead",)

    def __init__(self) -> None:
        super().__init__()
        self.dead = 0


@dataclass
class PackedBatch:
    sequences: list[QueuedSequence] = field(default_factory=list)
    expired: list[Ticket] = field(default_factory=list)  # requests whose deadline passed in the queue
    tokens: int = 0
    taken_at: float = 0.0
    skipped: int = 0  # sequences of cancelled/expired requests removed without running
    lane_tokens: list[int] = field(default_factory=lambda: [0, 0])  # tokens of each lane in this batch
