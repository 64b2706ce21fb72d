"""The Tulip replicas one Ivy worker talks to: channels, health, model checks, least-outstanding-tokens picking.

Each replica is probed every `health_interval_s` (grpc.health.v1 Check, then Info): it takes traffic only
while it is SERVING and its Info matches Ivy's tokenizer (fingerprint, dimensions, max length, model id).
The gateway is ready while any replica serves, degraded while some do not (the ivy_degraded gauge).
A call that fails with UNAVAILABLE marks the replica down at once; the next probe brings it back.
`call` sends one chunk to the replica with the fewest outstanding tokens (over the replica's EmbedStream,
ivy/stream.py, unless `stream` is off or the answer is large) and retries it elsewhere while the request's
deadline allows: ivy/dispatch.py says when.
"""

from __future__ import annotations

import asyncio
import enum
import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ivy import dispatch, metrics
from ivy.stream import CallFailed, ReplicaStream
from protos import embed_pb2, embed_pb2_grpc

log = logging.getLogger("ivy.replicas")


def channel_options(max_message_bytes: int) -> list[tuple[str, int]]:
    """Client options, set deliberately: message caps both ways, and keepalive pings that Tulip's server
    options permit (min ping interval <= 30 s, pings without calls allowed) so idle channels are kept, not
    GOAWAY'd for too_many_pings. Reconnect backoff is capped so a restarted replica is found within seconds."""
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.keepalive_time_ms", 30000),
        ("grpc.keepalive_timeout_ms", 10000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.initial_reconnect_backoff_ms", 200),
        ("grpc.max_reconnect_backoff_ms", 2000),
    ]


class State(enum.Enum):
    UNKNOWN = "unknown"
    SERVING = "serving"
    NOT_SERVING = "not_serving"  # loading, warming up or draining
    MISMATCH = "model_mismatch"  # serves another model or tokenizer
    UNREACHABLE = "unreachable"


@dataclass(frozen=True)
class Expected:
    """What every replica must serve: Ivy's own tokenizer and model."""

    model_ids: frozenset[str]
    fingerprint: str
    dimensions: int
    max_length: int

    def mismatch(self, info: embed_pb2.InfoResponse) -> str | None:
        if info.tokenizer_fingerprint != self.fingerprint:
            return "tokenizer fingerprint differs"
        if info.dimensions != self.dimensions:
            return f"dimensions {info.dimensions} != {self.dimensions}"
        if info.max_length != self.max_length:
            return f"max_length {info.max_length} != {self.max_length}"
        if info.model_id not in self.model_ids:
            return f"model {info.model_id!r} is not {sorted(self.model_ids)}"
        return None


