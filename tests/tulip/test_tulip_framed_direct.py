"""Direct answers on the framed EmbedStream (tulip/framed.py, TULIP_FRAMED_DIRECT): the completer thread writes a
finished request's answer to the socket itself, without waiting for the event loop; a cancelled request is not
answered; an answer larger than the socket takes leaves whole, and the answers behind it after it."""

import asyncio
import os
import socket
import threading

import numpy as np
import pytest
from test_tulip_framed import Framed, request
from tulip_testkit import (
    FakeEngine,
    FakeInfo,
    ServerThread,
    decode_response,
    encode_request,
    make_config,
    solo_embedding,
    wait_until,
)

from protos import embed_pb2
from protos.framing import FrameBuffer
from tulip.framed import _direct_safe

try:
    import uvloop
except ImportError:  # pragma: no cover - uvicorn[standard] brings it
    uvloop = None

# Production runs Tulip on uvloop (TULIP_EVENT_LOOP auto); the standard loop is the fallback. Both carry direct
# answers where their transport allows it (tulip.framed._direct_safe: not the standard loop from Python 3.12).
LOOPS = [pytest.param(asyncio.new_event_loop, id="asyncio"),
         pytest.param(uvloop.new_event_loop if uvloop else None, id="uvloop",
                      marks=pytest.mark.skipif(uvloop is None, reason="uvloop is not installed"))]


def _takes_direct(loop_factory) -> bool:
    """Whether a connection served on this kind of loop takes direct answers (its transport's kind decides)."""
    async def probe() -> bool:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(asyncio.Protocol, "127.0.0.1", 0)
        transport, _ = await loop.create_connection(asyncio.Protocol, "127.0.0.1", server.sockets[0].getsockname()[1])
        try:
            return _direct_safe(transport)
        finally:
            transport.close()
            server.close()

    with asyncio.Runner(loop_factory=loop_factory) as runner:
        return runner.run(probe())


@pytest.fixture(scope="module")
def direct_loop():
    """A loop whose connections take direct answers: uvloop, else the standard loop where it qualifies."""
    for factory in (uvloop.new_event_loop if uvloop else None, asyncio.new_event_loop):
        if factory is not None and _takes_direct(factory):
            return factory
    pytest.skip("no event loop here takes direct answers")


@pytest.mark.parametrize("loop_factory", LOOPS)
@pytest.mark.parametrize("direct", [True, False])
def test_an_answer_leaves_while_the_event_loop_is_busy_only_when_direct(direct, loop_factory) -> None:
    direct = direct and _takes_direct(loop_factory)  # the standard loop of 3.12+ answers through the loop
    engine = FakeEngine(gated=True)
    with ServerThread(make_config(framed_direct=direct), engine,
                      loop_factory=loop_factory) as s:
        client = Framed(s.server.framed.port)
        sent = request(1, [[7, 8, 9]])
        client.send(sent)
        wait_until(lambda: engine.launched == 1, what="launched")
        blocked, free = threading.Event(), threading.Event()

        def busy() -> None:  # the event loop is busy elsewhere (a long callback) while the batch finishes
            blocked.set()
            free.wait(20)

        s.loop.call_soon_threadsafe(busy)
        assert blocked.wait(10)
        engine.release(1)
        client.sock.settimeout(10.0 if direct else 1.0)  # the loop stays busy 20 s: either way it is decided
        try:
            if direct:
                answer = client.recv()
                assert answer.id == 1 and answer.code == 0
                np.testing.assert_allclose(decode_response(answer.response), solo_embedding(sent.request),
                                           rtol=1e-6, atol=1e-6)
            else:
                with pytest.raises(TimeoutError):
                    client.recv()
        finally:
            free.set()
        if not direct:
            client.sock.settimeout(10)
            assert client.recv().id == 1
        wait_until(lambda: s.server._active == 0, what="the loop settled the request")
        assert s.server.metrics.registry.get_sample_value("tulip_requests_total", {"status": "OK"}) == 1
        client.close()


