"""Closed-loop load: N client processes, each with one outstanding request at a time.

Why processes, not threads or asyncio: at sub-millisecond server latencies one Python process cannot
keep 16 clients busy, and the client would measure itself. Each worker (spawned, so no inherited
sockets or tokenizer threads) opens its own keep-alive connection, sends its warm-up requests, reports
ready, waits for the common start, then cycles through its requests until the duration or the request
cap is reached. Timestamps are `time.perf_counter` (CLOCK_MONOTONIC on Linux: comparable across
processes on one host), so the parent can compute one wall-clock window over all workers.
"""

from __future__ import annotations


import multiprocessing as mp
import os
import queue
import sys
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence


from benchmarks.stack.client import Sample, StackClient, StackError
from ivy.http_connection import HTTPError


@dataclass(frozen=True)
class ClientSpec:
    """Everything a worker process needs to build its own `StackClient` (picklable)."""

    url: str
    model: str
    route_style: str = "ours"
    encoding_format: str = "base64"
    api_key: str | None = None
    timeout_s: float = 60.0
    cpus: tuple[int, ...] = ()  # pin client processes here, away from the gateway's and batcher's cores

    def connect(self) -> StackClient:
        return StackClient(self.url, self.model, self.route_style, self.encoding_format, self.api_key,
                           self.timeout_s)


@dataclass(frozen=True)
class Request:
    """One request to send: documents to embed, or a query to score against them; with `ids` (--input
    ids, Tulip, in-process) their token ids are sent instead, the query's first when scoring."""

    texts: tuple[str, ...]
    tokens: int
    query: str | None = None
    ids: tuple[tuple[int, ...], ...] | None = None
    priority: str | None = None  # the body's `priority` lane (embeddings of texts only); None = not sent

    def send(self, client: StackClient) -> Sample:
        if self.ids is not None:
            return client.embed_ids(self.ids, self.tokens, score=self.query is not None)
        if self.query is None:
            return client.embed(list(self.texts), self.tokens, priority=self.priority)
        return client.score(self.query, list(self.texts), self.tokens)


@dataclass(frozen=True)
class Budget:
    """When to stop measuring: after `duration_s` seconds or `max_requests` requests, what comes first."""

    duration_s: float
    max_requests: int
    warmup_requests: int

    def __post_init__(self) -> None:
        if self.duration_s <= 0 and self.max_requests <= 0:
            raise ValueError("set a duration or a request count (or both); both are 0")


class Progress:
    """One status line on stderr, rewritten in place on a terminal, every few seconds otherwise."""

    def __init__(self, label: str, budget: Budget, clients: int = 1) -> None:
        self.label, self.budget, self.clients = label, budget, clients
        self.tty = sys.stderr.isatty()
        self.start = time.perf_counter()
        self.last = self.start  # first line after one interval: a 0 % line says nothing

    def update(self, done: int, force: bool = False) -> None:
        now = time.perf_counter()
        if not force and now - self.last < (0.25 if self.tty else 3.0):
            return
        self.last = now
        elapsed = now - self.start
        parts = [f"{done} req", f"{elapsed:5.1f}s"]
        if self.budget.duration_s > 0:
            parts.append(f"{min(100.0, 100 * elapsed / self.budget.duration_s):3.0f}% of {self.budget.duration_s:g}s")
        if self.budget.max_requests > 0:
            parts.append(f"cap {self.budget.max_requests * self.clients} req")
        line = f"  [{self.label}] " + " | ".join(parts)
        sys.stderr.write(("\r" + line + "   ") if self.tty else line + "\n")
        sys.stderr.flush()

    def finish(self, summary: str) -> None:
        line = f"  [{self.label}] {summary}"
        sys.stderr.write(("\r" + line + " " * 20 + "\n") if self.tty else line + "\n")
        sys.stderr.flush()


def warm_up(client: StackClient, requests: Sequence[Request], count: int) -> None:
    """Untimed requests first (connection, server caches, lazy graph capture); errors propagate."""
    for i in range(count):
        requests[i % len(requests)].send(client)


