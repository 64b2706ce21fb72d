"""A stream's client that breaks the stream's own contract, and messages that fail to decode (RELIABILITY 55, 56).

55: a request id sent again while it is still in flight is a protocol error of the stream, as a reused stream id is
in HTTP/2: no answer on that id, which the client would take for the first request's (before: "already in flight"
on the id, then the first request's rows on it too). The gRPC EmbedStream ends INVALID_ARGUMENT naming the id, the
framed port answers on id 0 and closes; the answers already due are written first, the open requests cancelled.

56: an EmbedRequest whose string fields (request_id, output) are not UTF-8 fails protobuf's decoding. The unary call
is refused INVALID_ARGUMENT naming the field (before: UNKNOWN "Unexpected DecodeError"); on the gRPC stream only
that request is refused, on its id (before: the whole call ended UNKNOWN, every other request on it unanswered); a
stream message whose id cannot be read ends the stream INVALID_ARGUMENT; the framed port answers bad_frame on id 0
and closes, as for any frame that is not a StreamRequest."""

import queue
import threading

import grpc
import numpy as np
from test_tulip_framed import Framed, request
from test_tulip_server import _hold_two_batches
from tulip_testkit import FakeEngine, ServerThread, decode_response, encode_request, first_tokens, make_config
from tulip_testkit import marked_sequence, solo_embedding, wait_until

from protos import embed_pb2

INVALID = grpc.StatusCode.INVALID_ARGUMENT
_STOP = object()


class RawStream:
    """An EmbedStream call that sends raw bytes (a message protobuf would refuse to build) and keeps, beside the
    answers in their order, the status the call ended with."""

    def __init__(self, channel: grpc.Channel) -> None:
        self._out: queue.Queue = queue.Queue()
        call = channel.stream_stream("/tulip.v1.Embedder/EmbedStream", request_serializer=bytes,
                                     response_deserializer=embed_pb2.StreamResponse.FromString)
        self._call = call(iter(self._out.get, _STOP), timeout=60)
        self.answers: list[embed_pb2.StreamResponse] = []
        self.ended: grpc.RpcError | None = None
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        try:
            for message in self._call:
                self.answers.append(message)
        except grpc.RpcError as exc:
            self.ended = exc

    def send(self, message) -> None:
        self._out.put(message if isinstance(message, bytes) else message.SerializeToString())

    def ids(self) -> list[int]:
        return [a.id for a in self.answers]

    def wait_end(self) -> grpc.RpcError | None:
        self._reader.join(20)
        assert not self._reader.is_alive(), "the call did not end"
        return self.ended

    def close(self) -> None:
        self._out.put(_STOP)
        self._reader.join(20)


def _with_string(data: bytes, field: int, value: bytes) -> bytes:
    """`data` (a serialized EmbedRequest) with string field `field` set to raw `value` (the last occurrence wins)."""
    return data + bytes([(field << 3) | 2, len(value)]) + value


def _not_utf8(request_id_field: bool = True) -> bytes:
    good = encode_request([marked_sequence(41, 6)]).SerializeToString()
    return _with_string(good, 7 if request_id_field else 10, b"ab\xff")


def _stream_request(request_id: int, request_bytes: bytes, timeout_s: float = 20.0) -> bytes:
    """A serialized StreamRequest around raw EmbedRequest bytes."""
    head = embed_pb2.StreamRequest(id=request_id, timeout_s=timeout_s).SerializeToString()
    assert len(request_bytes) < 128
    return head + bytes([0x12, len(request_bytes)]) + request_bytes


# -- 55: an id reused while in flight ------------------------------------------------------------------------------


def test_grpc_stream_an_id_reused_in_flight_ends_the_stream_naming_it_and_cancels_the_open_requests() -> None:
    """No answer on the reused id: the call ends INVALID_ARGUMENT naming it (reason stream_protocol_error), after the
    answer that was due (a refusal on id 3); the open requests (ids 1 and 2) are cancelled, their work never
    reaches the engine, and the replica serves on."""
    engine = FakeEngine(gated=True)
    with ServerThread(make_config(), engine) as s:
        held = _hold_two_batches(s, engine)
        stream = RawStream(s.channel)
        stream.send(embed_pb2.StreamRequest(id=1, request=encode_request([marked_sequence(31, 6)]), timeout_s=20))
        stream.send(embed_pb2.StreamRequest(id=2, request=encode_request([marked_sequence(32, 6)]), timeout_s=20))
        stream.send(embed_pb2.StreamRequest(id=3, request=embed_pb2.EmbedRequest(), timeout_s=20))  # refused
        wait_until(lambda: s.server.queue.depth()[0] >= 2 and stream.ids() == [3], what="queued, 3 refused")
        stream.send(embed_pb2.StreamRequest(id=1, request=encode_request([marked_sequence(33, 6)]), timeout_s=20))
        ended = stream.wait_end()
        assert ended is not None and ended.code() == INVALID, ended
        assert "request id 1 " in ended.details() and "in flight" in ended.details()
        assert ("tulip-reason", "stream_protocol_error") in tuple(ended.trailing_metadata())
        assert stream.ids() == [3] and stream.answers[0].code == INVALID.value[0]
        wait_until(lambda: s.server.queue.depth() == (0, 0), what="the open requests' work left the queue")
        engine.release(100)
        [f.result() for f in held]
        wait_until(lambda: s.server._active == 0, what="every request settled")
        after = encode_request([marked_sequence(34, 6)])
        np.testing.assert_array_equal(decode_response(s.stub.Embed(after, timeout=10)), solo_embedding(after))
    assert not {31, 32, 33} & set(first_tokens(engine))