def test_a_cancelled_request_is_not_answered_when_its_batch_finishes() -> None:
    engine = FakeEngine(gated=True)
    with ServerThread(make_config(), engine) as s:
        client = Framed(s.server.framed.port)
        client.send(request(1, [[1] * 10]))
        wait_until(lambda: engine.launched == 1, what="launched")
        client.send(embed_pb2.StreamRequest(id=1, cancel=True))
        wait_until(lambda: s.server._active == 0, what="the cancel settled")
        engine.release(1)
        wait_until(lambda: engine.completed == 1, what="the cancelled request's batch finished")
        client.send(request(2, [[2] * 10]))
        engine.release(1)
        assert client.recv().id == 2  # nothing came for 1
        client.close()


class _Transport:
    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.closed = False

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_write_buffer_size(self) -> int:
        return 0

    def write(self, data: bytes) -> None:
        self.written.append(bytes(data))


class _Loop:
    def __init__(self) -> None:
        self.calls = []

    def call_soon_threadsafe(self, fn, *args) -> None:
        self.calls.append((fn, args))

    def call_later(self, delay: float, fn, *args) -> "_Timer":  # a drop timer (FramedSession._arm), never due here
        return _Timer()


class _Timer:
    def cancel(self) -> None:
        pass


class _Job:
    withdrawn = False
    answered = False


def _result(size: int):
    class Result:
        def proto(self):
            return embed_pb2.EmbedResponse(rows=1, embeddings=b"x" * size)
    return Result()


def _session(fd: int):
    from tulip import framed

    session = framed.FramedSession.__new__(framed.FramedSession)  # the write path alone, on a socket pair
    session._lock, session._rest_pending, session._queued, session._timers = threading.Lock(), False, [], {}
    session._queued_bytes, session._paused_for = 0, set()
    session.transport, session._loop, session._fd = _Transport(), _Loop(), fd
    return session


def _session_with_a_rest():
    """A session on a socket pair whose 8 KiB send buffer took only part of answer 1 (1 MiB): (our socket, theirs,
    the session, the loop's write of the rest, the rest)."""
    ours, theirs = socket.socketpair()
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8192)
    ours.setblocking(False)
    session = _session(ours.fileno())
    assert session.answer(1, _Job(), _result(1 << 20)) is True
    (write_rest, (rest,)), = session._loop.calls
    return ours, theirs, session, write_rest, rest


def test_a_withdrawn_job_is_never_written() -> None:
    """answer() and withdraw() exclude each other under the session's lock: after withdraw, answer() writes
    nothing and leaves the job to the event loop (which does not answer a cancelled request)."""
    ours, theirs = socket.socketpair()
    session = _session(ours.fileno())
    job = _Job()
    session.withdraw(job)
    assert session.answer(3, job, _result(10)) is False
    theirs.setblocking(False)
    with pytest.raises(BlockingIOError):
        theirs.recv(1)
    assert session.answer(3, _Job(), _result(10)) is True  # not withdrawn: written from this thread
    theirs.setblocking(True)
    assert embed_pb2.StreamResponse.FromString(theirs.recv(100)[4:]).id == 3
    ours.close()
    theirs.close()


def test_the_rest_of_an_answer_the_socket_did_not_take_goes_first_and_whole() -> None:
    """A direct answer the socket takes only part of: its rest goes to the loop, and until the loop has written
    it no answer is written directly (even with room again) and the loop's own answers queue behind it."""
    ours, theirs, session, write_rest, rest = _session_with_a_rest()
    assert 0 < len(rest) < (1 << 20)
    theirs.setblocking(False)
    taken = theirs.recv(1 << 21)  # room again in the socket
    assert session.answer(2, _Job(), _result(10)) is False, "written beside a rest still to be sent"
    session._send(embed_pb2.StreamResponse(id=4))  # the loop's own answer meanwhile: queued
    assert session.transport.written == []
    write_rest(rest)
    assert session.transport.written[0] == rest and len(session.transport.written) == 2
    frames = FrameBuffer(1 << 22)
    ids = [embed_pb2.StreamResponse.FromString(f).id for f in frames.feed(taken + b"".join(session.transport.written))]
    assert ids == [1, 4]
    assert session.answer(5, _Job(), _result(10)) is True  # nothing behind any more: direct again
    ours.close()
    theirs.close()


