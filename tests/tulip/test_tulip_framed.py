"""Tulip's framed EmbedStream (tulip/framed.py): EmbedStream's messages behind a 4-byte length on plain TCP, with
the same answers, cancels, limits and drain as the gRPC stream, and bad frames refused without harm."""

import asyncio
import socket
import struct
import time

import grpc
import numpy as np
import pytest
from tulip_testkit import FakeEngine, FakeInfo, ServerThread, decode_response, encode_request, make_config, solo_embedding, wait_until

from protos import embed_pb2

LENGTH = struct.Struct("<I")


class Framed:
    """A blocking client of the framed port."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=20)

    def send(self, message: embed_pb2.StreamRequest) -> None:
        self.send_raw(message.SerializeToString())

    def send_raw(self, payload: bytes, length: int | None = None) -> None:
        self.sock.sendall(LENGTH.pack(len(payload) if length is None else length) + payload)

    def recv(self) -> embed_pb2.StreamResponse | None:
        head = self._exactly(LENGTH.size)
        if head is None:
            return None
        return embed_pb2.StreamResponse.FromString(self._exactly(LENGTH.unpack(head)[0]))

    def _exactly(self, n: int) -> bytes | None:
        out = b""
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                return None
            out += chunk
        return out

    def close(self) -> None:
        self.sock.close()


def request(i: int, seqs, timeout_s: float = 20.0) -> embed_pb2.StreamRequest:
    return embed_pb2.StreamRequest(id=i, request=encode_request(seqs), timeout_s=timeout_s)


def _port_pair() -> int:
    """A free gRPC port p whose p + 200 is free as well."""
    for _ in range(50):
        port = _free_port()
        if port + 200 < 65536:
            with socket.socket() as probe:
                try:
                    probe.bind(("127.0.0.1", port + 200))
                    return port
                except OSError:
                    continue
    pytest.skip("no free pair of ports p, p + 200")


def test_by_default_the_framed_port_is_the_grpc_port_plus_200_and_a_taken_one_is_skipped() -> None:
    with ServerThread(make_config(), FakeEngine()) as s:  # --port 0: an ephemeral framed port beside it
        assert s.stub.Info(embed_pb2.InfoRequest(), timeout=10).framed_port == s.server.framed.port > 0
    port = _port_pair()
    with ServerThread(make_config(port=port), FakeEngine()) as s:
        assert s.stub.Info(embed_pb2.InfoRequest(), timeout=10).framed_port == port + 200
        client = Framed(port + 200)
        client.send(request(1, [[5, 6, 7]]))
        assert client.recv().code == 0
        client.close()
    port = _port_pair()
    with socket.socket() as holder:  # someone else's listener on p + 200: served without one, on gRPC
        holder.bind(("127.0.0.1", port + 200))
        holder.listen()
        with ServerThread(make_config(port=port), FakeEngine()) as s:
            assert s.server.framed.port == 0
            assert s.stub.Info(embed_pb2.InfoRequest(), timeout=10).framed_port == 0
            response = s.stub.Embed(encode_request([[1, 2, 3]]), timeout=10)
            assert response.rows == 1


def test_an_explicit_framed_port_that_is_taken_fails_the_start() -> None:
    from tulip.server import TulipServer

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        server = TulipServer(make_config(framed_port=holder.getsockname()[1]), engine=FakeEngine())

        async def main():
            try:
                await server.start_listening()
            finally:
                if server._grpc is not None:
                    await server._grpc.stop(None)

        with pytest.raises(OSError, match="framed port"):
            asyncio.run(main())


def test_requests_multiplexed_on_a_framed_connection_equal_their_solo_embeddings() -> None:
    with ServerThread(make_config(), FakeEngine()) as s:
        info = s.stub.Info(embed_pb2.InfoRequest(), timeout=10)
        assert info.framed_port == s.server.framed.port > 0
        client = Framed(info.framed_port)
        rng = np.random.default_rng(0)
        sent = {i: [[int(t) for t in rng.integers(1, 900, size=n)] for n in rng.integers(1, 60, size=rng.integers(1, 4))]
                for i in range(1, 41)}
        for i, seqs in sent.items():
            client.send(request(i, seqs))
        for _ in sent:
            answer = client.recv()
            assert answer.code == 0, answer.message
            rows = decode_response(answer.response)
            np.testing.assert_allclose(rows, solo_embedding(encode_request(sent[answer.id])), rtol=1e-6, atol=1e-6)
        bad = embed_pb2.StreamRequest(id=99, request=embed_pb2.EmbedRequest(token_ids=b"\x01\x00\x00\x00",
                                                                            seq_lens=b"\x02\x00\x00\x00"))
        client.send(bad)  # lengths that do not add up: answered on its id, the connection stays
        answer = client.recv()
        assert answer.id == 99 and answer.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
        client.send(request(100, [[5, 6, 7]]))
        assert client.recv().id == 100
        client.close()


def test_a_cancel_or_a_closed_connection_drops_the_queued_work() -> None:
    engine = FakeEngine(gated=True)
    with ServerThread(make_config(), engine) as s:
        client = Framed(s.server.framed.port)
        for i in (1, 2):  # both in-flight slots taken (the engine is gated)
            client.send(request(i, [[i] * 10]))
            wait_until(lambda: engine.launched == i, what=f"batch {i} launched")
        client.send(request(3, [[3] * 10]))
        client.send(request(4, [[4] * 10]))
        wait_until(lambda: s.server.queue.depth()[0] == 2, what="two requests queued")
        client.send(embed_pb2.StreamRequest(id=3, cancel=True))
        wait_until(lambda: s.server.queue.depth()[0] == 1, what="the cancelled request dropped")
        client.close()  # request 4 still queued: its connection is gone
        wait_until(lambda: s.server.queue.depth()[0] == 0, what="the closed connection's request dropped")
        engine.release(5)
        wait_until(lambda: engine.completed == 2 and s.server._active == 0, what="nothing else ran")
        assert engine.launched == 2


@pytest.mark.parametrize("payload,length,code", [
    (b"", 1 << 30, grpc.StatusCode.RESOURCE_EXHAUSTED),  # longer than max_message_mb: not read, refused
    (b"\xff\xff\xff\xff\xff", None, grpc.StatusCode.INVALID_ARGUMENT),  # not a StreamRequest
    (b"", None, grpc.StatusCode.INVALID_ARGUMENT),  # an empty frame: a request with id 0, the connection's own
    (request(0, [[4, 5]]).SerializeToString(), None, grpc.StatusCode.INVALID_ARGUMENT),  # id 0, its errors' id
])
def test_a_bad_frame_is_answered_once_and_its_connection_closed(payload, length, code) -> None:
    with ServerThread(make_config(), FakeEngine()) as s:
        client = Framed(s.server.framed.port)
        client.send_raw(payload, length)
        answer = client.recv()
        assert answer.id == 0 and answer.code == code.value[0]
        assert client.recv() is None  # closed
        other = Framed(s.server.framed.port)  # the replica serves on
        other.send(request(7, [[4, 5]]))
        assert other.recv().code == 0
        other.close()


def test_an_id_is_free_again_once_its_answer_arrived() -> None:
    """Answers written by the completer (framed_direct, the default) reach the client before the loop forgets the
    id: a client reusing an id as soon as its answer arrived was refused "already in flight" about half the time.
    An id is in flight until it is answered, not until the loop has settled it."""
    with ServerThread(make_config(), FakeEngine()) as s:
        client = Framed(s.server.framed.port)
        for _ in range(200):
            client.send(request(5, [[4, 5]]))
            answer = client.recv()
            assert answer.id == 5 and answer.code == 0, answer.message
        client.close()


def test_a_draining_replica_refuses_new_framed_requests_and_answers_the_open_ones() -> None:
    engine = FakeEngine(gated=True)
    with ServerThread(make_config(shutdown_timeout_s=10), engine) as s:
        client = Framed(s.server.framed.port)
        client.send(request(1, [[1] * 10]))
        wait_until(lambda: engine.launched == 1, what="launched")
        future = asyncio.run_coroutine_threadsafe(s.server.drain(), s.loop)
        wait_until(lambda: s.server.draining, what="draining")
        client.send(request(2, [[2] * 10]))
        refused = client.recv()
        assert refused.id == 2 and refused.code == grpc.StatusCode.UNAVAILABLE.value[0]
        engine.release(1)
        answered = client.recv()
        assert answered.id == 1 and answered.code == 0
        assert future.result(20) is True
        client.close()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_frame_left_incomplete_or_answers_left_unread_drop_the_connection(monkeypatch) -> None:
    """RELIABILITY 19 (a trickle) and 40 (answers never read) on the framed port: dropped after STALL_S."""
    import tulip.framed as framed

    monkeypatch.setattr(framed, "STALL_S", 0.3)
    engine = FakeEngine(gated=True)
    with ServerThread(make_config(), engine) as s:
        client = Framed(s.server.framed.port)
        client.send(request(1, [[1] * 10]))
        wait_until(lambda: engine.launched == 1, what="launched")
        payload = request(2, [[2] * 10]).SerializeToString()
        client.sock.sendall(LENGTH.pack(len(payload)) + payload[:5])  # and the rest never comes
        assert client.recv() is None  # dropped after STALL_S, its open request cancelled
        wait_until(lambda: s.server._active == 0, what="the dropped connection's request cancelled")
        engine.release(5)
        client.close()

    async def paused() -> bool:  # a client that never reads: the server's writes pause, then it is dropped
        aborted = asyncio.Event()

        class Transport:
            def set_write_buffer_limits(self, high):
                pass

            def pause_reading(self):
                pass

            def abort(self):
                aborted.set()

        session = framed.FramedSession.__new__(framed.FramedSession)  # only its timers are exercised
        session._timers, session.transport, session._loop = {}, Transport(), asyncio.get_running_loop()
        session._paused_for = set()
        session.pause_writing()
        await asyncio.wait_for(aborted.wait(), 5)
        return True

    assert asyncio.run(paused())


def test_a_closed_connection_whose_answers_stay_unread_is_dropped(monkeypatch) -> None:
    """A connection closed for a bad frame whose peer never reads (its answers unsent, under the mark that pauses
    writing) must not stay open, holding a place under framed_max_connections: dropped after STALL_S."""
    import threading

    from tulip import framed

    monkeypatch.setattr(framed, "STALL_S", 0.3)

    async def closed() -> bool:
        aborted = asyncio.Event()

        class Transport:  # close() waits on unsent bytes that are never read: connection_lost never comes
            def close(self):
                pass

            def abort(self):
                aborted.set()

        session = framed.FramedSession.__new__(framed.FramedSession)  # only _close and its timer are exercised
        session._timers, session.transport, session._loop = {}, Transport(), asyncio.get_running_loop()
        session._lock, session._rest_pending = threading.Lock(), False
        session._close()
        await asyncio.wait_for(aborted.wait(), 5)
        return True

    assert asyncio.run(closed())


def test_an_engine_failure_is_answered_on_its_id() -> None:
    """A batch that fails on the device is answered on the framed stream with the request's id (RELIABILITY 36)."""
    with ServerThread(make_config(), FakeEngine(fail_when=lambda batch: True)) as s:
        client = Framed(s.server.framed.port)
        client.send(request(5, [[1, 2, 3]]))
        answer = client.recv()
        assert answer.id == 5 and answer.code == grpc.StatusCode.INTERNAL.value[0] and answer.reason == "engine_failed"
        client.close()


