"""EmbedStream: one long-lived bidirectional call per client, its requests multiplexed by id.

A unary Embed costs a call set-up and tear-down per request (~0.2 ms of grpc.aio CPU on each side); on a
stream that is paid once. Each StreamRequest is admitted exactly as a unary call is (TulipServer.admit:
same limits, same queue, same drain), carries its own deadline (`timeout_s`, from when Tulip reads it)
and is answered by one StreamResponse with its id as soon as its job settles, in any order. A cancel
message drops the request's sequences not yet batched and nothing is answered for it. When the call
ends (the client went away, or the server stops after its drain), every job still open is cancelled
the same way: nothing of a dead stream reaches the GPU.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

import grpc

from protos import embed_pb2
from tulip.errors import DeadlineExpired, InvalidRequest, TulipError, engine_error

if TYPE_CHECKING:
    from tulip.job import Job
    from tulip.server import TulipServer

log = logging.getLogger("tulip.stream")

_CODE = {c.name: c.value[0] for c in grpc.StatusCode}


class StreamRequests:
    """A stream's requests, whatever carries the messages (this gRPC call, or tulip.framed's connection):
    each StreamRequest admitted as a unary call is, answered through `send` once its job settles, a cancel
    dropping its work; `cancel_all` when the carrier ends.

    A carrier that can write from another thread passes `direct`: the completer then calls
    `direct.answer(request_id, job, result)` as the job finishes (True: written, the loop only settles it),
    and `direct.withdraw(job)` marks a cancelled job so that it is no longer written (True: it was already)."""

    def __init__(self, server: TulipServer, send, direct=None) -> None:
        self.server = server
        self.jobs: dict[int, Job] = {}
        self._expiries: dict[Job, asyncio.TimerHandle] = {}  # a request with a deadline: its _expire, by job
        self._send = send  # StreamResponse -> None; never blocks
        self._direct = direct

    def handle(self, message: embed_pb2.StreamRequest) -> None:
        if message.cancel:
            self._cancel(message.id)
        else:
            self._start(message)

    def cancel_all(self) -> None:
        for request_id in list(self.jobs):
            self._cancel(request_id)

    def _start(self, message: embed_pb2.StreamRequest) -> None:
        started = time.perf_counter()
        request = message.request
        try:
            if message.id in self.jobs:
                raise InvalidRequest(f"stream request id {message.id} is already in flight on this stream")
            job = self.server.admit(request, message.timeout_s if message.timeout_s > 0 else None, started)
        except TulipError as exc:
            self.server.rejected(request.request_id, exc)
            self.server.settled(None, exc.status, started)
            self._send(error_answer(message.id, exc))
            return
        self.jobs[message.id] = job
        if self._direct is not None:
            job.stream_id = message.id
            job.answer_via = self._direct
        if job.deadline is not None:
            self._expiries[job] = job.loop.call_later(max(0.0, job.deadline - time.monotonic()), self._expire,
                                                      message.id, job)
        job.future.add_done_callback(lambda f, i=message.id: self._answer(i, job, f, started))

    def _answer(self, request_id: int, job: Job, future: asyncio.Future, started: float) -> None:
        expiry = self._expiries.pop(job, None)
        if expiry is not None:
            expiry.cancel()
        withdrawn = self.jobs.get(request_id) is not job  # a cancel took it out (its id may name another now)
        if not withdrawn:
            del self.jobs[request_id]
        error = None if future.cancelled() else future.exception()
        if future.cancelled() or (withdrawn and not job.answered):  # a cancel message, or the stream ended, also
            # one that came after the result but before this callback: no answer
            expired = job.deadline is not None and time.monotonic() >= job.deadline
            self.server.settled(job, "DEADLINE_EXCEEDED" if expired else "CANCELLED", started)
            return
        if error is None:
            result = future.result()
            self.server.settled(job, "OK", started, result.tokens)
            if not job.answered:  # else the completer wrote it (tulip.framed)
                self._send(embed_pb2.StreamResponse(id=request_id, response=result.proto()))
            return
        exc = error if isinstance(error, TulipError) else engine_error(error)
        self.server.settled(job, exc.status, started)
        self._send(error_answer(request_id, exc))

    def _expire(self, request_id: int, job: Job) -> None:
        """Its deadline passed unanswered: DEADLINE_EXCEEDED now and its queued work dropped, as a unary call's
        deadline does, not once the packer reaches it (or never, while the device is stuck)."""
        self._expiries.pop(job, None)
        if job.future.done() or self.jobs.get(request_id) is not job:
            return
        if self._direct is not None and self._direct.withdraw(job):
            return  # its answer is on the wire already
        self.server.queue.cancel(job)
        job.future.set_exception(DeadlineExpired("deadline exceeded before the request was answered"))

    def _cancel(self, request_id: int) -> None:
        job = self.jobs.pop(request_id, None)
        if job is not None:
            if self._direct is not None and self._direct.withdraw(job):
                return  # its answer is on the wire already: it settles as answered, not as cancelled
            self.server.queue.cancel(job)
            job.future.cancel()


class EmbedStreamSession(StreamRequests):
    def __init__(self, server: TulipServer, context: grpc.aio.ServicerContext) -> None:
        self.out: asyncio.Queue[embed_pb2.StreamResponse | None] = asyncio.Queue()
        super().__init__(server, self.out.put_nowait)
        self.context = context

    async def run(self, request_iterator) -> None:
        writer = asyncio.ensure_future(self._write_loop())
        try:
            async for message in request_iterator:
                self.handle(message)
            # The client closed its side: answer what it is still owed, then end the call.
            while self.jobs:
                await asyncio.wait([j.future for j in self.jobs.values()])
                await asyncio.sleep(0)  # let the done-callbacks queue their answers
        finally:
            self.cancel_all()
            self.out.put_nowait(None)
            if writer.done() or asyncio.current_task().cancelling():
                writer.cancel()
            await asyncio.gather(writer, return_exceptions=True)

    async def _write_loop(self) -> None:
        while (message := await self.out.get()) is not None:
            await self.context.write(message)


def error_answer(request_id: int, exc: TulipError) -> embed_pb2.StreamResponse:
    """The StreamResponse a refused or failed request gets (what the unary call ends with)."""
    return embed_pb2.StreamResponse(id=request_id, code=_CODE[exc.status], message=exc.message, reason=exc.reason,
                                    retry_after_s=exc.retry_after_s or 0.0)