def test_framed_an_id_reused_in_flight_is_answered_on_id_0_and_the_connection_closed() -> None:
    """The framed port: the answer due (a refusal on id 2) first, then one answer on id 0 (INVALID_ARGUMENT,
    stream_protocol_error, naming id 1), then the connection closes; nothing is answered on id 1, its work (and
    the reuse's) never reaches the engine, and another connection is served."""
    engine = FakeEngine(gated=True)
    with ServerThread(make_config(), engine) as s:
        held = _hold_two_batches(s, engine)
        client = Framed(s.server.framed.port)
        client.send(request(1, [marked_sequence(51, 6)]))
        client.send(embed_pb2.StreamRequest(id=2, request=embed_pb2.EmbedRequest(), timeout_s=20))  # refused
        refused = client.recv()
        assert refused.id == 2 and refused.code == INVALID.value[0]
        wait_until(lambda: s.server.queue.depth()[0] >= 1, what="queued")
        client.send(request(1, [marked_sequence(52, 6)]))
        error = client.recv()
        assert error.id == 0 and error.code == INVALID.value[0] and error.reason == "stream_protocol_error", error
        assert "request id 1 " in error.message and "in flight" in error.message
        assert client.recv() is None  # closed, and nothing on id 1
        wait_until(lambda: s.server.queue.depth() == (0, 0), what="the open request's work left the queue")
        engine.release(100)
        [f.result() for f in held]
        wait_until(lambda: s.server._active == 0, what="every request settled")
        client.close()
        other = Framed(s.server.framed.port)
        other.send(request(1, [[4, 5]]))
        assert other.recv().code == 0
        other.close()
    assert not {51, 52} & set(first_tokens(engine))


def test_an_id_may_be_reused_once_answered_or_cancelled_on_either_port() -> None:
    """Unique among the requests in flight, not for the stream's life: an id answered, refused or cancelled is
    free again, and its reuse is served."""
    with ServerThread(make_config(), FakeEngine()) as s:
        stream = RawStream(s.channel)
        stream.send(embed_pb2.StreamRequest(id=4, request=embed_pb2.EmbedRequest(), timeout_s=20))  # refused
        wait_until(lambda: len(stream.answers) == 1, what="refused")
        for n in range(3):
            stream.send(request(4, [marked_sequence(60 + n, 6)]))
            wait_until(lambda n=n: len(stream.answers) == 2 + n, what=f"answer {n}")
            assert stream.answers[-1].id == 4 and stream.answers[-1].code == 0
        stream.send(embed_pb2.StreamRequest(id=4, cancel=True))
        stream.send(request(4, [marked_sequence(64, 6)]))
        wait_until(lambda: len(stream.answers) == 5, what="answer after a cancel")
        assert stream.answers[-1].code == 0
        stream.close()
        assert stream.ended is None and stream.ids() == [4] * 5
        client = Framed(s.server.framed.port)
        for n in range(3):
            client.send(request(4, [marked_sequence(70 + n, 6)]))
            answer = client.recv()
            assert answer.id == 4 and answer.code == 0, answer.message
        client.close()


# -- 56: string fields that are not UTF-8 --------------------------------------------------------------------------