def test_connections_over_the_cap_are_refused_once_and_closed() -> None:
    """A flood of connections cannot take the process's descriptors: one over framed_max_connections gets
    RESOURCE_EXHAUSTED (too_many_connections) on id 0 and is closed; a closed one makes room again."""
    with ServerThread(make_config(framed_max_connections=2), FakeEngine()) as s:
        port = s.server.framed.port
        get = s.server.metrics.registry.get_sample_value
        first, second = Framed(port), Framed(port)
        for i, client in enumerate((first, second), 1):
            client.send(request(i, [[5, 6, 7]]))
            assert client.recv().code == 0
        assert get("tulip_framed_connections") == 2
        third = Framed(port)
        third.send(request(3, [[5, 6, 7]]))  # never admitted
        answer = third.recv()
        assert answer.id == 0 and answer.code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
        assert answer.reason == "too_many_connections" and "framed_max_connections" in answer.message
        assert third.recv() is None  # closed
        assert get("tulip_framed_refused_connections_total") == 1
        time.sleep(0.3)  # what it sent was read and dropped: never admitted, never run
        assert get("tulip_requests_total", {"status": "OK"}) == 2 and s.server._active == 0
        third.close()
        first.close()
        wait_until(lambda: get("tulip_framed_connections") == 1)
        fourth = Framed(port)
        fourth.send(request(4, [[5, 6, 7]]))
        assert fourth.recv().code == 0
        second.close()
        fourth.close()


