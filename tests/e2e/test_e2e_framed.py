"""Ivy's Replica on Tulip's framed EmbedStream (IVY_FRAMED, ivy/framed.py <-> tulip/framed.py): a real TulipServer
with the fake engine on loopback, Ivy's replica object in this thread's event loop."""

import asyncio
import struct
import sys
from pathlib import Path

import grpc
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent.parent / "tulip"))  # tulip_testkit, fake_engine
from tulip_testkit import FakeEngine, ServerThread, decode_response, encode_request, make_config, solo_embedding, wait_until  # noqa: E402

from ivy.framed import FramedStream, host_of  # noqa: E402
from ivy.replica import Replica, channel_options  # noqa: E402
from ivy.stream import CallFailed, ReplicaStream  # noqa: E402
from protos import embed_pb2  # noqa: E402


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def _replica(address: str, framed: bool = True) -> Replica:
    replica = Replica(address, channel_options(16 << 20), framed=framed, max_message_bytes=16 << 20)
    replica.adopt(await replica.embedder.Info(embed_pb2.InfoRequest(), timeout=10))
    await replica.framed_settled()  # its framed connect, in the background, has switched the requests (or not)
    return replica


def test_requests_go_over_the_framed_stream_and_answer_as_the_engine_does() -> None:
    with ServerThread(make_config(), FakeEngine()) as s:
        rng = np.random.default_rng(1)
        requests = [encode_request([[int(t) for t in rng.integers(1, 900, size=n)]]) for n in rng.integers(1, 80, size=30)]

        async def main():
            replica = await _replica(s.address)
            assert isinstance(replica.stream, FramedStream) and replica.stream.port == s.server.framed.port
            answers = await asyncio.gather(*(replica.embed(r, 10.0, 4096) for r in requests))
            opened = replica.stream.opened
            await replica.close()
            return answers, opened

        answers, opened = asyncio.run(main())
        assert opened == 1  # one connection for all of them
        for req, answer in zip(requests, answers):
            np.testing.assert_allclose(decode_response(answer), solo_embedding(req), rtol=1e-6, atol=1e-6)


def test_without_framed_or_without_a_framed_port_the_grpc_stream_stays() -> None:
    with ServerThread(make_config(framed_port=0), FakeEngine()) as s:  # no framed port: Info names none
        async def main():
            kinds = []
            for framed in (True, False):
                replica = await _replica(s.address, framed)
                kinds.append(type(replica.stream))
                await replica.embed(encode_request([[1, 2, 3]]), 10.0, 4096)
                await replica.close()
            return kinds

        assert asyncio.run(main()) == [ReplicaStream, ReplicaStream]


def test_a_timed_out_request_is_cancelled_on_the_replica() -> None:
    engine = FakeEngine(gated=True)
    with ServerThread(make_config(), engine) as s:
        async def main():
            replica = await _replica(s.address)
            busy = [asyncio.ensure_future(replica.embed(encode_request([[i] * 8]), 10.0, 4096)) for i in (1, 2)]
            await asyncio.to_thread(wait_until, lambda: engine.launched == 2, 10.0, "both slots busy")
            try:
                await replica.embed(encode_request([[3] * 8]), 0.3, 4096)
            except CallFailed as exc:
                code = exc.code
            await asyncio.to_thread(wait_until, lambda: s.server.queue.depth()[0] == 0, 10.0, "the cancel arrived")
            engine.release(5)
            await asyncio.gather(*busy)
            await replica.close()
            return code

        assert asyncio.run(main()) is grpc.StatusCode.DEADLINE_EXCEEDED
        assert engine.launched == 2  # the timed-out request never ran


def test_a_replica_that_goes_away_fails_what_waits_with_unavailable() -> None:
    engine = FakeEngine(gated=True)
    s = ServerThread(make_config(), engine)
    try:
        async def main():
            replica = await _replica(s.address)
            waiting = asyncio.ensure_future(replica.embed(encode_request([[1] * 8]), 10.0, 4096))
            await asyncio.to_thread(wait_until, lambda: engine.launched == 1, 10.0, "launched")
            await asyncio.to_thread(s.run, s.server.stop())
            try:
                await waiting
            except CallFailed as exc:
                return exc.code
            finally:
                await replica.close()

        assert asyncio.run(main()) is grpc.StatusCode.UNAVAILABLE
    finally:
        engine.release(5)
        s.close()


