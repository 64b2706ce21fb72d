"""One long-lived EmbedStream per replica (and gateway worker): requests multiplexed by id.

A unary call pays a call set-up and tear-down on both sides; on the stream each request is one message
each way. `embed()` behaves like the unary call it replaces: it returns the EmbedResponse or raises
CallFailed with the status the unary call would have ended with, and a cancelled or timed-out request
sends a cancel message so Tulip drops its sequences not yet batched. The stream opens on first use; when
it breaks (replica gone or restarted) every request waiting on it fails with UNAVAILABLE, which the
pool retries elsewhere, and the next request opens a new one. Writes are serialized (gRPC takes one
message at a time per call); one reader task settles the waiting futures.
"""

from __future__ import annotations

import asyncio
import itertools
import logging

import grpc

from protos import embed_pb2

log = logging.getLogger("ivy.stream")

_BY_VALUE = {c.value[0]: c for c in grpc.StatusCode}


class CallFailed(Exception):
    """A replica call ended with a non-OK status (unary or streamed)."""

    def __init__(self, code: grpc.StatusCode, details: str = "", reason: str = "",
                 retry_after_s: float | None = None) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code, self.details, self.reason = code, details, reason
        self.retry_after_s = retry_after_s  # Tulip's estimate of when a retry could succeed, where it sent one


def settle(future: asyncio.Future | None, message: embed_pb2.StreamResponse) -> None:
    """A stream's answer for the request waiting on `future`: its EmbedResponse, or CallFailed with the status
    the unary call would have ended with. None or done (cancelled meanwhile): dropped."""
    if future is None or future.done():
        return
    if message.code == 0:
        future.set_result(message.response)
    else:
        future.set_exception(CallFailed(_BY_VALUE.get(message.code, grpc.StatusCode.UNKNOWN), message.message,
                                        message.reason, message.retry_after_s or None))


class _Call:
    """One open EmbedStream call: its requests awaiting answers and the task that reads them."""

    __slots__ = ("call", "pending", "reader", "live")

    def __init__(self, call) -> None:
        self.call = call
        self.pending: dict[int, asyncio.Future] = {}
        self.reader: asyncio.Task | None = None
        self.live = True


class ReplicaStream:
    def __init__(self, stub, address: str) -> None:
        self._stub = stub
        self.address = address
        self._current: _Call | None = None
        self._ids = itertools.count(1)
        self._write_lock = asyncio.Lock()
        self._tasks: set[asyncio.Task] = set()  # readers and cancel messages still running
        self.opened = 0  # calls opened over this object's life (a reopen follows each break)

    async def embed(self, request: embed_pb2.EmbedRequest, timeout: float) -> embed_pb2.EmbedResponse:
        stream = self._current if self._current is not None else self._open()
        request_id = next(self._ids)
        future = asyncio.get_running_loop().create_future()
        stream.pending[request_id] = future
        # Shielded: grpc.aio cancels the whole call when a write is cancelled, which would fail every other
        # request on the stream because one client went away mid-write.
        write = asyncio.ensure_future(
            self._write(stream, embed_pb2.StreamRequest(id=request_id, request=request, timeout_s=timeout)))
        try:
            async with asyncio.timeout(timeout):
                await asyncio.shield(write)
                return await future
        except TimeoutError:
            raise CallFailed(grpc.StatusCode.DEADLINE_EXCEEDED, "deadline exceeded on the stream") from None
        finally:
            if stream.pending.pop(request_id, None) is not None and stream.live:
                # Timed out or cancelled by the caller: drop its work, once the request is on the wire.
                write.add_done_callback(lambda w: self._cancel_if_sent(w, stream, request_id))

    @property
    def waiting(self) -> int:
        """Requests waiting for their answer on the open call."""
        return len(self._current.pending) if self._current is not None else 0

    async def close(self) -> None:
        if self._current is not None:
            self._break(self._current)
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # ---- internals ----

    def _open(self) -> _Call:
        stream = self._current = _Call(self._stub.EmbedStream())
        self.opened += 1
        stream.reader = self._track(self._read(stream))
        return stream

    def _track(self, coro) -> asyncio.Task:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _write(self, stream: _Call, message: embed_pb2.StreamRequest) -> None:
        try:
            async with self._write_lock:
                await stream.call.write(message)
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError, grpc.aio.UsageError) as exc:
            self._break(stream)
            raise CallFailed(grpc.StatusCode.UNAVAILABLE, f"stream to {self.address} broke: "
                             f"{type(exc).__name__}") from None

    def _cancel_if_sent(self, write: asyncio.Future, stream: _Call, request_id: int) -> None:
        if not write.cancelled() and write.exception() is None and stream.live:
            self._send_cancel(stream, request_id)

    def _send_cancel(self, stream: _Call, request_id: int) -> None:
        async def send() -> None:
            try:
                await self._write(stream, embed_pb2.StreamRequest(id=request_id, cancel=True))
            except CallFailed:
                pass  # the stream broke: Tulip cancels everything of a call that ends
        self._track(send())

    async def _read(self, stream: _Call) -> None:
        failure = CallFailed(grpc.StatusCode.UNAVAILABLE, f"replica {self.address} ended the stream")
        try:
            while True:
                message = await stream.call.read()
                if message is grpc.aio.EOF:
                    break
                settle(stream.pending.pop(message.id, None), message)
        except grpc.aio.AioRpcError as exc:
            failure = CallFailed(grpc.StatusCode.UNAVAILABLE,
                                 f"stream to {self.address} broke: {exc.code().name}")
        except asyncio.CancelledError:
            failure = CallFailed(grpc.StatusCode.UNAVAILABLE, "the stream was closed")
        finally:
            self._break(stream)
            pending, stream.pending = stream.pending, {}
            for future in pending.values():
                if not future.done():
                    future.set_exception(failure)

    def _break(self, stream: _Call) -> None:
        """Stop using `stream`: the next request opens a new call; its reader fails what still waits."""
        if self._current is stream:
            self._current = None
        if stream.live:
            stream.live = False
            stream.call.cancel()
