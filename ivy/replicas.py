"""The Tulip replicas one Ivy worker talks to: channels, health, model checks, least-outstanding-tokens picking.

Each replica is probed every `health_interval_s` (grpc.health.v1 Check, then Info): it takes traffic only
while it is SERVING and its Info matches Ivy's tokenizer (fingerprint, dimensions, max length, model id).
The gateway is ready while any replica serves, degraded while some do not (the ivy_degraded gauge).
A call that fails with UNAVAILABLE marks the replica down at once; the next probe brings it back.
Replicas are a static list, or follow a headless Service's DNS name (ivy/discovery.py).
`call` sends one chunk to the replica with the fewest outstanding tokens (over the replica's EmbedStream,
ivy/stream.py, unless `stream` is off or the answer is large) and retries it elsewhere while the request's
deadline allows: ivy/dispatch.py says when.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2

from ivy import dispatch, metrics
from ivy.discovery import Discovery, is_dns
from ivy.replica import Replica, State, channel_options
from protos import embed_pb2

__all__ = ["STALE_AFTER_S", "Expected", "Replica", "ReplicaPool", "State", "channel_options"]

log = logging.getLogger("ivy.replicas")


@dataclass(frozen=True)
class Expected:
    """What every replica must serve: Ivy's own tokenizer and model."""

    model_ids: frozenset[str]
    fingerprint: str
    dimensions: int
    max_length: int
    tasks: tuple[str, ...] = ("embed",)

    def mismatch(self, info: embed_pb2.InfoResponse) -> str | None:
        if info.tokenizer_fingerprint != self.fingerprint:
            return "tokenizer fingerprint differs"
        if info.dimensions != self.dimensions:
            return f"dimensions {info.dimensions} != {self.dimensions}"
        if info.max_length != self.max_length:
            return f"max_length {info.max_length} != {self.max_length}"
        if info.model_id not in self.model_ids:
            return f"model {info.model_id!r} is not {sorted(self.model_ids)}"
        tasks = tuple(info.tasks) or ("embed",)  # older replicas say nothing: they embed
        if tasks != self.tasks:
            return f"tasks {list(tasks)} != {list(self.tasks)}"
        return None


LEAVE_GRACE_S = 60.0  # a replica gone from DNS is closed once its calls end, or after this long
STALE_AFTER_S = 0.25  # requests probe a replica seen down at most 4 times a second, whatever the traffic


def probe_timeout_s(health_interval_s: float) -> float:
    """Each health or Info probe's timeout: a slow answer is not a dead replica (so /ready takes up to twice it)."""
    return max(1.0, min(2.0, health_interval_s))


