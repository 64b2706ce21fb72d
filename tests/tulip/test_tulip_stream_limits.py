"""EmbedStream's limits on what a client can make Tulip hold or do: a client that does not read its answers stops
being read once they pass the framed port's mark (tulip.framed.WRITE_HIGH_BYTES) and its call is ended when they
stay there STALL_S; a timeout_s that is not a deadline (NaN, infinite) is refused, and a negative one is a deadline
already past."""

import threading
import time

import grpc
import numpy as np
from test_tulip_server import _hold_two_batches
from test_tulip_stream import Stream
from tulip_testkit import FakeEngine, FakeInfo, ServerThread, encode_request, first_tokens, make_config
from tulip_testkit import marked_sequence, pack_i32, wait_until

from protos import embed_pb2, embed_pb2_grpc
from tulip import framed
from tulip.server import CLIENT_CHANNEL_OPTIONS

ROWS = 64  # a row per token of one 64-token sequence, 1024 float32 dimensions a row: a 256 KB answer, 1 KB asked
BIG = embed_pb2.EmbedRequest(token_ids=pack_i32(np.arange(1, ROWS + 1)), seq_lens=pack_i32([ROWS]),
                             spans=pack_i32([(0, t, t + 1) for t in range(ROWS)]))
MARK = 1 << 20  # framed.WRITE_HIGH_BYTES for these tests: four answers


def _engine(**options) -> FakeEngine:
    return FakeEngine(FakeInfo(dimensions=1024), **options)


class Unread:
    """An EmbedStream that sends `count` requests for 256 KB answers and reads none until read_all(). The channel
    does not probe the bandwidth-delay product, so HTTP/2's window stays small and the unread answers stay in the
    server rather than in the client's buffers."""

    def __init__(self, address: str, count: int) -> None:
        self.channel = grpc.insecure_channel(address, options=[*CLIENT_CHANNEL_OPTIONS, ("grpc.http2.bdp_probe", 0)])
        self.call = embed_pb2_grpc.EmbedderStub(self.channel).EmbedStream(self._requests(count))

    def _requests(self, count: int):
        for i in range(1, count + 1):
            yield embed_pb2.StreamRequest(id=i, request=BIG, timeout_s=60.0)

    def read_all(self) -> tuple[list[embed_pb2.StreamResponse], grpc.StatusCode]:
        answers, code = [], None
        done = threading.Event()

        def read() -> None:
            nonlocal code
            try:
                answers.extend(self.call)
                code = grpc.StatusCode.OK
            except grpc.RpcError as exc:
                code = exc.code()
            done.set()

        threading.Thread(target=read, daemon=True).start()
        assert done.wait(30), "the call did not end"
        self.channel.close()
        return answers, code


def _settled(read, quiet_s: float = 0.5, timeout: float = 20.0) -> int:
    """read()'s value once it has not changed for quiet_s (a count that stopped growing)."""
    last, since, started = read(), time.monotonic(), time.monotonic()
    while time.monotonic() - since < quiet_s:
        assert time.monotonic() - started < timeout, "the count never stopped growing"
        time.sleep(0.02)
        if (now := read()) != last:
            last, since = now, time.monotonic()
    return last


def test_a_stream_whose_answers_are_unread_stops_being_read_and_resumes_once_they_are(monkeypatch) -> None:
    """RELIABILITY 40 on the gRPC stream, as on the framed port: past the mark of unsent answers Tulip reads no
    more of the client's requests (no new work, no more memory held for it); once the client reads, the stream
    goes on and every request is answered."""
    monkeypatch.setattr(framed, "WRITE_HIGH_BYTES", MARK)
    count = 256  # 64 MB of answers
    with ServerThread(make_config(), _engine()) as s:
        client = Unread(s.address, count)
        # How far past the mark it reads depends on how many requests it admitted before their answers came (all
        # of them before the fix); here a few MB, 20 MB on uvloop.
        read = _settled(lambda: s.server.calls_seen)
        assert read < count, f"all {count} requests read with none of their answers read"
        answers, code = client.read_all()
        assert code == grpc.StatusCode.OK
        assert sorted(a.id for a in answers) == list(range(1, count + 1))
        assert all(a.code == 0 and a.response.rows == ROWS for a in answers)
        wait_until(lambda: s.server._active == 0, what="every request settled")


def test_a_stream_whose_answers_stay_unread_is_ended_and_its_open_work_cancelled(monkeypatch) -> None:
    """Unsent answers above the mark for STALL_S: the call ends (RESOURCE_EXHAUSTED, what the client sees once it
    reads again), its unsent answers are dropped and its open requests cancelled as a dead stream's are."""
    monkeypatch.setattr(framed, "WRITE_HIGH_BYTES", MARK)
    monkeypatch.setattr(framed, "STALL_S", 0.5)
    engine = _engine(gated=True)
    with ServerThread(make_config(), engine) as s:
        client = Unread(s.address, 60)  # four a batch (256 tokens): 1-4 and 5-8 on the device, the rest queued
        wait_until(lambda: s.server.calls_seen == 60 and engine.launched == 2, what="two batches launched")
        engine.release(6)  # 1-24 answered, 6 MB unread; 25-32 on the device behind them, 33-60 queued
        wait_until(lambda: engine.launched == 8, what="batches 7 and 8 launched")
        wait_until(lambda: s.server._active == 0, timeout=10, what="the stalled stream's open requests cancelled")
        assert s.server.queue.depth() == (0, 0)
        answers, code = client.read_all()
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert all(a.id <= 24 and a.code == 0 for a in answers) and len(answers) < 24
        engine.release(100)


def test_a_stream_timeout_that_is_no_deadline_is_refused_and_a_negative_one_is_already_past() -> None:
    """protos: timeout_s 0 = no deadline, and only 0. NaN and the infinities are INVALID_ARGUMENT naming the field;
    a negative timeout is a deadline already past: DEADLINE_EXCEEDED at once, its work never queued."""
    engine = FakeEngine(gated=True)
    with ServerThread(make_config(), engine) as s:
        held = _hold_two_batches(s, engine)
        stream = Stream(s.stub)
        for i, timeout in enumerate([-1.0, float("nan"), float("inf"), float("-inf"), 0.0, -0.0], start=1):
            stream.send(i, encode_request([marked_sequence(40 + i, 6)]), timeout_s=timeout)
        wait_until(lambda: {1, 2, 3, 4} <= set(stream.answers), timeout=5, what="answers with the device held")
        assert stream.answers[1].code == grpc.StatusCode.DEADLINE_EXCEEDED.value[0]
        assert stream.answers[1].reason == "deadline_exceeded"
        for i in (2, 3, 4):
            assert stream.answers[i].code == grpc.StatusCode.INVALID_ARGUMENT.value[0], stream.answers[i]
            assert "timeout_s" in stream.answers[i].message
        wait_until(lambda: s.server.queue.depth()[0] == 2, what="0 and -0 queued without a deadline")
        engine.release(100)
        assert stream.answer(5).code == 0 and stream.answer(6).code == 0
        [f.result() for f in held]
        stream.close()
        wait_until(lambda: s.server._active == 0, what="every request settled")
    assert not {41, 42, 43, 44} & set(first_tokens(engine))