@pytest.mark.parametrize("ephemeral", [False, True])
@pytest.mark.parametrize("host", ["0.0.0.0", "[::]", "::"])
def test_the_framed_port_binds_the_host_forms_the_grpc_port_takes(host, ephemeral) -> None:
    """Explicit or ephemeral (beside an ephemeral gRPC port), one port that IPv4 clients reach."""
    if ":" in host and not socket.has_ipv6:
        pytest.skip("no IPv6 here")
    try:
        server = ServerThread(make_config(host=host, **({} if ephemeral else {"framed_port": _free_port()})),
                              FakeEngine())
    except (OSError, RuntimeError) as exc:  # gRPC's RuntimeError: cannot bind [::] where IPv6 is off
        if ":" in host:
            pytest.skip(f"IPv6 unavailable here: {exc}")
        raise
    with server as s:
        assert s.server.framed.port > 0
        assert {sock.getsockname()[1] for sock in s.server.framed._listener.sockets} == {s.server.framed.port}
        client = Framed(s.server.framed.port)  # 127.0.0.1: a wildcard bind (dual-stack for ::) takes it
        client.send(request(1, [[5, 6, 7]]))
        assert client.recv().code == 0
        client.close()


def test_a_flood_past_the_cap_is_closed_at_once_without_an_answer(monkeypatch) -> None:
    """Past as many lingering refusals as the cap, a new connection gets no answer and no linger."""
    from tulip import framed

    monkeypatch.setattr(framed, "REFUSED_LINGER_S", 5.0)
    with ServerThread(make_config(framed_max_connections=1), FakeEngine()) as s:
        port = s.server.framed.port
        held = Framed(port)
        held.send(request(1, [[5, 6, 7]]))
        assert held.recv().code == 0
        lingering = Framed(port)  # refused with an answer, then lingers
        assert lingering.recv().reason == "too_many_connections"
        flood = Framed(port)  # one refusal already lingers (the cap): closed at once, nothing said
        try:
            assert flood.recv() is None
        except ConnectionResetError:
            pass  # the abort may reach the client as a reset
        assert s.server.metrics.registry.get_sample_value("tulip_framed_refused_connections_total") == 2
        for client in (held, lingering, flood):
            client.close()
        wait_until(lambda: framed._REFUSALS.lingering == 0, what="the lingering refusal released")