def _small_send_buffer(monkeypatch) -> list[int]:
    """Framed connections with a 16 KiB send buffer (no kernel autotuning: answers outgrow the socket, so direct
    writes are partial and loop writes queue behind their rests); the sizes of the rests the loop writes."""
    from tulip import framed

    def small_send_buffer(transport) -> None:
        transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16384)

    rests: list[int] = []
    write_rest = framed.FramedSession._write_rest
    monkeypatch.setattr(framed, "keep_alive", small_send_buffer)
    monkeypatch.setattr(framed.FramedSession, "_write_rest", lambda self, rest: (rests.append(len(rest)),
                                                                                write_rest(self, rest)))
    return rests


def test_answers_larger_than_the_socket_take_keep_their_frames_whole(monkeypatch, direct_loop) -> None:
    """A client that reads slowly: a direct answer's rest goes through the event loop, and the answers that follow
    queue behind it, so every frame arrives whole and each request is answered once."""
    rests = _small_send_buffer(monkeypatch)
    info = FakeInfo(dimensions=2048)
    engine = FakeEngine(info)
    with ServerThread(make_config(), engine, loop_factory=direct_loop) as s:
        client = Framed(s.server.framed.port)
        sent = {i: [[i % 900 + 1, j + 1, 5] for j in range(16)] for i in range(1, 25)}  # 128 KiB answers
        for i, seqs in sent.items():
            client.send(request(i, seqs))
        wait_until(lambda: s.server._active == 0, what="every request answered (into the socket)")
        got = {}
        for _ in sent:
            answer = client.recv()
            assert answer.code == 0 and answer.id not in got
            got[answer.id] = decode_response(answer.response)
        assert sorted(got) == sorted(sent)
        for i, rows in got.items():
            np.testing.assert_allclose(rows, solo_embedding(encode_request(sent[i]), info), rtol=1e-6, atol=1e-6)
        assert rests, "no direct answer outgrew the socket: the test did not exercise the rest's path"
        client.close()


def test_a_close_waits_for_the_rest_of_a_direct_answer() -> None:
    """A bad frame closes its connection after the error answer; a direct answer's rest still with the loop
    goes out first, whole, so the client reads both frames before EOF."""
    ours, theirs, session, write_rest, rest = _session_with_a_rest()
    session._send(embed_pb2.StreamResponse(id=0, code=3))  # the error answer, queued behind the rest
    session._close()
    assert not session.transport.closed, "closed with a rest still to be written"
    write_rest(rest)
    assert session.transport.closed and len(session.transport.written) == 2
    ours.close()
    theirs.close()


def test_only_transports_whose_unsent_bytes_read_in_one_step_take_direct_answers() -> None:
    import collections

    class Standard311:
        def __init__(self) -> None:
            self._buffer = bytearray()

    class Standard312:  # a deque popped from and pushed back to around a partial send
        def __init__(self) -> None:
            self._buffer = collections.deque()

    assert _direct_safe(Standard311()) and not _direct_safe(Standard312())
    if uvloop is not None:
        assert _takes_direct(uvloop.new_event_loop)


@pytest.mark.parametrize("loop_factory", LOOPS)
def test_many_large_answers_to_a_client_reading_as_they_come_arrive_whole(loop_factory, monkeypatch) -> None:
    """The socket fills and drains while answers leave from the completer and the loop: every frame parses, each
    request is answered once with its own rows (frames interleaved on the wire would fail to parse)."""
    rests = _small_send_buffer(monkeypatch)
    info = FakeInfo(dimensions=512)
    # Deadline admission off: 300 requests at once on a loaded 2-core machine could measure a device rate slow
    # enough to refuse some as unmeetable (seen once in CI); this test is about framing, not admission.
    config = make_config(deadline_admission=False)
    with ServerThread(config, FakeEngine(info), loop_factory=loop_factory) as s:
        client = Framed(s.server.framed.port)
        sent = {i: [[i % 900 + 1, j + 1, 3] for j in range(16)] for i in range(1, 301)}  # 32 KiB answers
        got: dict[int, np.ndarray] = {}
        errors: list[BaseException] = []

        def read() -> None:
            try:
                for _ in sent:
                    answer = client.recv()
                    assert answer is not None and answer.code == 0 and answer.id not in got
                    got[answer.id] = decode_response(answer.response)
            except BaseException as exc:  # noqa: BLE001 - reported by the test thread
                errors.append(exc)

        reader = threading.Thread(target=read)
        reader.start()
        for i, seqs in sent.items():
            client.send(request(i, seqs))
        reader.join(60)
        assert not errors, errors[0]
        assert sorted(got) == sorted(sent)
        for i in (1, 150, 300):
            np.testing.assert_allclose(got[i], solo_embedding(encode_request(sent[i]), info), rtol=1e-6, atol=1e-6)
        if _takes_direct(loop_factory):
            assert rests, "no direct answer outgrew the socket: the test did not exercise the rest's path"
        client.close()


