"""Tulip's framed EmbedStream from Ivy's side (IVY_FRAMED): ReplicaStream's embed() over a plain TCP connection.

Tulip's Info names its framed port (tulip/framed.py); each request is one StreamRequest behind a 4-byte
little-endian length, each answer one StreamResponse, matched by id. embed() behaves as ReplicaStream.embed
does: the EmbedResponse, or CallFailed with the status the unary call would have ended with; a timed-out or
cancelled request sends a cancel. Replica.adopt opens the connection (connect()) before it moves any request
here; when it breaks every request waiting on it fails with UNAVAILABLE (the pool retries elsewhere) and the
next request opens a new one (a refusal then moves the replica back to gRPC: Replica.embed).
"""

from __future__ import annotations

import asyncio
import itertools
import logging

import grpc
from google.protobuf.message import DecodeError

from ivy.stream import _BY_VALUE, CallFailed, settle
from protos import embed_pb2
from protos.framing import FrameBuffer, frame, keep_alive

log = logging.getLogger("ivy.framed")

# A connect not answered in this long counts as refused: a NetworkPolicy or firewall drops the framed port's
# SYNs rather than resetting them, and requests must not wait out their deadlines on it (one SYN resent at 1 s).
CONNECT_TIMEOUT_S = 3.0


def host_of(address: str) -> str:
    """The host of a replica's "HOST:PORT" ("[v6]:PORT" too): where its framed port is."""
    host = address.rsplit(":", 1)[0]
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


class _Connection(asyncio.Protocol):
    def __init__(self, address: str, max_frame_bytes: int, on_refused=None) -> None:
        self.address = address
        self.on_refused = on_refused  # the replica's framed port is full (too_many_connections)
        self.pending: dict[int, asyncio.Future] = {}
        self.transport: asyncio.Transport | None = None
        self.live = True
        self._frames = FrameBuffer(max_frame_bytes)
        self._writable = asyncio.Event()
        self._writable.set()

    def connection_made(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        keep_alive(transport)  # each frame out at once; a replica gone without a word is noticed in ~1 min

    def data_received(self, data: bytes) -> None:
        for payload in self._frames.feed(data):
            try:
                message = embed_pb2.StreamResponse.FromString(payload)
            except DecodeError:
                self.close("an answer frame is not a StreamResponse")
                return
            if message.id == 0 and message.code:  # the replica refused the connection or its bytes: it closes it
                if message.reason == "too_many_connections" and self.on_refused is not None:
                    self.on_refused()  # before the requests fail: the replica moves them to gRPC
                self.close(f"{_BY_VALUE.get(message.code, grpc.StatusCode.UNKNOWN).name}: {message.message}")
                return
            settle(self.pending.pop(message.id, None), message)
        if self._frames.oversize:
            self.close(f"an answer of {self._frames.oversize} bytes is over the message limit")

    def write(self, message: embed_pb2.StreamRequest) -> None:
        self.transport.write(frame(message))

    async def writable(self) -> None:
        await self._writable.wait()

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    def close(self, why: str) -> None:
        if self.transport is not None:
            self.transport.abort()  # not close(): unsent bytes to a hung replica would hold the socket
        self._fail(why)

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail("the replica ended the framed stream")

    def _fail(self, why: str) -> None:
        self.live = False
        self._writable.set()
        pending, self.pending = self.pending, {}
        failure = CallFailed(grpc.StatusCode.UNAVAILABLE, f"framed stream to {self.address} broke: {why}")
        for future in pending.values():
            if not future.done():
                future.set_exception(failure)


class FramedStream:
    def __init__(self, host: str, port: int, address: str, max_frame_bytes: int) -> None:
        self.host, self.port, self.address = host, port, address
        self.max_frame_bytes = max_frame_bytes
        self._current: _Connection | None = None
        self._opening: asyncio.Future | None = None
        self._ids = itertools.count(1)
        self.opened = 0
        self.connect_failed = False  # the last connect was refused or timed out (Replica falls back to gRPC)
        self.connect_timeout_s = CONNECT_TIMEOUT_S
        self._closes = 0  # close() calls: a connect that finishes after one is dropped, not kept
        self._calls = 0  # embed() calls under way: connecting, waiting to write, or for their answer

    async def embed(self, request: embed_pb2.EmbedRequest, timeout: float) -> embed_pb2.EmbedResponse:
        request_id = next(self._ids)
        connection = None
        self._calls += 1
        try:
            async with asyncio.timeout(timeout):
                connection = await self._connection()
                await connection.writable()
                if not connection.live:
                    raise CallFailed(grpc.StatusCode.UNAVAILABLE, f"framed stream to {self.address} broke")
                future = asyncio.get_running_loop().create_future()
                connection.pending[request_id] = future
                connection.write(embed_pb2.StreamRequest(id=request_id, request=request, timeout_s=timeout))
                return await future
        except TimeoutError:
            raise CallFailed(grpc.StatusCode.DEADLINE_EXCEEDED, "deadline exceeded on the framed stream") from None
        finally:
            self._calls -= 1
            if connection is not None and connection.pending.pop(request_id, None) is not None and connection.live:
                connection.write(embed_pb2.StreamRequest(id=request_id, cancel=True))  # drop its queued work

    async def connect(self) -> None:
        """Open the connection now (Replica.adopt, before any request is moved here); raises CallFailed."""
        await self._connection()

    async def _connection(self) -> _Connection:
        if self._current is not None and self._current.live:
            return self._current
        if self._opening is None or self._opening.done():  # one connect for every request waiting on it
            self._opening = asyncio.ensure_future(self._open())
        return await asyncio.shield(self._opening)

    async def _open(self) -> _Connection:
        closes = self._closes
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _, connection = await asyncio.get_running_loop().create_connection(
                    lambda: _Connection(self.address, self.max_frame_bytes, self._refused), self.host, self.port)
        except (OSError, TimeoutError) as exc:
            self.connect_failed = True
            # TimeoutError is an OSError: test it first
            why = f"no answer to a connect in {self.connect_timeout_s:g} s" if isinstance(exc, TimeoutError) else exc
            raise CallFailed(grpc.StatusCode.UNAVAILABLE, f"framed stream to {self.address}: {why}") from None
        if self._closes != closes:  # closed while connecting: nobody would close this connection
            connection.close("closed")
            raise CallFailed(grpc.StatusCode.UNAVAILABLE, f"framed stream to {self.address} was closed")
        self.connect_failed = False
        self._current = connection
        self.opened += 1
        return connection

    def _refused(self) -> None:
        """The replica's framed port is full: counted as a failed connect (Replica goes back to gRPC)."""
        self.connect_failed = True

    @property
    def waiting(self) -> int:
        """Requests under way on this stream, those still connecting or waiting to write included (a stream the
        replica left is closed once none is: Replica._switch; counting only the answers awaited, it was closed under
        a request paused before its write, which then failed UNAVAILABLE and marked a healthy replica down)."""
        return self._calls

    async def close(self) -> None:
        """End the connection (every request on it fails with UNAVAILABLE); the next request opens a new one,
        as ReplicaStream does after an ejection."""
        self._closes += 1
        if self._current is not None:
            self._current.close("closed")
            self._current = None
