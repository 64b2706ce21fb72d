"""The closed-loop in-process layer: L clients with one request outstanding each, two batches in flight."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from benchmarks.stack.inprocess_closed import ClosedLoopInprocessLayer
from benchmarks.stack.load import Budget, Request


class RecordingEngine:
    """step() records each batch's requests by their first token id; result() marks it done."""

    def __init__(self) -> None:
        self.spec = SimpleNamespace(pooling="mean", native_int8=False, normalize=True, dimensions=4)
        self.batches: list[list[int]] = []
        self.outstanding = 0
        self.max_outstanding = 0

    def step(self, batch):
        starts = np.concatenate([[0], np.cumsum(batch.seq_lens)[:-1]])
        firsts = [int(batch.token_ids[s]) for s in starts]
        self.batches.append(firsts)
        self.outstanding += 1
        self.max_outstanding = max(self.max_outstanding, self.outstanding)
        return SimpleNamespace(result=self._done)

    def _done(self):
        self.outstanding -= 1
        return np.zeros((1, 4), np.float32)


def _clients(count: int, per_client: int, tokens: int = 5) -> list[list[Request]]:
    return [[Request(texts=("x",), tokens=tokens, ids=((100 * c + k,) + (1,) * (tokens - 1),))
             for k in range(per_client)] for c in range(count)]


def test_each_client_keeps_one_request_outstanding_and_batches_are_fcfs() -> None:
    engine = RecordingEngine()
    layer = ClosedLoopInprocessLayer(engine, max_batch_tokens=1000, max_batch_seqs=256)
    samples = layer._closed_loop(_clients(4, 3), float("inf"), 10)
    assert len(samples) == 12 and engine.max_outstanding <= 2
    sent = [first for batch in engine.batches for first in batch]
    assert sorted(sent) == sorted(100 * c + k for c in range(4) for k in range(3))
    for c in range(4):  # a client's requests go in order, never two of one client in one batch
        mine = [i for i, first in enumerate(sent) if first // 100 == c]
        assert [sent[i] % 100 for i in mine] == [0, 1, 2]
    assert all(len({f // 100 for f in batch}) == len(batch) for batch in engine.batches)
    assert engine.batches[0] == [0, 100, 200, 300], "everything waiting goes in the first free slot"


def test_batches_respect_tulips_limits_and_the_budget_cycles_requests() -> None:
    engine = RecordingEngine()
    layer = ClosedLoopInprocessLayer(engine, max_batch_tokens=12, max_batch_seqs=256)
    samples = layer.replay("concurrency", _clients(4, 2), Budget(duration_s=0, max_requests=5, warmup_requests=0))
    assert len(samples) == 20, "cycled past each client's 2 requests up to the cap of 5 per client"
    assert max(map(len, engine.batches)) == 2, "5-token requests under a 12-token budget: two a batch"
