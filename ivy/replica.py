"""One Tulip replica as one Ivy worker sees it: its channel, stream, state and outstanding tokens.

The pool (ivy/replicas.py) probes and picks replicas; ivy/dispatch.py sends chunks to them.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Callable, Sequence

import grpc
from grpc_health.v1 import health_pb2_grpc

from ivy import metrics
from ivy.framed import FramedStream, host_of
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


class Replica:
    def __init__(self, address: str, options: list[tuple[str, int]], *, stream: bool = True, framed: bool = False,
                 max_message_bytes: int = 1 << 30, on_change: Callable[[], None] | None = None) -> None:
        self.address = address
        self._on_change = on_change  # the pool's: its readiness gauges follow every state change
        # Messages the shared stream takes: a message over the channel's cap would end the whole call (every
        # request on it), and a large answer would hold the small ones behind it. Larger ones go unary.
        self.stream_max_bytes = min(STREAM_MAX_MESSAGE_BYTES, max_message_bytes - 1024)
        self.channel = grpc.aio.insecure_channel(address, options=options)
        self.embedder = embed_pb2_grpc.EmbedderStub(self.channel)
        self.stream: ReplicaStream | FramedStream | None = ReplicaStream(self.embedder, address) if stream else None
        self.framed = framed and stream  # use the framed EmbedStream once Info names its port (adopt)
        self._trying: FramedStream | None = None  # a framed stream connecting; requests move there once it is
        self._trying_task: asyncio.Task | None = None
        self._refused_port = 0  # a framed port that refused or dropped a connect: not tried before _retry_at
        self._retry_at = 0.0
        self._retry_s = FRAMED_RETRY_S
        self.max_message_bytes = max_message_bytes
        self.health = health_pb2_grpc.HealthStub(self.channel)
        self.state = State.UNKNOWN
        self.detail = ""
        self.info: embed_pb2.InfoResponse | None = None
        self.lacks: set[str] = set()  # outputs it refused as unknown, its Info naming none (serves)
        self.outstanding_tokens = 0
        self.attempts: dict[object, float] = {}  # chunk attempts in flight -> when each began (monotonic)
        self.last_answer = float("-inf")  # when it last answered a chunk (rows or an error of its own)
        # Labelled children resolved once: labels() costs a lock and a dict lookup on every call.
        self.forgotten = False  # forget(): gone for good, its series out of /metrics
        self.m_outstanding = metrics.OUTSTANDING.labels(address)
        self.m_chunks = metrics.CHUNKS.labels(address)
        self.m_grpc_seconds = metrics.GRPC_SECONDS.labels(address)

    @property
    def on_framed(self) -> bool:
        """Its requests go over the framed EmbedStream now (ivy/framed.py), not a gRPC call."""
        return isinstance(self.stream, FramedStream)

    async def embed(self, request: embed_pb2.EmbedRequest, timeout: float,
                    response_bytes: int) -> embed_pb2.EmbedResponse:
        """One chunk on this replica: over the stream, or a unary call for a large response (on the shared
        stream it would hold the small answers behind it). Raises CallFailed."""
        limit = self.stream_max_bytes
        stream = self.stream
        if stream is not None and response_bytes <= limit and request.ByteSize() <= limit:
            deadline = asyncio.get_running_loop().time() + timeout
            try:
                return await stream.embed(request, timeout)
            except CallFailed:
                if not (isinstance(stream, FramedStream) and stream.connect_failed):
                    raise
            # Its framed port refused or dropped a reconnect (the replica restarted without it, or it is full):
            # this request and the next ones on gRPC, the port tried again later (_refuse).
            self._leave_framed(stream)
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                raise CallFailed(grpc.StatusCode.DEADLINE_EXCEEDED, "deadline exceeded connecting to the framed stream")
            return await self.stream.embed(request, left)
        try:
            return await self.embedder.Embed(request, timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            raise CallFailed(exc.code(), exc.details() or "", *_tulip_trailers(exc)) from None

    @property
    def outputs(self) -> Sequence[str]:
        """The outputs its Info names (EmbedRequest.output's names); none before an Info or from an older Tulip."""
        return self.info.outputs if self.info is not None else ()

    def serves(self, output: str) -> bool:
        """Whether an EmbedRequest.output of this name may be sent here: "" always; else as its Info names them; a
        Tulip whose Info names none (older than the field, or a model of one output) every output it has not
        refused as unknown (ivy.dispatch learns that from its INVALID_ARGUMENT, until its next Info)."""
        names = self.outputs
        if not names:
            return output not in self.lacks
        return not output or output in names

    def adopt(self, info: embed_pb2.InfoResponse) -> None:
        """A probe's Info: kept; with framed on, requests move to the framed EmbedStream it names (ivy/framed.py)
        once a connection to it is open (connected in the background: no request waits on that connect), and
        the stream they leave is closed once its requests are answered. A port that refuses or drops connects
        is tried again after FRAMED_RETRY_S, doubling up to FRAMED_RETRY_MAX_S."""
        self.info = info
        self.lacks = set()
        port = info.framed_port if self.framed else 0
        current = self.stream.port if isinstance(self.stream, FramedStream) else 0
        if current and self.stream.connect_failed and port == current:
            self._leave_framed(self.stream)
            return
        if port and port == self._refused_port and asyncio.get_running_loop().time() < self._retry_at:
            port = 0
        if port == current or (port and self._trying is not None and self._trying.port == port):
            return
        if port:
            self._try_framed(port)
        elif current:  # restarted without a framed port, or framed off: the gRPC stream again
            log.info("replica %s: requests on its gRPC stream", self.address)
            self._switch(ReplicaStream(self.embedder, self.address))

    def _try_framed(self, port: int) -> None:
        candidate = FramedStream(host_of(self.address), port, self.address, self.max_message_bytes)
        self._trying = candidate
        self._trying_task = task = asyncio.ensure_future(self._connect_then_switch(candidate))
        _BACKGROUND.add(task)
        task.add_done_callback(_BACKGROUND.discard)

    async def _connect_then_switch(self, candidate: FramedStream) -> None:
        try:
            await candidate.connect()
        except CallFailed as exc:
            if self._trying is candidate:
                self._trying = None
                self._refuse(candidate.port, exc.details)
            await candidate.close()
            return
        if self._trying is not candidate:  # overtaken (another port, or closed) while connecting
            await candidate.close()
            return
        self._trying = None
        self._refused_port, self._retry_s = 0, FRAMED_RETRY_S
        log.info("replica %s: requests on its framed stream (port %d)", self.address, candidate.port)
        self._switch(candidate)

    async def framed_settled(self) -> None:
        """Until a framed connect under way has switched the requests over or been given up (tests, tools)."""
        if self._trying_task is not None:
            await asyncio.gather(self._trying_task, return_exceptions=True)

    def _refuse(self, port: int, why: str) -> None:
        """Reachable by gRPC only, for now (a Service or policy without that port, or a full or restarting
        replica): not tried again for _retry_s, which doubles each time."""
        log.warning("replica %s: its framed port %d is unreachable (%s); its gRPC stream for %.0f s",
                    self.address, port, why, self._retry_s)
        self._refused_port = port
        self._retry_at = asyncio.get_running_loop().time() + self._retry_s
        self._retry_s = min(2 * self._retry_s, FRAMED_RETRY_MAX_S)

    def _leave_framed(self, stream: FramedStream) -> None:
        """Its framed port refused or dropped a reconnect: back on the gRPC stream (see _refuse)."""
        if self.stream is not stream:
            return
        self._refuse(stream.port, "a reconnect failed")
        self._switch(ReplicaStream(self.embedder, self.address))

    def _switch(self, new: ReplicaStream | FramedStream) -> None:
        old, self.stream = self.stream, new
        if old is not None:
            task = asyncio.ensure_future(_close_when_idle(old))
            _BACKGROUND.add(task)
            task.add_done_callback(_BACKGROUND.discard)

    async def close(self) -> None:
        trying, self._trying = self._trying, None
        if trying is not None:
            await trying.close()
        if self.stream is not None:
            await self.stream.close()
        await self.channel.close()

    def forget(self) -> None:
        """Gone for good (left DNS): its series leave /metrics (ivy.metrics.forget_replica, RELIABILITY 50), and
        stay out: a call still open on it (a hung replica past the leave's grace) that fails afterwards marks it
        down without setting its up gauge again (which would bring the series back, at 0: TulipReplicaDown)."""
        self.forgotten = True
        metrics.forget_replica(self.address)

    def mark_down(self, detail: str) -> None:
        """A call failed as if the replica were gone: not routed to until a probe finds it SERVING. A replica
        already down keeps the first cause (an ejection's "no answer within", not the UNAVAILABLE its own
        closed stream then gives the other chunks in flight)."""
        if self.state is State.UNREACHABLE and self.detail:
            return
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
        if not self.forgotten:
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
FRAMED_RETRY_S = 30.0  # a framed port that refused or dropped a connect is tried again after this, doubling
FRAMED_RETRY_MAX_S = 3600.0
_BACKGROUND: set[asyncio.Task] = set()  # streams being closed (a task must be referenced until it ends)


def _tulip_trailers(exc: grpc.aio.AioRpcError) -> tuple[str, float | None]:
    """Tulip's "tulip-reason" trailing metadata (queue_full, response_too_large, shutting_down, ...) and its
    "tulip-retry-after-s" estimate (None when absent or unreadable: an older Tulip sends none)."""
    reason, retry_after = "", None
    for key, value in exc.trailing_metadata() or ():
        text = value if isinstance(value, str) else value.decode()
        if key == "tulip-reason":
            reason = text
        elif key == "tulip-retry-after-s":
            try:
                retry_after = float(text)
            except ValueError:
                retry_after = None
    return reason, retry_after


async def _close_when_idle(stream, grace_s: float = 30.0) -> None:
    """Close a stream requests have left, once what it carries is answered (or after grace_s)."""
    deadline = asyncio.get_running_loop().time() + grace_s
    while stream.waiting and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.05)
    await stream.close()
