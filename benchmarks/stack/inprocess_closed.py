"""The in-process engine as L closed-loop clients with a harness that costs nothing: the fair ceiling.

`InprocessLayer.replay` streams rounds (request k of every client) with two batches in flight, so round k+1
is on the device before round k's results are back: 2 x L requests outstanding, which L closed-loop clients
never have (a client sends its next request only after its answer). This layer replays the same requests as
L clients that each keep one request outstanding: every answer lets its client send the next request at
once (zero harness cost), and a free slot of the two in flight packs every request waiting, FCFS, up to
Tulip's batch limits, at once (no pacing). What the stack could reach with L clients if Ivy, gRPC and Tulip
cost nothing; `inprocess` stays beside it as the engine's throughput with batches of L.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from benchmarks.stack.client import Sample
from benchmarks.stack.inprocess import InprocessLayer, engine_error
from benchmarks.stack.load import Budget, Request


class ClosedLoopInprocessLayer(InprocessLayer):
    def replay(self, suite: str, per_client: list[list[Request]], budget: Budget) -> list[Sample]:
        """Warmed up on every client's requests (three passes: eager, capture, replay), then measured for the
        budget's duration or request cap."""
        try:
            for _ in range(3):
                self._closed_loop(per_client, float("inf"), max(map(len, per_client)))
            deadline = time.perf_counter() + budget.duration_s if budget.duration_s > 0 else float("inf")
            cap = budget.max_requests if budget.max_requests > 0 else 1 << 62
            return self._closed_loop(per_client, deadline, cap, cycle=True)
        except Exception as exc:  # noqa: BLE001
            raise engine_error(exc) from exc

    def _closed_loop(self, per_client: list[list[Request]], deadline: float, cap: int,
                     cycle: bool = False) -> list[Sample]:
        """Each client sends its requests in order (again from the first when `cycle`), one outstanding;
        stops sending at `deadline` or after `cap` requests per client; returns one sample per answer."""
        sent = [0] * len(per_client)
        waiting: deque[tuple[int, Request, float]] = deque()
        inflight: deque[tuple[Any, list[tuple[int, Request, float]]]] = deque()
        samples: list[Sample] = []

        def send(client: int) -> None:
            reqs = per_client[client]
            k = sent[client]
            if k >= cap or (not cycle and k >= len(reqs)) or time.perf_counter() >= deadline:
                return
            sent[client] = k + 1
            waiting.append((client, reqs[k % len(reqs)], time.perf_counter()))

        for client in range(len(per_client)):
            send(client)
        while waiting or inflight:
            while waiting and len(inflight) < 2:
                inflight.append(self._launch(waiting))
            lazy, batch = inflight.popleft()
            lazy.result()
            end = time.perf_counter()
            for client, request, t0 in batch:
                samples.append(Sample(t0, end - t0, len(request.ids), request.tokens, False))
                send(client)
        return samples

    def _launch(self, waiting: deque) -> tuple[Any, list]:
        """Whole requests from the head of `waiting` while their sequences fit Tulip's limits (at least one)."""
        taken, seqs, tokens = [], [], 0
        while waiting:
            ids = waiting[0][1].ids
            n = sum(map(len, ids))
            if taken and (tokens + n > self.max_tokens or len(seqs) + len(ids) > self.max_seqs):
                break
            taken.append(waiting.popleft())
            seqs.extend(ids)
            tokens += n
        return self.engine.step(self._batch(seqs, self._pooling)), taken