def test_a_request_paused_before_its_write_counts_as_waiting() -> None:
    """A stream the replica left is closed once nothing waits on it (Replica._switch): a request still waiting to
    write (the connection's buffer full) or to connect is under way too, or it would fail UNAVAILABLE."""
    class Paused:  # an open connection whose writes are paused
        live = True

        def __init__(self) -> None:
            self.pending: dict = {}
            self.resume = asyncio.Event()
            self.sent: list = []

        async def writable(self) -> None:
            await self.resume.wait()

        def write(self, message) -> None:
            self.sent.append(message)

    async def main():
        stream = FramedStream("127.0.0.1", 1, "127.0.0.1:50051", 1 << 20)
        stream._current = connection = Paused()
        call = asyncio.ensure_future(stream.embed(encode_request([[1] * 8]), 10.0))
        await asyncio.sleep(0.01)
        paused = stream.waiting
        connection.resume.set()
        await asyncio.sleep(0.01)
        written = stream.waiting, len(connection.sent)
        call.cancel()
        await asyncio.gather(call, return_exceptions=True)
        return paused, written, stream.waiting

    assert asyncio.run(main()) == (1, (1, 1), 0)


def test_host_of_an_address() -> None:
    assert host_of("10.0.0.7:50051") == "10.0.0.7"
    assert host_of("[::1]:50051") == "::1"
    assert host_of("tulip-0.tulip:50051") == "tulip-0.tulip"


def test_adopt_moves_to_a_framed_port_only_once_connected_and_retries_a_refused_one_later(monkeypatch) -> None:
    import ivy.replica as replica_module

    async def main():
        replica = Replica("127.0.0.1:1", channel_options(16 << 20), framed=True, max_message_bytes=16 << 20)
        closed_port = _free_port()  # nothing listens there
        replica.adopt(embed_pb2.InfoResponse(framed_port=closed_port))
        seen = [type(replica.stream)]  # still gRPC while it connects: no request waits on the connect
        await replica.framed_settled()
        seen.append(type(replica.stream))  # refused: gRPC
        first_task = replica._trying_task
        replica.adopt(embed_pb2.InfoResponse(framed_port=closed_port))  # within the retry time: not tried
        tried_again_at_once = replica._trying_task is not first_task
        monkeypatch.setattr(replica, "_retry_at", 0.0)  # as if the retry time had passed
        replica.adopt(embed_pb2.InfoResponse(framed_port=closed_port))
        tried_later = replica._trying_task is not first_task
        await replica.framed_settled()
        retry_doubled = replica._retry_s == 4 * replica_module.FRAMED_RETRY_S
        unused = Replica("127.0.0.1:1", channel_options(16 << 20), stream=False, framed=True)
        unused.adopt(embed_pb2.InfoResponse(framed_port=closed_port))  # framed rides on the stream setting
        await replica.close()
        await unused.close()
        return seen, tried_again_at_once, tried_later, retry_doubled, unused.stream

    seen, again, later, doubled, unary_only = asyncio.run(main())
    assert seen == [ReplicaStream, ReplicaStream]
    assert not again and later and doubled and unary_only is None


def test_a_replica_restarted_without_its_framed_port_is_followed_back_to_grpc() -> None:
    with ServerThread(make_config(), FakeEngine()) as s:
        async def main():
            replica = await _replica(s.address)
            kinds = [type(replica.stream)]
            answers = [await replica.embed(encode_request([[1, 2, 3]]), 5.0, 4096)]
            replica.adopt(embed_pb2.InfoResponse(framed_port=0))  # its Info names no framed port any more
            kinds.append(type(replica.stream))
            answers.append(await replica.embed(encode_request([[1, 2, 3]]), 5.0, 4096))
            await replica.close()
            return kinds, answers

        kinds, answers = asyncio.run(main())
    assert kinds == [FramedStream, ReplicaStream]
    for got in answers:
        np.testing.assert_allclose(decode_response(got), solo_embedding(encode_request([[1, 2, 3]])), rtol=1e-6,
                                   atol=1e-6)