class _FloodTransport:
    """A transport that records whether reading is paused and what is written (the admission path alone)."""

    def __init__(self) -> None:
        self.reading, self.written = True, []

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def is_closing(self) -> bool:
        return False

    def write(self, data) -> None:
        self.written.append(bytes(data))


def _admission_session():
    """A FramedSession on a fake transport whose admitted requests are recorded, not run: (session, their ids)."""
    from types import SimpleNamespace

    from tulip import framed

    server = SimpleNamespace(config=SimpleNamespace(framed_direct=False))
    session = framed.FramedSession(server, 1 << 20, set())
    session.transport = _FloodTransport()
    admitted: list[int] = []
    session.requests.handle = lambda message: admitted.append(message.id)
    return session, admitted


def test_a_flood_of_frames_in_one_read_lets_the_loop_turn_between_admissions() -> None:
    """One read holding thousands of small frames (a flood on one connection: RELIABILITY 51) is admitted
    FRAMES_BEFORE_YIELD at a time, reading paused, the loop turning between (callbacks from the completer and the
    other connections run there); every frame is admitted, in order, and reading resumes after the last. Before,
    the whole read was admitted in one callback: on uvloop a flood held the loop for seconds."""
    from protos.framing import frame
    from tulip import framed

    async def flood() -> None:
        session, admitted = _admission_session()
        turns: list[int] = []
        n = 3 * framed.FRAMES_BEFORE_YIELD + 5
        session.data_received(b"".join(frame(request(i, [[1, 2]])) for i in range(1, n + 1)))
        assert admitted == list(range(1, framed.FRAMES_BEFORE_YIELD + 1))
        assert not session.transport.reading
        while len(admitted) < n:
            asyncio.get_running_loop().call_soon(lambda: turns.append(len(admitted)))
            await asyncio.sleep(0)
            assert len(turns) == 1 or turns[-1] - turns[-2] <= framed.FRAMES_BEFORE_YIELD
        assert admitted == list(range(1, n + 1))
        assert session.transport.reading
        assert turns[0] <= 2 * framed.FRAMES_BEFORE_YIELD  # queued behind the first turn's, after _turned's

    asyncio.run(flood())


def test_answers_queued_behind_a_direct_answers_rest_count_toward_the_write_mark(monkeypatch) -> None:
    """While a direct answer's rest waits for the loop, later answers queue beside the transport, whose high-water
    mark does not see them: past WRITE_HIGH_BYTES they pause reading (no new work from a client that reads nothing)
    until the loop has written them, as the transport's own mark would."""
    from protos.framing import frame
    from tulip import framed

    monkeypatch.setattr(framed, "WRITE_HIGH_BYTES", 1000)

    async def queued() -> None:
        session, admitted = _admission_session()
        session._rest_pending = True
        answer = embed_pb2.StreamResponse(id=7, response=embed_pb2.EmbedResponse(embeddings=b"x" * 400))
        session._send(answer)
        session._send(answer)
        assert session.transport.reading and session.transport.written == []
        session._send(answer)  # 3 x ~410 bytes unseen by the transport: past the mark
        assert not session.transport.reading
        session.data_received(frame(request(1, [[1, 2]])))
        assert admitted == []  # read before the pause took hold: held, not admitted
        session._write_rest(memoryview(b"rest"))
        assert session.transport.written[0] == b"rest" and len(session.transport.written) == 4
        assert session.transport.reading and admitted == [1]

    asyncio.run(queued())


