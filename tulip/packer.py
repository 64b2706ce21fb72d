"""The token-budget packer: which waiting sequences make the next batch (SequenceQueue's base; its state).

The rule (it replaces plain first-come-first-served, under which one maximum-size request held every
request behind it for its whole run, RELIABILITY 30): requests are served in arrival order, but no request
may take a whole batch while others wait. A batch is filled in two passes over the waiting requests,
oldest first:
1. each request takes its next sequences up to its share of the batch (`share` of the batch's own token
   cap, below `max_batch_tokens` under `interactive_batch_tokens` or express, and of `max_batch_seqs`; at least
   one sequence);
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
waits for it, and its own batch is as long as the bulk that fills it (benchmarks/results/lanes_express_3141898/lanes.json: 4.6 →
54 ms p99 beside 8192-token bulk batches). `interactive_batch_tokens` (0 = off) caps every batch at that
many tokens while interactive requests wait or arrived within the last `interactive_recent_s`: both
waits shrink to the device time of the cap, at bulk's cost in efficiency (smaller batches).

Express (tulip.express, `express_tokens` > 0): while bulk work is queued or on the device, interactive
requests are not packed here but by the express worker (next_express, batches of at most express_tokens),
which runs them on ROSE's express lane beside the bulk batch. A request's sequences all go to the worker
that took its first one (Ticket.owner), so only one completer thread ever touches it.
"""

from __future__ import annotations

from tulip.queue_types import BULK, EXPRESS, INTERACTIVE, MAIN, Flow, PackedBatch, Ticket


class LanePacker:
    """The rule above over SequenceQueue's state; every method runs under the queue's lock."""

    def _drop_locked(self, ticket: Ticket) -> None:
        raise NotImplementedError

    def _express_time_locked(self) -> bool:
        """Express time: an express worker is about and bulk work is queued or on the device."""
        return bool(self.express_tokens) and (self._bulk_inflight > 0 or self._lane_tokens[BULK] > 0)

    def _express_may_claim_locked(self, ticket: Ticket, busy: bool) -> bool:
        """Whether the express worker takes this unowned interactive request: in express time, when each of its
        sequences fits the express budget (a longer one would run eagerly beside bulk, its activations on top)."""
        return busy and ticket.longest <= self.express_tokens

    def _main_may_claim_locked(self, ticket: Ticket, busy: bool) -> bool:
        """Whether the main worker takes this unowned request: bulk always; interactive outside express time,
        when express would not take it, or when more interactive work waits than two express batches hold
        (heavy interactive traffic beside a trickle of bulk is not squeezed through express batches alone)."""
        return (ticket.lane == BULK or not busy or not self._express_may_claim_locked(ticket, busy)
                or self._lane_tokens[INTERACTIVE] > 2 * self.express_tokens)

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
            if self._fill_lane_locked(lane, packed, limit, MAIN):
                break
        self._bulk_owed = both and packed.lane_tokens[BULK] == 0
        if packed.lane_tokens[BULK]:
            self._bulk_inflight += 1  # express time from now until it is delivered (SequenceQueue.bulk_done)
        return packed

    def _fill_lane_locked(self, lane: int, packed: PackedBatch, limit: int, who: int) -> bool:
        """One lane's two passes (its requests' shares, then the room left up to `limit`) for worker `who`;
        True when full."""
        flows = self._lanes[lane]
        busy = self._express_time_locked() or bool(self.express_tokens and packed.lane_tokens[BULK] > 0)  # bulk
        # queued, on the device, or in this very batch, with an express worker about
        full = False
        emptied = []
        cap_share = max(1, int(self._cap * self.share))  # of this batch's cap: a share of max_batch_tokens
        # would let the first request fill a batch capped lower while others wait
        for share_tokens, share_seqs in ((cap_share, self.share_seqs), (None, None)):  # the two passes
            for key, flow in flows.items():
                if not flow:
                    continue  # emptied in the first pass
                full = self._take_from_locked(flow, packed, share_tokens, share_seqs, limit, who, busy)
                if not flow:
                    emptied.append(key)
                if full:
                    break
            if full:
                break
        for key in emptied:
            del flows[key]
        packed.skipped += self._unreported  # what cancels dropped from the lanes meanwhile
        self._unreported = 0
        return full

    def _take_from_locked(self, flow: Flow, packed: PackedBatch, share_tokens: int | None,
                          share_seqs: int | None, limit: int, who: int = MAIN, busy: bool = False) -> bool:
        """Move one flow's next sequences into `packed` (within its share, when given) for worker `who`,
        which takes the requests it owns and the unowned ones it may claim (`busy`: express time); True when
        full."""
        now = packed.taken_at
        tokens = seqs = 0
        while flow:
            head = flow[0]
            ticket = head.ticket
            if ticket.cancelled:  # already discounted when it was cancelled; left by _drop_locked's compaction
                flow.popleft()
                flow.dead -= 1
                packed.skipped += 1
                continue
            if ticket.owner is None:
                claim = (self._express_may_claim_locked if who == EXPRESS else self._main_may_claim_locked)
                if not claim(ticket, busy):
                    return False  # left for the other worker
            elif ticket.owner != who:
                return False  # another worker's request
            if ticket.deadline is not None and ticket.deadline <= now:
                ticket.expired = True
                self._drop_locked(ticket)  # compacts this flow in place, or leaves its head to the skip above
                packed.expired.append(ticket)
                continue
            n = head.num_tokens
            if packed.sequences and packed.tokens + n > limit:
                return False  # does not fit beside the others; never skip to this flow's smaller sequence
            if share_tokens is not None and seqs and (tokens + n > share_tokens or seqs >= share_seqs):
                return False  # its share is taken: the next flow's turn
            flow.popleft()
            ticket.owner = who
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
