"""The soak's two kinds of load: a closed-loop ramp that finds saturation, and open-loop Poisson arrivals.

Saturation: closed-loop clients (benchmarks/stack/load.py, one process each) on the soak's own request
mix, 1, 2, 4, ... clients for a short step each, until a step's request rate grows less than `growth`
over the best so far (or a step has errors, or the client cap is reached); the best rate is saturation.

Open loop: `procs` client processes, each a Poisson stream at rate/procs (their sum is a Poisson stream
at the rate), each arrival sent by the first free one of the process's `threads` keep-alive connections.
Latency runs from the arrival's scheduled time, not from its send, so a request that waited for a free
connection counts its wait (no coordinated omission); the wait is kept apart as `lag`. Each process
streams its finished requests to the parent about once a second, so a soak cut short keeps what ran.
A finished request is (done_s, latency_s, lag_s, kind, status): kind 0 a single query, 1 a document batch;
status the HTTP status, 0 a body the client could not use, -1 no answer (refused, reset, timed out).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import random
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from benchmarks.stack.client import StackError
from benchmarks.stack.load import Budget, ClientSpec, Request, run_clients
from benchmarks.stack.report import summarize
from ivy.http_connection import HTTPError

QUERY, BATCH = 0, 1
NO_ANSWER, BAD_BODY = -1, 0
Finished = tuple[float, float, float, int, int]


def ramp(spec: ClientSpec, mixed: Sequence[Request], step_s: float, max_clients: int, growth: float,
         say: Callable[[str], None]) -> tuple[float, list[dict[str, Any]]]:
    """(the saturation request rate, one record per step) from closed-loop clients 1, 2, 4, ... ."""
    steps: list[dict[str, Any]] = []
    best = 0.0
    clients = 1
    while clients <= max_clients:
        per_client = [list(mixed[k:]) + list(mixed[:k]) for k in range(clients)]  # each its own order
        samples = run_clients(spec, per_client, Budget(step_s, 0, 1), f"saturation {clients}")
        record = {"clients": clients, **summarize("saturation", clients, samples)}
        steps.append(record)
        say(f"   {clients:3d} clients: {record['rps']:.1f} req/s  p99 {record['p99_ms']:.1f} ms  "
            f"errors {record['errors']}")
        if record["errors"] or record["rps"] < best * (1 + growth):
            best = max(best, record["rps"])
            break
        best = record["rps"]
        clients *= 2
    return best, steps


@dataclass(frozen=True)
class OpenLoop:
    """One open-loop run: `rate_per_s` over all processes for `duration_s`, `batch_share` of arrivals batches."""

    spec: ClientSpec
    rate_per_s: float
    duration_s: float
    batch_share: float
    procs: int = 4
    threads: int = 32
    seed: int = 0


def _send(client: Any, request: Request) -> int:
    try:
        request.send(client)
        return 200
    except StackError as exc:
        return exc.status or BAD_BODY
    except HTTPError:
        return NO_ANSWER


def _open_worker(run: OpenLoop, queries: Sequence[Request], batches: Sequence[Request], slot: int,
                 results: Any, go: Any, start: Any) -> None:
    try:
        if run.spec.cpus and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, run.spec.cpus)
        pending: queue.Queue = queue.Queue()
        done: list[Finished] = []
        lock = threading.Lock()
        clients = [run.spec.connect() for _ in range(run.threads)]
        for client in clients[:2]:  # warm: the connection, the gateway's tokenizer, the served layouts
            queries[0].send(client)
            batches[0].send(client)

        def sender(client: Any) -> None:
            while (item := pending.get()) is not None:
                scheduled, kind, request = item
                sent = time.perf_counter()
                status = _send(client, request)
                finished = time.perf_counter()
                with lock:
                    done.append((finished, finished - scheduled, sent - scheduled, kind, status))

        senders = [threading.Thread(target=sender, args=(c,), daemon=True) for c in clients]
        for thread in senders:
            thread.start()
        results.put(("ready", slot, None))
        if not go.wait(timeout=600):
            return
        rng = random.Random(f"{run.seed}:open:{slot}")
        rate, t0 = run.rate_per_s / run.procs, start.value
        end, at, flushed, count = t0 + run.duration_s, t0 + rng.expovariate(rate), time.perf_counter(), 0
        while (now := time.perf_counter()) < end:  # to the end, though the next arrival may fall past it
            if at > now or at >= end:
                time.sleep(min(min(at, end) - now, 0.05))
            else:
                kind = BATCH if rng.random() < run.batch_share else QUERY
                pool = batches if kind == BATCH else queries
                pending.put((at, kind, pool[count % len(pool)]))
                count += 1
                at += rng.expovariate(rate)
            if now - flushed >= 1.0:
                with lock:
                    chunk, done[:] = list(done), []
                results.put(("samples", slot, chunk))
                flushed = now
        for _ in senders:
            pending.put(None)
        for thread in senders:
            thread.join(run.spec.timeout_s + 5)
        with lock:
            results.put(("samples", slot, list(done)))
        results.put(("done", slot, {"scheduled": count, "unsent": pending.qsize()}))
        for client in clients:
            client.close()
    except Exception as exc:  # reported to the parent, which stops the run with the message
        results.put(("error", slot, f"{type(exc).__name__}: {exc}"))


def open_loop(run: OpenLoop, queries: Sequence[Request], batches: Sequence[Request],
              on_start: Callable[[float], None], on_tick: Callable[[list[Finished]], None],
              tick_s: float = 0.2) -> dict[str, Any]:
    """Run the open-loop clients; `on_start(t0)` when they start, then `on_tick(new finished requests)` about
    every `tick_s` (the caller's probes run there). Returns what the processes reported at their end."""
    ctx = mp.get_context("spawn")
    results, go, start = ctx.Queue(), ctx.Event(), ctx.Value("d", 0.0)
    procs = [ctx.Process(target=_open_worker, args=(run, list(queries), list(batches), slot, results, go, start),
                         daemon=True) for slot in range(run.procs)]
    for proc in procs:
        proc.start()
    ready, finished, reports = 0, 0, {"scheduled": 0, "unsent": 0}
    limit = time.monotonic() + 600 + run.duration_s + run.spec.timeout_s
    last_tick = time.monotonic()
    clean = False
    try:
        while finished < run.procs:
            if time.monotonic() > limit:
                raise StackError("open loop: client processes did not finish in time")
            fresh: list[Finished] = []
            try:
                kind, slot, payload = results.get(timeout=tick_s)
                if kind == "error":
                    raise StackError(f"open loop: client {slot} failed: {payload}")
                if kind == "ready":
                    ready += 1
                    if ready == run.procs:
                        start.value = time.perf_counter() + 0.2  # every process is waiting on `go` by then
                        on_start(start.value)
                        go.set()
                elif kind == "samples":
                    fresh = payload
                else:
                    finished += 1
                    reports = {key: reports[key] + payload[key] for key in reports}
            except queue.Empty:
                if any(not p.is_alive() and p.exitcode not in (0, None) for p in procs):
                    raise StackError("open loop: a client process died") from None
            if ready == run.procs and (fresh or time.monotonic() - last_tick >= tick_s):
                on_tick(fresh)
                last_tick = time.monotonic()
        clean = True
    finally:
        for proc in procs:
            if not clean:
                proc.terminate()
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
    return reports
