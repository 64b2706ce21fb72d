"""EmbedStream: one long-lived bidirectional call per client, its requests multiplexed by id.

A unary Embed costs a call set-up and tear-down per request (~0.2 ms of grpc.aio CPU on each side); on a
stream that is paid once. Each StreamRequest is admitted exactly as a unary call is (TulipServer.admit:
same limits, same queue, same drain), carries its own deadline (`timeout_s`, from when Tulip reads it)
and is answered by one StreamResponse with its id as soon as its job settles, in any order. A cancel
message drops the request's sequences not yet batched and nothing is answered for it. When the call
ends (the client went away, or the server stops after its drain), every job still open is cancelled
the same way: nothing of a dead stream reaches the GPU.

A timeout_s is a deadline only when finite: 0 is none (protos), NaN or an infinity is refused
(INVALID_ARGUMENT), a negative one has passed already (DEADLINE_EXCEEDED, never queued).

Back-pressure, as on the framed port (tulip.framed, the same marks): a client that does not read its answers
stops being read once its unsent answers pass WRITE_HIGH_BYTES (no new work from it, so no more answers
to hold), is read again once they fall to a quarter of that (the low mark asyncio's transports give the
framed port), and has its call ended (RESOURCE_EXHAUSTED, reason answers_unread) when they stay above the
mark STALL_S: its unsent answers are dropped and its open jobs cancelled as a dead stream's are.

A client that breaks the stream's own contract (StreamProtocolError) is not answered on a request's id, where the
answer would be taken for that request's (HTTP/2 treats a reused stream id the same way): a request id sent again
while it is still in flight, or a message that cannot be decoded and whose id cannot be read, ends the stream once
the answers already due are written, its open requests cancelled; INVALID_ARGUMENT naming the id or the message
(on the framed port an answer on id 0, then the connection is closed). An EmbedRequest whose string fields are not
UTF-8 (request_id, output, flow) is refused INVALID_ARGUMENT naming the field, alone: the unary call, or the one stream
request, whose id is read with those fields taken as bytes (tulip.decoding: the gRPC port's deserializers, which
return a marker rather than raise, as grpc would end the call UNKNOWN).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import TYPE_CHECKING

import grpc

from protos import embed_pb2
from tulip import decoding
from tulip.errors import (AnswersUnread, DeadlineExpired, InvalidRequest, StreamProtocolError, TulipError,
                          engine_error, error_metadata)

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

    def handle(self, message: embed_pb2.StreamRequest | decoding.UndecodableStreamRequest) -> None:
        """One message read; raises StreamProtocolError when it breaks the stream's contract (module docstring):
        the carrier then ends the stream."""
        if message.id is None:  # an UndecodableStreamRequest whose id could not be read
            raise StreamProtocolError(message.problem)
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
        held = self.jobs.get(message.id)
        if held is not None and not held.answered:  # answered by the completer (tulip.framed): the loop has not
            # settled it yet, but the client has its answer, so the id is free (its _answer sees it withdrawn).
            # Not an answer on the id: the client would take it for the first request's (module docstring).
            raise StreamProtocolError(f"request id {message.id} was sent again while still in flight (ids must be "
                                      "unique among a stream's requests in flight): the stream is ended and its "
                                      "open requests cancelled")
        try:
            job = self.server.admit(request, _remaining(message.timeout_s), started)
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
    """One EmbedStream call: its answers written by one task in the order they settle, its requests read while the
    answers queued and not yet written (`unsent`, bytes) stay under `high_bytes`; above it for `stall_s`, the
    call is ended (module docstring). Below the mark that costs a message its ByteSize and an integer compare,
    and no await."""

    def __init__(self, server: TulipServer, context: grpc.aio.ServicerContext, high_bytes: int,
                 stall_s: float) -> None:
        self.out: asyncio.Queue[tuple[embed_pb2.StreamResponse, int] | None] = asyncio.Queue()
        super().__init__(server, self._queue)
        self.context = context
        self.unsent = 0
        self._high, self._low, self._stall_s = high_bytes, high_bytes // 4, stall_s
        self._stall: asyncio.TimerHandle | None = None  # while above the mark: ends the call when due
        self._drained = asyncio.Event()  # while above the mark: set once unsent falls to the low mark
        self._stalled = False  # the stall ended the call
        self._task: asyncio.Task | None = None

    async def run(self, request_iterator) -> None:
        self._task = asyncio.current_task()
        # Headers now, not with the first answer: a status ending the call must not carry them again, and grpc.aio
        # counts them sent only once a write has finished, which the first answer to an unread stream never does.
        await self.context.send_initial_metadata(())
        writer = asyncio.ensure_future(self._write_loop())
        broken: StreamProtocolError | None = None  # the client broke the stream's contract: the call ends with it
        try:
            try:
                async for message in request_iterator:
                    try:
                        self.handle(message)
                    except StreamProtocolError as exc:
                        broken = exc
                        break
                    if self._stall is not None:  # its answers are not read: neither are its requests
                        await self._drained.wait()
                if broken is None:
                    # The client closed its side: answer what it is still owed, then end the call (the stall's
                    # timer still runs: a client that closes and does not read is not waited on for ever).
                    while self.jobs:
                        await asyncio.wait([j.future for j in self.jobs.values()])
                        await asyncio.sleep(0)  # let the done-callbacks queue their answers
                else:  # what is open is cancelled, as when the client cancels the call; the answers due are written
                    self.cancel_all()
                self.out.put_nowait(None)
                await asyncio.wait([writer])
            except asyncio.CancelledError:
                if not self._stalled or self._task.uncancel():  # not (only) _give_up's cancel
                    raise
        finally:
            if self._stall is not None:
                self._stall.cancel()
            self.cancel_all()
            if self._stalled or self._task.cancelling():  # nothing more is written: its queued answers go too
                writer.cancel()
                while not self.out.empty():
                    self.out.get_nowait()
                self.unsent = 0
            self.out.put_nowait(None)
            await asyncio.gather(writer, return_exceptions=True)
        if self._stalled:
            exc = AnswersUnread(f"answers stayed unread above {self._high} bytes for {self._stall_s:g} s: the "
                                "stream was ended and its open requests cancelled")
            log.info("EmbedStream ended: %s", exc.message)
            # The status is sent after what the transport holds already: the client sees it once it reads.
            await self.context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, exc.message,
                                     trailing_metadata=error_metadata(exc))
        if broken is not None:
            log.info("EmbedStream ended: %s", broken.message)
            await self.context.abort(grpc.StatusCode[broken.status], broken.message,
                                     trailing_metadata=error_metadata(broken))

    def _queue(self, message: embed_pb2.StreamResponse) -> None:
        size = message.ByteSize()
        self.unsent += size
        self.out.put_nowait((message, size))
        if self.unsent > self._high and self._stall is None:
            self._drained.clear()
            self._stall = asyncio.get_running_loop().call_later(self._stall_s, self._give_up)

    async def _write_loop(self) -> None:
        while (item := await self.out.get()) is not None:
            message, size = item
            await self.context.write(message)
            self.unsent -= size
            if self._stall is not None and self.unsent <= self._low:
                self._stall.cancel()
                self._stall = None
                self._drained.set()

    def _give_up(self) -> None:
        """Above the mark for STALL_S: end the call, wherever run() waits (for a request, for the drain, or for the
        answers owed after the client's half-close)."""
        self._stalled = True
        self._task.cancel()


def _remaining(timeout_s: float) -> float | None:
    """A StreamRequest's timeout_s as admit's remaining time. protos: 0 = no deadline, and only 0 (-0.0 too). NaN or
    an infinity names no point in time: refused, naming the field, rather than guessed at. A negative one is a deadline
    already past (a client that passes on what is left of its own budget sends one when it ran out): admit refuses
    it DEADLINE_EXCEEDED before queueing, as it does a unary call with no time left; INVALID_ARGUMENT would tell the
    client its request is malformed, and a retry with time left would then look pointless."""
    if timeout_s == 0:
        return None
    if not math.isfinite(timeout_s):
        raise InvalidRequest(f"timeout_s = {timeout_s} is not a deadline: seconds from now, or 0 for none")
    return timeout_s


def error_answer(request_id: int, exc: TulipError) -> embed_pb2.StreamResponse:
    """The StreamResponse a refused or failed request gets (what the unary call ends with)."""
    return embed_pb2.StreamResponse(id=request_id, code=_CODE[exc.status], message=exc.message, reason=exc.reason,
                                    retry_after_s=exc.retry_after_s or 0.0)