def test_a_cancel_while_the_completer_is_about_to_write_stops_the_answer(monkeypatch, direct_loop) -> None:
    from tulip import framed

    at_answer, go = threading.Event(), threading.Event()
    answer = framed.FramedSession.answer

    def held(self, request_id, job, result):
        at_answer.set()
        assert go.wait(20)
        return answer(self, request_id, job, result)

    monkeypatch.setattr(framed.FramedSession, "answer", held)
    with ServerThread(make_config(), FakeEngine(), loop_factory=direct_loop) as s:
        client = Framed(s.server.framed.port)
        client.send(request(1, [[1] * 10]))
        assert at_answer.wait(20)  # its rows are in: the completer is about to write the answer
        client.send(embed_pb2.StreamRequest(id=1, cancel=True))
        wait_until(lambda: s.server._active == 0, what="the cancel settled the request")
        go.set()
        client.send(request(2, [[2] * 10]))
        assert client.recv().id == 2  # nothing came for 1
        registry = s.server.metrics.registry
        assert registry.get_sample_value("tulip_requests_total", {"status": "CANCELLED"}) == 1
        client.close()


def test_a_cancel_after_the_answer_left_counts_the_request_answered(monkeypatch, direct_loop) -> None:
    """The client has its answer; a cancel crossing it on the wire must not count it as cancelled."""
    from tulip import job as job_module

    flush, go = job_module.Handoff.flush, threading.Event()

    def held(self):  # the completer, its answers written, hands the jobs to the loop only once `go` is set
        if self._by_loop:
            assert go.wait(20)
        flush(self)

    monkeypatch.setattr(job_module.Handoff, "flush", held)
    with ServerThread(make_config(), FakeEngine(), loop_factory=direct_loop) as s:
        client = Framed(s.server.framed.port)
        client.send(request(1, [[1] * 10]))
        assert client.recv().id == 1
        client.send(embed_pb2.StreamRequest(id=1, cancel=True))
        session, = s.server.framed._sessions
        wait_until(lambda: not session.requests.jobs, what="the cancel read")
        go.set()
        wait_until(lambda: s.server._active == 0, what="the request settled")
        registry = s.server.metrics.registry
        assert registry.get_sample_value("tulip_requests_total", {"status": "OK"}) == 1
        assert registry.get_sample_value("tulip_requests_total", {"status": "CANCELLED"}) is None
        client.close()


def test_no_direct_answer_follows_the_connections_error_answer() -> None:
    """A bad frame's error answer (id 0) is the connection's last: the close comes under the lock that direct
    answers take, so the completer cannot write an answer between the error and the close (it did: up to 161
    answers after the error in a flood, read by no one, since Ivy drops the connection on the error)."""
    from protos.framing import FrameBuffer
    from tulip.errors import BadFrame
    from tulip.stream import error_answer

    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    session = _session(ours.fileno())
    session.transport.write = lambda data: os.write(ours.fileno(), bytes(data))  # nothing unsent: direct writes go
    close = session.transport.close

    completer = threading.Thread(target=lambda: session.answer(5, _Job(), _result(10)))

    def close_with_the_completer_in_between() -> None:  # the completer takes its turn just as the close begins
        completer.start()
        if not session._lock.locked():  # closed outside the lock: the completer's answer is written first
            completer.join()
        close()

    session.transport.close = close_with_the_completer_in_between
    session._send(error_answer(0, BadFrame("a frame is not a StreamRequest")))
    session._close()
    completer.join()
    theirs.setblocking(False)
    ids = [embed_pb2.StreamResponse.FromString(p).id for p in FrameBuffer(1 << 20).feed(theirs.recv(1 << 16))]
    assert ids == [0]