class ReplicaPool:
    def __init__(self, addresses: tuple[str, ...], expected: Expected, *, health_interval_s: float,
                 max_message_bytes: int, stream: bool = True, framed: bool = False, attempt_timeout_s: float = 0.0,
                 resolver: Callable = socket.getaddrinfo) -> None:
        self.attempt_timeout_s = attempt_timeout_s  # 0 = a chunk waits on its replica until the deadline
        options = channel_options(max_message_bytes)
        self._new = functools.partial(Replica, options=options, stream=stream, framed=framed,
                                      max_message_bytes=max_message_bytes, on_change=self._publish)
        self.discovery = Discovery([a for a in addresses if is_dns(a)], resolver)  # ivy/discovery.py
        self._static = [a for a in addresses if not is_dns(a)]
        self.replicas: list[Replica] = [self._new(a) for a in self._static]  # replaced, never changed in place
        self._leaving: dict[Replica, asyncio.Task] = {}  # gone from DNS: closed once their calls finish
        self.expected = expected
        self.interval = health_interval_s
        self._probe_timeout = probe_timeout_s(health_interval_s)
        self._tiebreak = itertools.count()
        self._task: asyncio.Task | None = None
        self._refresh: asyncio.Task | None = None
        self._last_probe = 0.0
        self._closing = False
        self._publish()

    async def start(self) -> None:
        await self.resolve()
        await self.probe_all()
        self._task = asyncio.create_task(self._watch(), name="ivy-replica-health")

    async def close(self) -> None:
        self._closing = True  # the watcher stops at its next round even if its cancellation is lost (_watch)
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for task in self._leaving.values():
            task.cancel()
        leaving = list(self._leaving)
        await asyncio.gather(*self._leaving.values(), return_exceptions=True)
        await asyncio.gather(*(r.close() for r in self.replicas + leaving), return_exceptions=True)

    # ---- membership (DNS) ----

    async def resolve(self) -> None:
        """Follow the DNS names: new addresses become replicas, vanished ones leave (ivy/discovery.py)."""
        if not self.discovery:
            return
        found = await self.discovery.addresses()
        if found is None:
            return
        wanted = list(dict.fromkeys([*self._static, *found]))
        current = {r.address: r for r in self.replicas}
        if set(wanted) == set(current):
            return
        self.replicas = [current.get(a) or self._new(a) for a in wanted]
        for address in wanted:
            if address not in current:
                log.info("replica %s joined (DNS)", address)
        for address, replica in current.items():
            if address not in wanted:
                log.info("replica %s left (DNS): no new chunks; closing once its %d tokens in flight are answered",
                         address, replica.outstanding_tokens)
                self._leaving[replica] = asyncio.create_task(self._close_when_idle(replica))
        self._publish()

    async def _close_when_idle(self, replica: Replica) -> None:
        try:
            end = time.monotonic() + LEAVE_GRACE_S
            while replica.outstanding_tokens and time.monotonic() < end:
                await asyncio.sleep(0.05)
        finally:
            self._leaving.pop(replica, None)
            if all(r.address != replica.address for r in self.replicas):  # not back (a pod IP reused) meanwhile:
                replica.forget()  # the new replica's series are the same ones
            await replica.close()

    # ---- health ----

    async def _watch(self) -> None:
        # Not `while True`: a second guard should any await in a round swallow close()'s cancel, as Python 3.11's
        # asyncio.wait_for did around the DNS lookup (ivy/discovery.py now bounds it with asyncio.timeout): the
        # task then ran on forever, and close() waited on it forever.
        while not self._closing:
            await asyncio.sleep(self.interval)
            try:
                await self.resolve()
                await self.probe_all()
            except Exception:  # noqa: BLE001 - the watcher must outlive any single probe failure
                log.exception("replica probe round failed")

    async def probe_all(self) -> None:
        await asyncio.gather(*(self._probe(r) for r in self.replicas))
        self._last_probe = time.monotonic()

    async def refresh(self, max_age_s: float = 0.5) -> None:
        """Probe now unless a probe finished within `max_age_s`; concurrent callers share one probe."""
        if time.monotonic() - self._last_probe <= max_age_s:
            return
        if self._refresh is None or self._refresh.done():
            self._refresh = asyncio.create_task(self.probe_all())
        await asyncio.shield(self._refresh)

    async def _probe(self, r: Replica) -> None:
        try:
            status = await r.health.Check(health_pb2.HealthCheckRequest(service=""), timeout=self._probe_timeout)
            if status.status != health_pb2.HealthCheckResponse.SERVING:
                r.set_state(State.NOT_SERVING, health_pb2.HealthCheckResponse.ServingStatus.Name(status.status))
                return
            info = await r.embedder.Info(embed_pb2.InfoRequest(), timeout=self._probe_timeout)
        except grpc.aio.AioRpcError as exc:
            r.set_state(State.UNREACHABLE, exc.code().name)
            return
        r.adopt(info)
        problem = self.expected.mismatch(info)
        if problem:
            if r.state is not State.MISMATCH:
                log.error("replica %s serves a different model: %s; not routing to it", r.address, problem)
            r.set_state(State.MISMATCH, problem)
        else:
            r.set_state(State.SERVING)

    def busy(self) -> bool:
        """Some call of this process is waiting on a replica."""
        return any(r.outstanding_tokens for r in self.replicas)

    def all_framed(self) -> bool:
        """Every serving replica takes its requests over the framed EmbedStream (ivy.coalesce: then a call is
        cheap enough that sharing one costs more than it saves)."""
        serving = [r for r in self.replicas if r.state is State.SERVING]
        return bool(serving) and all(r.on_framed for r in serving)

    def ready(self) -> bool:
        """Ready while any replica serves (RELIABILITY 29): one GPU pod down or rolling must not take every
        gateway out of its Service; the others answer, `degraded()` says so."""
        return self.any_serving()

    def serving(self) -> int:
        return sum(r.state is State.SERVING for r in self.replicas)

    def degraded(self) -> bool:
        """Ready, with some replica not serving."""
        serving = self.serving()
        return 0 < serving < len(self.replicas)

    def _publish(self) -> None:
        serving = self.serving()
        metrics.REPLICAS.set(len(self.replicas))
        metrics.REPLICAS_SERVING.set(serving)
        metrics.DEGRADED.set(1 if 0 < serving < len(self.replicas) else 0)

    def any_serving(self) -> bool:
        return any(r.state is State.SERVING for r in self.replicas)

    async def any_serving_now(self, deadline: float | None = None) -> bool:
        """any_serving(), probing first when no replica serves in this process's view and its last probe
        is older than STALE_AFTER_S: a replica may have become ready since (other gateway workers and
        /ready already saw it), and its first request must not get a 503 from a stale view. The wait for
        that probe (up to its timeout, 1-2 s, on a silent replica) ends at the request's `deadline`
        (monotonic); the probe itself goes on for the next request."""
        if not self.any_serving():
            try:
                async with asyncio.timeout(None if deadline is None else max(0.0, deadline - time.monotonic())):
                    await self.refresh(STALE_AFTER_S)
            except TimeoutError:
                pass
        return self.any_serving()

    # ---- routing ----

    def pick(self, exclude: set[Replica], output: str = "") -> Replica | None:
        """The SERVING replica with the fewest outstanding tokens (ties rotate), skipping `exclude` and those that do
        not serve `output` (Replica.serves: an older Tulip mid-rollout)."""
        best, best_key = None, None
        turn = next(self._tiebreak)
        n = len(self.replicas)
        for i, r in enumerate(self.replicas):
            if r.state is not State.SERVING or r in exclude or (output and not r.serves(output)):
                continue
            key = (r.outstanding_tokens, (i - turn) % n)
            if best_key is None or key < best_key:
                best, best_key = r, key
        return best

    def answering_other(self, exclude: set[Replica], replica: Replica, since: float, output: str = "") -> bool:
        """Some SERVING replica besides `replica` and `exclude` is shown to answer: it has nothing in flight, or it
        answered something after `since` (monotonic); for a chunk of a named `output`, one whose Info names it. One
        that is late too is no better a place for a chunk: every replica late at once is a stall of the host, not
        of one replica; nor is one that may not take it (an older Tulip mid-rollout, Replica.serves)."""
        return any(r.state is State.SERVING and r is not replica and r not in exclude
                   and (not output or output in r.outputs)
                   and (not r.attempts or r.last_answer > since) for r in self.replicas)

    async def call(self, request: embed_pb2.EmbedRequest, tokens: int, deadline: float) -> embed_pb2.EmbedResponse:
        """One chunk, retried elsewhere within the deadline (ivy.dispatch)."""
        return await dispatch.send(self, request, tokens, deadline)

    def describe(self) -> list[dict]:
        return [r.describe() for r in self.replicas]