def _silent_port(held: list) -> int:
    """A port whose connects are never answered (its listen backlog is full), as behind a NetworkPolicy that
    drops the port's packets rather than refusing them."""
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    held.append(listener)
    port = listener.getsockname()[1]
    for _ in range(3):
        client = socket.socket()
        client.setblocking(False)
        try:
            client.connect(("127.0.0.1", port))
        except BlockingIOError:
            pass
        held.append(client)
    return port


@pytest.mark.parametrize("answer", ["refused", "dropped"])
def test_a_framed_port_that_refuses_or_drops_connects_costs_no_request(answer, monkeypatch) -> None:
    """A cluster whose policy leaves the framed port closed (RST) or silent (dropped SYNs): requests sent while
    Ivy tries it, with deadlines shorter than the connect timeout, are answered over gRPC, and the replica
    stays there (RELIABILITY 41)."""
    import time

    import ivy.framed as framed_module

    monkeypatch.setattr(framed_module, "CONNECT_TIMEOUT_S", 1.5)
    held: list = []
    port = _free_port() if answer == "refused" else _silent_port(held)
    with ServerThread(make_config(framed_port=0), FakeEngine()) as s:
        async def main():
            replica = await _replica(s.address)
            replica.adopt(embed_pb2.InfoResponse(framed_port=port))  # as if Info named an unreachable port
            started = time.monotonic()
            answers = await asyncio.gather(*(replica.embed(encode_request([[1, 2, 3]]), 1.0, 4096) for _ in range(4)))
            took = time.monotonic() - started
            await replica.framed_settled()
            kind = type(replica.stream)
            await replica.close()
            return answers, took, kind

        try:
            answers, took, kind = asyncio.run(main())
        finally:
            for sock in held:
                sock.close()
    want = solo_embedding(encode_request([[1, 2, 3]]))
    for got in answers:
        np.testing.assert_allclose(decode_response(got), want, rtol=1e-6, atol=1e-6)
    assert took < 1.0 and kind is ReplicaStream


def test_a_framed_port_that_goes_away_moves_the_request_in_hand_to_grpc() -> None:
    with ServerThread(make_config(), FakeEngine()) as s:
        async def main():
            replica = await _replica(s.address)
            assert isinstance(replica.stream, FramedStream)
            await replica.embed(encode_request([[1, 2, 3]]), 5.0, 4096)
            s.loop.call_soon_threadsafe(s.server.framed.close)  # its listener and connections gone
            await asyncio.sleep(0.2)
            answer = await replica.embed(encode_request([[4, 5, 6]]), 5.0, 4096)  # reconnect refused: gRPC
            kind = type(replica.stream)
            await replica.close()
            return answer, kind

        answer, kind = asyncio.run(main())
    np.testing.assert_allclose(decode_response(answer), solo_embedding(encode_request([[4, 5, 6]])), rtol=1e-6,
                               atol=1e-6)
    assert kind is ReplicaStream


def test_a_full_framed_port_moves_the_replica_to_grpc_with_the_request_that_found_out() -> None:
    import socket

    with ServerThread(make_config(framed_max_connections=1), FakeEngine()) as s:
        holder = socket.create_connection(("127.0.0.1", s.server.framed.port))  # takes the one connection
        wait_until(lambda: s.server.metrics.registry.get_sample_value("tulip_framed_connections") == 1)

        async def main():
            replica = await _replica(s.address)
            assert isinstance(replica.stream, FramedStream)
            answer = await replica.embed(encode_request([[1, 2, 3]]), 5.0, 4096)
            kind = type(replica.stream)
            await replica.close()
            return answer, kind

        try:
            answer, kind = asyncio.run(main())
        finally:
            holder.close()
    np.testing.assert_allclose(decode_response(answer), solo_embedding(encode_request([[1, 2, 3]])), rtol=1e-6,
                               atol=1e-6)
    assert kind is ReplicaStream