class Replica:
    def __init__(self, address: str, options: list[tuple[str, int]], *, stream: bool = True,
                 max_message_bytes: int = 1 << 30, on_change: Callable[[], None] | None = None) -> None:
        self.address = address
        self._on_change = on_change  # the pool's: its readiness gauges follow every state change
        # Messages the shared stream takes: a message over the channel's cap would end the whole call (every
        # request on it), and a large answer would hold the small ones behind it. Larger ones go unary.
        self.stream_max_bytes = min(STREAM_MAX_MESSAGE_BYTES, max_message_bytes - 1024)
        self.channel = grpc.aio.insecure_channel(address, options=options)
        self.embedder = embed_pb2_grpc.EmbedderStub(self.channel)
        self.stream = ReplicaStream(self.embedder, address) if stream else None
        self.health = health_pb2_grpc.HealthStub(self.channel)
        self.state = State.UNKNOWN
        self.detail = ""
        self.info: embed_pb2.InfoResponse | None = None
        self.outstanding_tokens = 0
        # Labelled children resolved once: labels() costs a lock and a dict lookup on every call.
        self.m_outstanding = metrics.OUTSTANDING.labels(address)
        self.m_chunks = metrics.CHUNKS.labels(address)
        self.m_grpc_seconds = metrics.GRPC_SECONDS.labels(address)

    async def embed(self, request: embed_pb2.EmbedRequest, timeout: float, response_bytes: int) -> embed_pb2.EmbedResponse:
        """One chunk on this replica: over the stream, or a unary call for a large response (on the shared
        stream it would hold the small answers behind it). Raises CallFailed."""
        limit = self.stream_max_bytes
        if self.stream is not None and response_bytes <= limit and request.ByteSize() <= limit:
            return await self.stream.embed(request, timeout)
        try:
            return await self.embedder.Embed(request, timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            raise CallFailed(exc.code(), exc.details() or "", _reason(exc)) from None

    async def close(self) -> None:
        if self.stream is not None:
            await self.stream.close()
        await self.channel.close()

    def mark_down(self, detail: str) -> None:
        """A call failed as if the replica were gone: not routed to until a probe finds it SERVING."""
        self.set_state(State.UNREACHABLE, detail)

    def eject(self, detail: str) -> None:
        """No answer in time (a hung replica, RELIABILITY 28): marked down, and its stream closed so every
        chunk in flight on it fails over now (UNAVAILABLE) instead of each waiting out its own timeout; the
        next request to it opens a new stream."""
        self.mark_down(detail)
        if self.stream is not None:
            task = asyncio.ensure_future(self.stream.close())
            _BACKGROUND.add(task)
            task.add_done_callback(_BACKGROUND.discard)

    def set_state(self, state: State, detail: str = "") -> None:
        changed = state != self.state
        if changed:
            log.info("replica %s: %s -> %s %s", self.address, self.state.value, state.value, detail)
        self.state, self.detail = state, detail
        metrics.REPLICA_UP.labels(self.address).set(1 if state is State.SERVING else 0)
        if changed and self._on_change is not None:
            self._on_change()

    def describe(self) -> dict:
        out = {"address": self.address, "state": self.state.value, "outstanding_tokens": self.outstanding_tokens}
        if self.detail:
            out["detail"] = self.detail
        if self.info is not None:
            out["model"] = self.info.model_id
            out["device"] = self.info.device
        return out


STREAM_MAX_MESSAGE_BYTES = 1 << 20
_BACKGROUND: set[asyncio.Task] = set()  # streams being closed (a task must be referenced until it ends)
STALE_AFTER_S = 0.25  # requests probe a replica seen down at most 4 times a second, whatever the traffic


class ReplicaPool:
    def __init__(self, addresses: tuple[str, ...], expected: Expected, *, health_interval_s: float,
                 max_message_bytes: int, stream: bool = True, attempt_timeout_s: float = 0.0) -> None:
        self.attempt_timeout_s = attempt_timeout_s  # 0 = a chunk waits on its replica until the deadline
        options = channel_options(max_message_bytes)
        self.replicas = [Replica(a, options, stream=stream, max_message_bytes=max_message_bytes,
                                 on_change=self._publish) for a in addresses]
        self.expected = expected
        self.interval = health_interval_s
        self._probe_timeout = max(1.0, min(2.0, health_interval_s))  # a slow answer is not a dead replica
        self._tiebreak = itertools.count()
        self._task: asyncio.Task | None = None
        self._refresh: asyncio.Task | None = None
        self._last_probe = 0.0
        self._publish()

    async def start(self) -> None:
        await self.probe_all()
        self._task = asyncio.create_task(self._watch(), name="ivy-replica-health")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await asyncio.gather(*(r.close() for r in self.replicas), return_exceptions=True)

    # ---- health ----

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
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
        r.info = info
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

    async def any_serving_now(self) -> bool:
        """any_serving(), probing first when no replica serves in this process's view and its last probe
        is older than STALE_AFTER_S: a replica may have become ready since (other gateway workers and
        /ready already saw it), and its first request must not get a 503 from a stale view."""
        if not self.any_serving():
            await self.refresh(STALE_AFTER_S)
        return self.any_serving()

    # ---- routing ----

    def pick(self, exclude: set[Replica]) -> Replica | None:
        """The SERVING replica with the fewest outstanding tokens (ties rotate), skipping `exclude`."""
        best, best_key = None, None
        turn = next(self._tiebreak)
        n = len(self.replicas)
        for i, r in enumerate(self.replicas):
            if r.state is not State.SERVING or r in exclude:
                continue
            key = (r.outstanding_tokens, (i - turn) % n)
            if best_key is None or key < best_key:
                best, best_key = r, key
        return best

    def has_other(self, exclude: set[Replica], replica: Replica) -> bool:
        """Some SERVING replica besides `replica` and `exclude` could take a chunk."""
        return any(r.state is State.SERVING and r is not replica and r not in exclude for r in self.replicas)

    async def call(self, request: embed_pb2.EmbedRequest, tokens: int, deadline: float) -> embed_pb2.EmbedResponse:
        """One chunk, retried elsewhere within the deadline (ivy.dispatch)."""
        return await dispatch.send(self, request, tokens, deadline)

    def describe(self) -> list[dict]:
        return [r.describe() for r in self.replicas]


def _reason(exc: grpc.aio.AioRpcError) -> str:
    """Tulip's "tulip-reason" trailing metadata (queue_full, response_too_large, shutting_down, ...)."""
    for key, value in exc.trailing_metadata() or ():
        if key == "tulip-reason":
            return value if isinstance(value, str) else value.decode()
    return ""