def test_unary_embed_with_a_string_field_not_utf8_is_invalid_argument_naming_the_field() -> None:
    with ServerThread(make_config(), FakeEngine()) as s:
        embed = s.channel.unary_unary("/tulip.v1.Embedder/Embed", request_serializer=bytes,
                                      response_deserializer=embed_pb2.EmbedResponse.FromString)
        for field, payload in (("request_id", _not_utf8(True)), ("output", _not_utf8(False))):
            try:
                embed(payload, timeout=10)
                raise AssertionError(f"{field}: answered")
            except grpc.RpcError as exc:
                assert exc.code() == INVALID, (field, exc.code(), exc.details())
                assert exc.details().startswith(f"{field} is not valid UTF-8"), exc.details()
                assert ("tulip-reason", "invalid_argument") in tuple(exc.trailing_metadata())
        try:  # not protobuf at all: INVALID_ARGUMENT too, not UNKNOWN
            embed(b"\xff\xff\xff\xff\xff", timeout=10)
            raise AssertionError("answered")
        except grpc.RpcError as exc:
            assert exc.code() == INVALID and "could not be decoded" in exc.details(), exc.details()
        good = encode_request([marked_sequence(42, 6)])
        np.testing.assert_array_equal(decode_response(s.stub.Embed(good, timeout=10)), solo_embedding(good))
        assert s.stub.Info(embed_pb2.InfoRequest(), timeout=10).dimensions > 0
        wait_until(lambda: s.server._active == 0, what="every request settled")


def test_grpc_stream_a_request_not_utf8_is_refused_alone_and_the_others_are_answered() -> None:
    """Its id is read with the string fields as bytes: INVALID_ARGUMENT on that id naming the field, while the
    request in flight before it and one sent after it are answered with their rows on the same call."""
    engine = FakeEngine(gated=True)
    with ServerThread(make_config(), engine) as s:
        held = _hold_two_batches(s, engine)
        stream = RawStream(s.channel)
        first = encode_request([marked_sequence(43, 6)])
        stream.send(embed_pb2.StreamRequest(id=1, request=first, timeout_s=20))
        wait_until(lambda: s.server.queue.depth()[0] >= 1, what="queued")
        stream.send(_stream_request(2, _not_utf8(True)))
        stream.send(_stream_request(3, _not_utf8(False)))
        wait_until(lambda: len(stream.answers) == 2, what="the two refusals")
        for answer, field in zip(stream.answers, ("request_id", "output"), strict=True):
            assert answer.code == INVALID.value[0] and answer.reason == "invalid_argument", answer
            assert answer.message.startswith(f"{field} is not valid UTF-8"), answer.message
        assert stream.ids() == [2, 3]
        engine.release(100)
        [f.result() for f in held]
        after = encode_request([marked_sequence(44, 6)])
        stream.send(embed_pb2.StreamRequest(id=4, request=after, timeout_s=20))
        stream.close()
        assert stream.ended is None, stream.ended
        by_id = {a.id: a for a in stream.answers}
        assert sorted(by_id) == [1, 2, 3, 4]
        np.testing.assert_array_equal(decode_response(by_id[1].response), solo_embedding(first))
        np.testing.assert_array_equal(decode_response(by_id[4].response), solo_embedding(after))
        wait_until(lambda: s.server._active == 0, what="every request settled")


def test_grpc_stream_a_message_whose_id_cannot_be_read_ends_the_stream_invalid_argument() -> None:
    """Not UNKNOWN: INVALID_ARGUMENT naming the undecodable message, after the answer due; the request in flight is
    cancelled (its work never reaches the engine)."""
    engine = FakeEngine(gated=True)
    with ServerThread(make_config(), engine) as s:
        held = _hold_two_batches(s, engine)
        stream = RawStream(s.channel)
        stream.send(embed_pb2.StreamRequest(id=1, request=encode_request([marked_sequence(45, 6)]), timeout_s=20))
        stream.send(embed_pb2.StreamRequest(id=2, request=embed_pb2.EmbedRequest(), timeout_s=20))  # refused
        wait_until(lambda: s.server.queue.depth()[0] >= 1 and stream.ids() == [2], what="queued, 2 refused")
        stream.send(b"\xff\xff\xff\xff\xff")
        ended = stream.wait_end()
        assert ended is not None and ended.code() == INVALID, ended
        assert "could not be decoded" in ended.details()
        assert ("tulip-reason", "stream_protocol_error") in tuple(ended.trailing_metadata())
        assert stream.ids() == [2]
        wait_until(lambda: s.server.queue.depth() == (0, 0), what="the open request's work left the queue")
        engine.release(100)
        [f.result() for f in held]
        wait_until(lambda: s.server._active == 0, what="every request settled")
    assert 45 not in first_tokens(engine)


def test_framed_a_request_not_utf8_is_a_bad_frame_answered_on_id_0() -> None:
    """The framed port reads frames with the strict classes: a string field not UTF-8 is a frame that is not a
    StreamRequest, answered bad_frame on id 0, then the connection closes; nothing on the request's id."""
    with ServerThread(make_config(), FakeEngine()) as s:
        client = Framed(s.server.framed.port)
        client.send_raw(_stream_request(2, _not_utf8(True)))
        answer = client.recv()
        assert answer.id == 0 and answer.code == INVALID.value[0] and answer.reason == "bad_frame", answer
        assert client.recv() is None
        client.close()