def test_a_connection_whose_frames_come_one_a_read_never_pauses() -> None:
    """Ivy's traffic (a frame a read, the loop turning between): the budget is renewed each time it is spent, with
    no pause of reading and no turn lost; only frames still waiting past it pause."""
    from protos.framing import frame
    from tulip import framed

    async def one_a_read() -> None:
        session, admitted = _admission_session()
        pauses = []
        session.transport.pause_reading = lambda: pauses.append(len(admitted))
        n = 3 * framed.FRAMES_BEFORE_YIELD + 5
        for i in range(1, n + 1):
            session.data_received(frame(request(i, [[1, 2]])))
            await asyncio.sleep(0)
        assert admitted == list(range(1, n + 1)) and pauses == []

    asyncio.run(one_a_read())


class _ClosingTransport(_FloodTransport):
    closing = False

    def is_closing(self) -> bool:
        return self.closing


def test_frames_waiting_are_not_admitted_once_the_connection_closes(monkeypatch) -> None:
    """Frames read while answers went unread wait unadmitted; a connection closing meanwhile (the listener's close at
    stop, a stall's abort) admits none of them when its buffer drains or a direct answer's rest is written."""
    from protos.framing import frame
    from tulip import framed

    async def closing() -> None:
        session, admitted = _admission_session()
        session.transport = _ClosingTransport()
        session.pause_writing()
        session.data_received(b"".join(frame(request(i, [[1, 2]])) for i in range(1, 11)))
        assert admitted == []
        session.transport.closing = True
        session.resume_writing()
        assert admitted == []
        session, admitted = _admission_session()
        session.transport = _ClosingTransport()
        session._rest_pending = True
        monkeypatch.setattr(framed, "WRITE_HIGH_BYTES", 10)
        session._send(embed_pb2.StreamResponse(id=99, message="x" * 20))  # past the mark behind the rest
        session.data_received(b"".join(frame(request(i, [[1, 2]])) for i in range(1, 11)))
        session.transport.closing = True
        session._write_rest(memoryview(b"rest"))
        assert admitted == []

    asyncio.run(closing())


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_eof_cancels_what_is_open_even_with_answers_unsent(monkeypatch, loop) -> None:
    """A peer's EOF cancels its open requests at once and the connection goes after STALL_S if its answers stay
    unread. Before, the transport's own close waited on the unsent answers with no timer: the open request stayed
    on the device and the connection under framed_max_connections for good."""
    from tulip import framed

    uvloop = pytest.importorskip("uvloop") if loop == "uvloop" else None
    factory = asyncio.new_event_loop if uvloop is None else uvloop.new_event_loop
    monkeypatch.setattr(framed, "STALL_S", 0.5)
    monkeypatch.setattr(framed, "keep_alive", lambda transport: transport.get_extra_info("socket").setsockopt(
        socket.SOL_SOCKET, socket.SO_SNDBUF, 16384))
    engine = FakeEngine(FakeInfo(dimensions=2048), gated=True)
    with ServerThread(make_config(), engine, loop_factory=factory) as s:
        client = Framed.__new__(Framed)
        client.sock = socket.socket()
        client.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        client.sock.connect(("127.0.0.1", s.server.framed.port))
        for i in range(1, 9):  # 8 answers of 128 KiB, never read: most stay in the transport's buffer
            client.send(request(i, [[i, j + 1, 5] for j in range(16)]))
        engine.release(8)
        wait_until(lambda: s.server.metrics.registry.get_sample_value(
            "tulip_requests_total", {"status": "OK"}) == 8, what="8 answered into the buffer")
        session, = s.server.framed._sessions
        assert session.transport.get_write_buffer_size() > 0
        client.send(request(9, [[9] * 10]))  # open: its batch held by the gated engine
        wait_until(lambda: s.server._active == 1, what="request 9 open")
        client.sock.shutdown(socket.SHUT_WR)
        wait_until(lambda: s.server._active == 0, what="the open request cancelled at EOF")
        wait_until(lambda: not s.server.framed._sessions, what="the half-closed connection dropped")
        engine.release(100)
        client.close()