def test_a_malformed_answer_fails_the_request_with_unavailable() -> None:
    async def main():
        async def garbage(reader, writer):
            await reader.read(4)
            writer.write(struct.pack("<I", 3) + b"\xff\xff\xff")
            await writer.drain()
            await asyncio.sleep(5)

        server = await asyncio.start_server(garbage, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        stream = FramedStream("127.0.0.1", port, f"127.0.0.1:{port}", 1 << 20)
        try:
            await stream.embed(encode_request([[1, 2]]), 5.0)
        except CallFailed as exc:
            code = exc.code
        await stream.close()
        server.close()
        return code

    assert asyncio.run(main()) is grpc.StatusCode.UNAVAILABLE


def test_after_an_ejection_closes_the_framed_stream_the_next_request_opens_a_new_one() -> None:
    with ServerThread(make_config(), FakeEngine()) as s:
        async def main():
            replica = await _replica(s.address)
            await replica.embed(encode_request([[1, 2, 3]]), 10.0, 4096)
            await replica.stream.close()  # what Replica.eject does to a hung replica's stream
            answer = await replica.embed(encode_request([[4, 5, 6]]), 10.0, 4096)
            opened = replica.stream.opened
            await replica.close()
            return answer, opened

        answer, opened = asyncio.run(main())
        assert opened == 2
        np.testing.assert_allclose(decode_response(answer), solo_embedding(encode_request([[4, 5, 6]])), rtol=1e-6, atol=1e-6)


@pytest.mark.slow
def test_ivy_up_framed_serves_the_bundled_model_over_the_framed_stream() -> None:
    """What a user runs: `ivy up`, framed by default (Tulip on its framed port, Ivy sending there), answers as
    sentence-transformers does."""
    import json
    import urllib.request

    from stack_testkit import ivy_up

    texts = ["hello world", "good morning", "Tulip packs sequences first come, first served."]
    proc, port = ivy_up("--gpus", "none")
    try:
        body = json.dumps({"input": texts}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/embeddings", body,
                                         {"content-type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as r:
            got = np.array([d["embedding"] for d in json.loads(r.read())["data"]], dtype=np.float32)
        proc.wait_for(lambda: "requests on its framed stream" in proc.output(), "Ivy on the framed stream", 30)
    finally:
        proc.stop()
    from sentence_transformers import SentenceTransformer

    from rose.spec import bundled_model_dir

    want = SentenceTransformer(str(bundled_model_dir()), device="cpu").encode(texts, normalize_embeddings=True)
    assert float((got * want).sum(1).min()) > 0.9999


def test_a_silent_framed_port_says_so() -> None:
    held: list = []
    port = _silent_port(held)

    async def main():
        stream = FramedStream("127.0.0.1", port, f"127.0.0.1:{port}", 16 << 20)
        stream.connect_timeout_s = 0.2
        try:
            await stream.connect()
        except CallFailed as exc:
            return exc, stream.connect_failed
        finally:
            await stream.close()

    try:
        failure, failed = asyncio.run(main())
    finally:
        for sock in held:
            sock.close()
    assert failure.code is grpc.StatusCode.UNAVAILABLE and failed
    assert "no answer to a connect in 0.2 s" in failure.details


def test_framed_answers_carry_tulips_timings() -> None:
    """The framed stream's answers carry queue_us / inference_us / batcher_us as the gRPC ones do (Ivy's
    x-queue-time, x-inference-time, x-batcher-time): each batch spends 30 ms on the fake device."""
    with ServerThread(make_config(), FakeEngine(step_seconds=0.03)) as s:
        async def main():
            replica = await _replica(s.address)
            assert isinstance(replica.stream, FramedStream)
            answer = await replica.embed(encode_request([[5, 6, 7]]), 10.0, 4096)
            await replica.close()
            return answer

        answer = asyncio.run(main())
        assert 30_000 <= answer.inference_us <= answer.batcher_us < 5_000_000, answer
        assert answer.queue_us <= answer.batcher_us - answer.inference_us, answer
