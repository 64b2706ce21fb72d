"""The framed EmbedStream: EmbedStream's messages over a plain TCP connection, without gRPC's per-message cost.

On the H200 host grpc.aio costs ~0.15 ms and ~0.25 ms of CPU a message on each side (its poller thread and
the event loop trade every one; benchmarks/NOTES.md, "The hop's own floor"). Here each StreamRequest and
StreamResponse is its protobuf bytes behind a 4-byte little-endian length, on an asyncio connection: the
same messages, ids, deadlines and cancels as EmbedStream (tulip.stream.StreamRequests admits and answers
them), the same admission, limits and drain. The completer thread that finishes a job writes its answer to the
socket itself (`FramedSession.answer`; TULIP_FRAMED_DIRECT, on by default) when nothing else is pending on the
connection, so an answer leaves without waking the event loop first; the loop settles the job after. Health, Info
and the unary Embed stay on gRPC; Info names this port (`framed_port`), and Ivy uses it (IVY_FRAMED, on by
default). By default on the gRPC port + 200 (TulipServer._start_framed).

Faults: a frame longer than max_message_mb, bytes that are not a StreamRequest (a string field not UTF-8 too), or
a request id sent again while still in flight (tulip.stream: StreamProtocolError, reason stream_protocol_error) get
one error answer (id 0: RESOURCE_EXHAUSTED / INVALID_ARGUMENT) and the connection is closed after the answers
already written; what it still has open is cancelled then (no answer follows the error); every request still open
on a connection that ends is cancelled (its queued work never reaches the GPU). A client that does not read its
answers stops being read once its unsent answers pass WRITE_HIGH_BYTES (no new work from it meanwhile), and
is dropped when they stay there STALL_S; so is one whose frame stays incomplete STALL_S (a trickle;
tests/RELIABILITY.md 19 and 40); answers queued behind a direct answer's rest count toward that mark too. A
connection admits at most FRAMES_BEFORE_YIELD frames before the loop turns once with its reading paused, so a
flood of small requests on one connection cannot hold the loop (the completer's answers, the other connections)
for the seconds a read's thousands of frames would take (RELIABILITY 51). Open connections are capped
(`framed_max_connections`; Ivy opens one per gateway worker): one more gets a RESOURCE_EXHAUSTED answer on id 0
(reason too_many_connections) and is closed after REFUSED_LINGER_S, and past as many lingering refusals as the
cap a new one is closed at once, so a flood of connections holds at most three times the cap of descriptors (an
open connection holds two: its socket and the duplicate its direct answers are written to) and cannot starve the
gRPC port; like the gRPC port, only Ivy may reach it (the NetworkPolicy's job, RUNBOOK). EOF ends the stream
and cancels what it has open: unlike gRPC's half-close, a TCP EOF cannot tell "done sending" from a client gone,
and a gone client's work must not reach the GPU (Ivy's client never half-closes).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import threading
import time
from typing import TYPE_CHECKING

from google.protobuf.message import DecodeError

from protos import embed_pb2
from protos.framing import FrameBuffer, frame, keep_alive
from tulip.errors import BadFrame, FrameTooLarge, StreamProtocolError, TooManyConnections
from tulip.stream import StreamRequests, error_answer

if TYPE_CHECKING:
    from tulip.server import TulipServer

log = logging.getLogger("tulip.framed")

WRITE_HIGH_BYTES = 8 << 20  # unsent answers above which the connection's requests are not read
STALL_S = 30.0  # answers unsent above WRITE_HIGH_BYTES, or a frame incomplete, this long: the connection is dropped
FRAMES_BEFORE_YIELD = 64  # frames a connection admits before the loop turns once (its reading paused meanwhile)
_HOLD = frozenset({"write", "queued"})  # reasons reading is paused that also stop admission
REFUSED_LINGER_S = 1.0  # a refused connection: its answer and EOF sent, what it sends read and dropped this long


class _Refusals:
    """Connections refused over the cap and still lingering (their answer sent), and a log line at most every
    LOG_EVERY_S seconds."""

    LOG_EVERY_S = 10.0

    def __init__(self) -> None:
        self.lingering = 0
        self._logged = float("-inf")

    def should_log(self) -> bool:
        now = time.monotonic()
        if now - self._logged < self.LOG_EVERY_S:
            return False
        self._logged = now
        return True


_REFUSALS = _Refusals()


class FramedSession(asyncio.Protocol):
    _refused = False  # over framed_max_connections: answered, then its bytes dropped until it closes
    _close_after_rest = False  # _close() came while a direct answer's rest was with the loop

    def __init__(self, server: TulipServer, max_frame_bytes: int, sessions: set) -> None:
        self.server = server
        self._direct = server.config.framed_direct
        self.requests = StreamRequests(server, self._send, self if self._direct else None)
        self._frames = FrameBuffer(max_frame_bytes)
        self._sessions = sessions
        self.transport: asyncio.Transport | None = None
        self._timers: dict[str, asyncio.TimerHandle] = {}  # "frame" (incomplete), "write" (paused): drop when due
        self._loop = asyncio.get_running_loop()
        # Direct answers (answer(), the completer's thread): every write to the connection holds _lock; _fd is a
        # duplicate of its socket, closed only under _lock, so the number cannot be reused for another
        # connection while a write is on it; _rest_pending: a direct answer's unsent rest is with the loop, and
        # until the loop has written it every other answer queues behind it (_queued), so frames never interleave.
        self._lock = threading.Lock()
        self._fd = -1
        self._rest_pending = False
        self._queued: list[bytes] = []
        self._queued_bytes = 0
        # Admission: complete frames not yet admitted (_backlog), frames admitted since the loop last turned
        # (_since_turn), and why reading is paused ("write": answers unsent past the mark; "queued": answers
        # queued behind a rest past it; "turn": FRAMES_BEFORE_YIELD admitted, the loop turns before the next).
        self._backlog: collections.deque[bytes] = collections.deque()
        self._since_turn = 0
        self._paused_for: set[str] = set()
        self._ended = False  # a bad frame answered, or EOF: the connection closing, nothing more is admitted

    def connection_made(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        cap = self.server.config.framed_max_connections
        if len(self._sessions) >= cap:
            self.server.metrics.framed_refused.inc()
            if _REFUSALS.lingering >= cap:  # a flood: no linger, no answer, no log line each
                transport.abort()
                return
            if _REFUSALS.should_log():
                log.warning("framed connection refused: %d open (framed_max_connections)", len(self._sessions))
            _REFUSALS.lingering += 1
            self._send(error_answer(0, TooManyConnections(
                f"{len(self._sessions)} framed connections are open, the most framed_max_connections allows")))
            # Not close() at once: requests it already sent would be unread, and the kernel would answer with a
            # reset that can overtake the refusal. EOF after the answer; its bytes are read and dropped.
            self._refused = True
            transport.write_eof()
            self._arm("refused", "refused over framed_max_connections", REFUSED_LINGER_S)
            return
        transport.set_write_buffer_limits(high=WRITE_HIGH_BYTES)
        keep_alive(transport)
        self._sessions.add(self)
        sock = transport.get_extra_info("socket")
        if self._direct and sock is not None and _direct_safe(transport):
            try:
                self._fd = os.dup(sock.fileno())
            except OSError:  # out of descriptors: this connection's answers go through the loop
                self._fd = -1
        self.server.metrics.framed_connections.set(len(self._sessions))

    def data_received(self, data: bytes) -> None:
        if self._refused or self._ended:  # over the cap, or ended (a bad frame, EOF): nothing of it is admitted
            return
        payloads = self._frames.feed(data)
        self._backlog.extend(payloads)
        self._admit()
        if self._ended:
            return
        if not self._frames.partial:
            self._disarm("frame")
        elif payloads or "frame" not in self._timers:  # a frame completed, or a new one began: its own time
            self._arm("frame", "a frame stayed incomplete")

    def _admit(self) -> None:
        """Admit the backlog's frames in order until it is empty, the connection is paused for its unsent answers,
        or FRAMES_BEFORE_YIELD were admitted since the loop last turned: then reading pauses and _turned admits
        the rest on the next turn, after the callbacks that waited (a read can hold thousands of small frames, and
        on uvloop one turn hands a connection many reads). The budget spent schedules _turned at once, so a
        connection whose frames come one a read (Ivy's) never pauses: only frames waiting past it do."""
        if self._ended or self.transport.is_closing():
            return
        backlog, paused = self._backlog, self._paused_for
        try:
            while backlog and not (paused and paused & _HOLD):
                if self._since_turn >= FRAMES_BEFORE_YIELD:
                    self._pause("turn")
                    return
                self._since_turn += 1
                if self._since_turn == FRAMES_BEFORE_YIELD:
                    self._loop.call_soon(self._turned)  # the budget renewed once the loop has turned
                payload = backlog.popleft()
                try:
                    message = embed_pb2.StreamRequest.FromString(payload)
                except DecodeError:
                    raise BadFrame("a frame is not a StreamRequest") from None
                if message.id == 0:  # the id of the connection's own errors: an answer on it would read as one
                    raise BadFrame("request id 0 is reserved for the connection's errors; number requests from 1")
                self.requests.handle(message)
            if self._frames.oversize and not backlog:
                raise FrameTooLarge(f"frame of {self._frames.oversize} bytes exceeds the "
                                    f"{self._frames.max_bytes}-byte message limit (max_message_mb)")
        except (FrameTooLarge, BadFrame, StreamProtocolError) as exc:
            log.info("framed connection closed: %s", exc.message)
            self._ended = True
            backlog.clear()
            self.requests.cancel_all()  # no answer follows the error (none written directly after it either): what
            # is open is dropped now, not once the connection has closed
            self._send(error_answer(0, exc))
            self._close()

    def _turned(self) -> None:
        """The loop turned since FRAMES_BEFORE_YIELD were admitted: the budget renewed, reading resumed unless
        paused for another reason, and the frames that waited admitted."""
        self._since_turn = 0
        self._resume("turn")
        self._admit()

    def eof_received(self) -> bool:
        """The peer's EOF: what it has open is cancelled now (a TCP EOF cannot tell "done sending" from a client
        gone, and Ivy never half-closes), and the connection closes once its answers are written, or is dropped
        after STALL_S when they stay unread (left to the transport, a half-closed peer that never reads would hold
        its requests on the device and its place under framed_max_connections for good)."""
        self._ended = True
        self._backlog.clear()
        self.requests.cancel_all()
        self._close()
        return True

    def _pause(self, why: str) -> None:
        if not self._paused_for:
            self.transport.pause_reading()
        self._paused_for.add(why)

    def _resume(self, why: str) -> None:
        if why not in self._paused_for:
            return
        self._paused_for.discard(why)
        if not self._paused_for and not self.transport.is_closing():
            self.transport.resume_reading()

    def pause_writing(self) -> None:
        self._pause("write")
        self._arm("write", "answers stayed unread")

    def resume_writing(self) -> None:
        self._resume("write")
        self._disarm("write")
        self._admit()

    def connection_lost(self, exc: Exception | None) -> None:
        with self._lock:
            fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)
        if self._refused:
            _REFUSALS.lingering -= 1
        for name in list(self._timers):
            self._disarm(name)
        self._backlog.clear()
        if self in self._sessions:
            self._sessions.discard(self)
            self.server.metrics.framed_connections.set(len(self._sessions))
        self.requests.cancel_all()

    def _arm(self, name: str, why: str, after_s: float | None = None) -> None:
        self._disarm(name)
        after_s = STALL_S if after_s is None else after_s
        self._timers[name] = self._loop.call_later(after_s, self._drop, name, why, after_s)

    def _disarm(self, name: str) -> None:
        timer = self._timers.pop(name, None)
        if timer is not None:
            timer.cancel()

    def _drop(self, name: str, why: str, after_s: float) -> None:
        self._timers.pop(name, None)
        if not self._refused:
            log.info("framed connection dropped: %s for %.0f s", why, after_s)
        self.transport.abort()  # connection_lost follows: its open requests are cancelled

    def _send(self, message: embed_pb2.StreamResponse) -> None:
        if self.transport is not None and not self.transport.is_closing():
            data = frame(message)
            with self._lock:
                if self._rest_pending:  # behind a direct answer's rest: unseen by the transport's mark, so counted
                    self._queued.append(data)
                    self._queued_bytes += len(data)
                    if self._queued_bytes > WRITE_HIGH_BYTES and "queued" not in self._paused_for:
                        self._pause("queued")
                else:
                    self.transport.write(data)

    def _close(self) -> None:
        """Close after what is written, a direct answer's rest still with the loop included (_write_rest closes).
        A peer that stops reading would hold a closing connection (and its place under framed_max_connections)
        for as long as its unsent answers wait, below the pause's mark too: dropped after STALL_S. Closed under
        _lock, so no direct answer is written after an error answer sent just before (answer() asks is_closing()
        under it)."""
        self._arm("close", "a closed connection's answers stayed unread")
        with self._lock:
            if self._rest_pending:
                self._close_after_rest = True
                return
            self.transport.close()

    # -- direct answers (StreamRequests' `direct`: the completer's thread) ----------------------------------

    def answer(self, request_id: int, job, result) -> bool:
        """Write a finished job's answer to the socket now, from the completer, when nothing else is pending on
        the connection (the transport's buffer empty, no rest handed over); True when written (or its rest handed
        to the loop), the job then marked answered. False leaves it to the loop (StreamRequests._answer), as
        without the direct path."""
        if not self._writable(job):  # asked again under the lock; here so a refused answer is not serialized
            return False
        data = frame(embed_pb2.StreamResponse(id=request_id, response=result.proto()))
        with self._lock:
            if not self._writable(job):
                return False
            job.answered = True  # before the bytes leave: a client that reads them may reuse the id at once
            try:
                sent = os.write(self._fd, data)
            except BlockingIOError:
                sent = 0
            except OSError:  # the connection is failing: the loop's path sees it and closes it
                job.answered = False
                return False
            if sent < len(data):  # the socket's buffer is full: the loop writes the rest, and what follows it
                self._rest_pending = True
                self._loop.call_soon_threadsafe(self._write_rest, memoryview(data)[sent:])
            return True

    def _writable(self, job) -> bool:
        """Nothing stands before a direct answer: the job not withdrawn, the duplicate open, no rest with the loop,
        the transport open with nothing unsent (what _direct_safe lets another thread read)."""
        transport = self.transport
        return not (job.withdrawn or self._fd < 0 or self._rest_pending or transport is None
                    or transport.is_closing() or transport.get_write_buffer_size())

    def withdraw(self, job) -> bool:
        """A cancel: the job's answer is no longer written (the cancel and answer() exclude each other). True
        when it was written already: the request is answered, and the cancel comes too late to change that."""
        with self._lock:
            job.withdrawn = True
            return job.answered

    def _write_rest(self, rest: memoryview) -> None:
        """On the loop: a direct answer's rest, then the answers queued behind it (answer() writes only while no
        rest is pending, so there is never more than one)."""
        with self._lock:
            self._rest_pending = False
            pending, self._queued, self._queued_bytes = [rest, *self._queued], [], 0
            if self.transport is not None and not self.transport.is_closing():
                for data in pending:
                    self.transport.write(data)  # past the mark, pause_writing holds reading from here
                if self._close_after_rest:
                    self.transport.close()
        if "queued" in self._paused_for:
            self._resume("queued")
            self._admit()  # nothing once the transport is closing


def _direct_safe(transport: asyncio.Transport) -> bool:
    """Whether another thread may read the transport's unsent bytes as one number: uvloop's (libuv's write queue
    and uvloop's buffer, each changed in one step under the GIL), or the standard loop's while its buffer is a
    bytearray (Python 3.11). From 3.12 the standard transport keeps a deque it pops from and pushes back to
    when a send is partial, so between the two it reads empty with bytes still unsent: no direct answers there."""
    if type(transport).__module__.startswith("uvloop"):
        return True
    return isinstance(getattr(transport, "_buffer", None), bytearray)