def run_loop(client: StackClient, requests: Sequence[Request], budget: Budget,
             counter: Any = None, slot: int = 0, progress: Progress | None = None, pace_s: float = 0.0) -> list[Sample]:
    """Send `requests` round-robin until the budget is spent; failed requests are kept as not ok. pace_s > 0: a
    paced client, each request due on a fixed schedule of one every pace_s seconds (sent at once when the answer
    to the one before came late), so it offers 1 / pace_s requests a second while it keeps up; its latency counts
    from when it was due, not when it went out, so a stall is charged to every request it delayed (no
    coordinated omission). 0 = the next as soon as the last is answered (closed loop)."""
    samples: list[Sample] = []
    start = time.perf_counter()
    deadline = start + budget.duration_s if budget.duration_s > 0 else float("inf")
    i = 0
    while time.perf_counter() < deadline and (budget.max_requests <= 0 or i < budget.max_requests):
        request = requests[i % len(requests)]
        due = start + i * pace_s
        if due >= deadline:  # a paced client's next request falls after the budget
            break
        if pace_s > 0 and (wait := due - time.perf_counter()) > 0:
            time.sleep(wait)
        sent = time.perf_counter()
        try:
            samples.append(request.send(client))
            if pace_s > 0 and sent > due:  # sent late behind a slow answer: the wait counts
                samples[-1] = replace(samples[-1], latency_s=samples[-1].latency_s + sent - due)
        except (StackError, HTTPError):
            samples.append(Sample(sent, time.perf_counter() - sent, len(request.texts), 0, False, ok=False))
        i += 1
        if counter is not None:
            counter[slot] = i
        if progress is not None:
            progress.update(i)
    return samples


def parse_cpus(text: str | None) -> tuple[int, ...]:
    """'8-15,20' -> (8, ..., 15, 20); None or '' -> () (no pinning)."""
    cpus: list[int] = []
    for part in (text or "").split(","):
        if part.strip():
            lo, _, hi = part.partition("-")
            try:
                cpus.extend(range(int(lo), int(hi or lo) + 1))
            except ValueError:
                raise ValueError(f"--client-cpus {text!r}: expected a CPU list such as 8-15,20") from None
    return tuple(cpus)


def _worker(spec: ClientSpec, requests: Sequence[Request], budget: Budget, slot: int,
            counter: Any, results: Any, go: Any, pace_s: float = 0.0) -> None:
    try:
        if spec.cpus and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, spec.cpus)
        with spec.connect() as client:
            warm_up(client, requests, budget.warmup_requests)
            results.put(("ready", slot, None))
            if not go.wait(timeout=600):
                return
            samples = run_loop(client, requests, budget, counter, slot, pace_s=pace_s)
        results.put(("done", slot, samples))
    except Exception as exc:  # reported to the parent, which stops the suite with the message
        results.put(("error", slot, f"{type(exc).__name__}: {exc}"))


def run_clients(spec: ClientSpec, per_client: Sequence[Sequence[Request]], budget: Budget,
                label: str, on_start: Callable[[], object] | None = None) -> list[Sample]:
    """Run one closed-loop client process per entry of `per_client`; all start measuring together, once
    every one has warmed up (`on_start` runs just before: e.g. a reading of the server's counters)."""
    return [s for samples in run_clients_apart(spec, per_client, budget, label, on_start) for s in samples]


def run_clients_apart(spec: ClientSpec, per_client: Sequence[Sequence[Request]], budget: Budget,
                      label: str, on_start: Callable[[], object] | None = None,
                      paces: Sequence[float] = ()) -> list[list[Sample]]:
    """run_clients, each client's samples apart (in `per_client`'s order): traffic of several kinds at once.
    paces: each client's pace_s (run_loop), in the same order; missing ones are closed loops."""
    ctx = mp.get_context("spawn")
    n = len(per_client)
    counter = ctx.Array("q", n, lock=False)
    results = ctx.Queue()
    go = ctx.Event()
    procs = [ctx.Process(target=_worker, args=(spec, list(reqs), budget, slot, counter, results, go,
                                               paces[slot] if slot < len(paces) else 0.0),
                         daemon=True) for slot, reqs in enumerate(per_client)]
    for proc in procs:
        proc.start()
    progress = Progress(label, budget, n)
    samples: list[list[Sample]] = [[] for _ in range(n)]
    finished = False
    try:
        ready = done = 0
        limit = time.monotonic() + 600 + budget.duration_s + spec.timeout_s * max(1, budget.warmup_requests)
        while done < n:
            if time.monotonic() > limit:
                raise StackError(f"{label}: client processes did not finish in time")
            try:
                kind, slot, payload = results.get(timeout=0.2)
            except queue.Empty:
                if ready == n:
                    progress.update(sum(counter[:]))
                if any(not p.is_alive() and p.exitcode not in (0, None) for p in procs):
                    raise StackError(f"{label}: a client process died") from None
                continue
            if kind == "error":
                raise StackError(f"{label}: client {slot} failed: {payload}")
            if kind == "ready":
                ready += 1
                if ready == n:
                    if on_start is not None:
                        on_start()
                    progress.start = time.perf_counter()
                    go.set()
            else:
                done += 1
                samples[slot] = payload
        finished = True
    finally:
        for proc in procs:
            if not finished:  # a failed suite stops its clients now instead of letting them measure
                proc.terminate()
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
    return samples
