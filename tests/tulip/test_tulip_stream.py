"""EmbedStream on a real Tulip server (fake engine): many requests multiplexed on one call, each admitted
and answered exactly as a unary Embed (same rows, same refusals), per-message deadlines and cancels that
keep the work off the engine, a dead stream's queued work dropped, and drain."""

import asyncio
import queue
import random
import threading
import time

import grpc
import numpy as np
from test_tulip_server import _hold_two_batches, first_tokens, random_request
from tulip_testkit import FakeEngine, ServerThread, decode_response, encode_request, make_config, marked_sequence
from tulip_testkit import solo_embedding, wait_until

from protos import embed_pb2

_STOP = object()


class Stream:
    """A synchronous client of one EmbedStream call: send() by id, answers collected as they arrive."""

    def __init__(self, stub) -> None:
        self._out: queue.Queue = queue.Queue()
        self.answers: dict[int, embed_pb2.StreamResponse] = {}
        self.order: list[int] = []
        self._call = stub.EmbedStream(iter(self._out.get, _STOP))
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        try:
            for message in self._call:
                self.answers[message.id] = message
                self.order.append(message.id)
        except grpc.RpcError:
            pass

    def send(self, request_id: int, request=None, timeout_s: float = 30.0, cancel: bool = False) -> None:
        self._out.put(embed_pb2.StreamRequest(id=request_id, request=request, timeout_s=timeout_s, cancel=cancel))

    def answer(self, request_id: int) -> embed_pb2.StreamResponse:
        wait_until(lambda: request_id in self.answers, what=f"answer {request_id}")
        return self.answers[request_id]

    def close(self) -> None:
        self._out.put(_STOP)  # half-close: Tulip answers what it owes, then ends the call
        self._reader.join(10)

    def abort(self) -> None:
        self._call.cancel()
        self._reader.join(10)


def test_many_requests_on_one_stream_each_equal_their_solo_embedding() -> None:
    engine = FakeEngine()
    rng = random.Random(11)
    requests = [random_request(rng, i) for i in range(200)]
    with ServerThread(make_config(max_batch_tokens=96, max_batch_seqs=8), engine) as s:
        stream = Stream(s.stub)
        for i, req in enumerate(requests):
            stream.send(i + 1, req)
        for i, req in enumerate(requests):
            answer = stream.answer(i + 1)
            assert answer.code == 0
            np.testing.assert_array_equal(decode_response(answer.response), solo_embedding(req))
        stream.close()
        wait_until(lambda: s.server._active == 0, what="every request settled")


def test_refusals_are_answered_by_id_and_the_stream_goes_on() -> None:
    with ServerThread(make_config(), FakeEngine()) as s:
        stream = Stream(s.stub)
        bad = embed_pb2.EmbedRequest(token_ids=b"\x01\x00\x00", seq_lens=b"")
        stream.send(1, bad)
        answer = stream.answer(1)
        assert answer.code == grpc.StatusCode.INVALID_ARGUMENT.value[0] and answer.reason == "invalid_argument"
        assert "token_ids" in answer.message
        good = encode_request([marked_sequence(5, 7)])
        stream.send(2, good)
        np.testing.assert_array_equal(decode_response(stream.answer(2).response), solo_embedding(good))
        stream.close()


def test_an_id_already_in_flight_ends_the_stream_as_the_client_s_error_and_no_answer_comes_on_it() -> None:
    """A client that reuses an id in flight broke the stream's contract: INVALID_ARGUMENT naming the id (not
    INTERNAL, which reads as Tulip's fault and is retried), but not as an answer on that id, which the client would
    take for the first request's (RELIABILITY 55): the stream ends with it, its open requests cancelled and their
    work kept off the engine (tests/tulip/test_tulip_stream_protocol.py has the framed port's)."""
    engine = FakeEngine(gated=True)
    with ServerThread(make_config(), engine) as s:
        held = _hold_two_batches(s, engine)
        stream = Stream(s.stub)
        stream.send(1, encode_request([marked_sequence(31, 6)]))
        wait_until(lambda: s.server.queue.depth()[0] >= 1, what="queued")
        stream.send(1, encode_request([marked_sequence(32, 6)]))
        stream._reader.join(10)
        assert not stream._reader.is_alive(), "the stream did not end"
        assert stream._call.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "request id 1 " in stream._call.details() and "in flight" in stream._call.details()
        assert stream.answers == {}
        wait_until(lambda: s.server.queue.depth() == (0, 0), what="the open request's work left the queue")
        engine.release(100)
        [f.result() for f in held]
        wait_until(lambda: s.server._active == 0, what="every request settled")
    assert not {31, 32} & set(first_tokens(engine))


def test_a_cancel_or_a_passed_deadline_keeps_the_work_off_the_engine() -> None:
    engine = FakeEngine(gated=True)
    with ServerThread(make_config(), engine) as s:
        held = _hold_two_batches(s, engine)
        stream = Stream(s.stub)
        stream.send(1, encode_request([marked_sequence(21, 6)]))
        stream.send(2, encode_request([marked_sequence(22, 6)]), timeout_s=0.05)
        after = encode_request([marked_sequence(23, 6)])
        stream.send(3, after)
        wait_until(lambda: s.server.queue.depth()[0] >= 2, what="queued")
        stream.send(1, cancel=True)
        wait_until(lambda: s.server.queue.depth()[0] <= 2, what="cancelled work left the queue")
        # Request 2's deadline passes while it is still queued. Its 0.05 s count from Tulip's read of message 2,
        # which came before the cancel (message 4) that the wait above saw take effect: 0.06 s from here is past
        # it on the same clock however loaded the machine (load only lengthens the wait). A time, not a state.
        time.sleep(0.06)
        engine.release(100)
        [f.result() for f in held]
        assert stream.answer(2).code == grpc.StatusCode.DEADLINE_EXCEEDED.value[0]
        np.testing.assert_array_equal(decode_response(stream.answer(3).response), solo_embedding(after))
        stream.close()
        assert 1 not in stream.answers  # a cancelled request is not answered
        wait_until(lambda: s.server._active == 0, what="every request settled")
    seen = first_tokens(engine)
    assert 21 not in seen and 22 not in seen and 23 in seen


def test_a_stream_that_dies_drops_its_queued_work() -> None:
    engine = FakeEngine(gated=True)
    with ServerThread(make_config(), engine) as s:
        held = _hold_two_batches(s, engine)
        stream = Stream(s.stub)
        stream.send(1, encode_request([marked_sequence(31, 6)]))
        stream.send(2, encode_request([marked_sequence(32, 6)]))
        wait_until(lambda: s.server.queue.depth()[0] == 2, what="queued")
        stream.abort()
        wait_until(lambda: s.server.queue.depth()[0] == 0, what="a dead stream's work dropped")
        engine.release(100)
        [f.result() for f in held]
        wait_until(lambda: s.server._active == 0, what="every request settled")
    seen = first_tokens(engine)
    assert 31 not in seen and 32 not in seen


def test_drain_answers_what_the_stream_was_given_and_refuses_new() -> None:
    engine = FakeEngine(gated=True)
    with ServerThread(make_config(), engine) as s:
        held = _hold_two_batches(s, engine)
        stream = Stream(s.stub)
        queued = encode_request([marked_sequence(41, 8)])
        stream.send(1, queued)
        wait_until(lambda: s.server.queue.depth()[0] == 1)
        drain = asyncio.run_coroutine_threadsafe(s.server.drain(), s.loop)
        wait_until(lambda: s.server.draining)
        stream.send(2, encode_request([[1]]))
        refused = stream.answer(2)
        assert refused.code == grpc.StatusCode.UNAVAILABLE.value[0] and refused.reason == "shutting_down"
        engine.release(100)
        np.testing.assert_array_equal(decode_response(stream.answer(1).response), solo_embedding(queued))
        assert drain.result(30) is True
        assert all(f.result().rows == 1 for f in held)


def test_a_request_whose_batch_ran_cold_says_so_and_its_neighbours_not() -> None:
    engine = FakeEngine()
    engine.cold_when = lambda batch: int(batch.token_ids[0]) == 51  # the batch that starts with marker 51
    with ServerThread(make_config(), engine) as s:
        cold = s.stub.Embed(encode_request([marked_sequence(51, 6)]), timeout=10)
        warm = s.stub.Embed(encode_request([marked_sequence(52, 6)]), timeout=10)
        assert cold.cold and not warm.cold
        stream = Stream(s.stub)
        stream.send(1, encode_request([marked_sequence(51, 6)]))
        assert stream.answer(1).response.cold
        stream.close()


def test_an_answer_says_where_its_time_went_in_tulip() -> None:
    """EmbedResponse's queue_us / inference_us / batcher_us (Ivy's x-queue-time, x-inference-time, x-batcher-time):
    a request queued behind two held batches waits at least as long as they are held; its own batch's device
    time is inference; the whole is at least their sum. On the unary call and on the stream alike."""
    engine = FakeEngine(gated=True, step_seconds=0.05)
    with ServerThread(make_config(), engine) as s:
        held = _hold_two_batches(s, engine)
        queued = s.stub.Embed.future(encode_request([marked_sequence(61, 6)]), timeout=30)
        stream = Stream(s.stub)
        stream.send(1, encode_request([marked_sequence(62, 6)]))
        time.sleep(0.3)  # both wait behind the held batches
        engine.release(100)
        unary, streamed = queued.result(), stream.answer(1).response
        stream.close()
        [f.result() for f in held]
        for answer in (unary, streamed):
            assert answer.queue_us >= 250_000, answer  # held 0.3 s before the release
            assert 50_000 <= answer.inference_us < 2_000_000, answer  # its own batch's 0.05 s on the device
            assert answer.batcher_us >= answer.queue_us + answer.inference_us, answer
        alone = s.stub.Embed(encode_request([marked_sequence(63, 6)]), timeout=10)
        assert alone.queue_us < 250_000 and alone.inference_us >= 50_000 and alone.batcher_us >= alone.inference_us


def test_a_cancel_after_the_result_reached_the_loop_gets_no_answer_even_when_its_id_is_reused() -> None:
    """protos: a cancel means "no answer follows", and an id is unique only among the requests in flight, so a
    client may reuse a cancelled id at once. The completer's result reaches the loop (tulip.job._settle_all) in the
    same loop iteration as a framed read that cancels the request and reuses its id: the answer of the cancelled
    request must not be sent under the id that now names the new one (which would get two answers, the first
    with another request's rows)."""
    from tulip.job import EmbedResult
    from tulip.stream import StreamRequests

    engine = FakeEngine(gated=True)
    with ServerThread(make_config(), engine) as s:
        held = _hold_two_batches(s, engine)
        sent: list = []
        reused = encode_request([marked_sequence(72, 6)])

        async def same_iteration() -> None:
            requests = StreamRequests(s.server, sent.append)
            requests.handle(embed_pb2.StreamRequest(id=5, request=encode_request([marked_sequence(71, 6)])))
            old = requests.jobs[5]
            old.future.set_result(EmbedResult(embeddings=b"", rows=0, dimensions=16, encoding=0, tokens=6))
            requests.handle(embed_pb2.StreamRequest(id=5, cancel=True))
            requests.handle(embed_pb2.StreamRequest(id=5, request=reused))

        s.run(same_iteration())
        engine.release(100)
        [f.result() for f in held]
        wait_until(lambda: s.server._active == 0, what="every request settled")
        assert [m.id for m in sent] == [5], sent
        np.testing.assert_array_equal(decode_response(sent[0].response), solo_embedding(reused))


def test_a_streamed_request_is_answered_deadline_exceeded_at_its_deadline_while_the_device_is_busy() -> None:
    """As the unary call's deadline does (RELIABILITY 14, 15): a stream request whose timeout_s passes while the
    batches ahead still hold the device is answered DEADLINE_EXCEEDED then, its tokens leave the queue then (not
    once the packer reaches it: they counted against max_queue_tokens and deadline admission meanwhile), and its
    work never reaches the engine."""
    engine = FakeEngine(gated=True)
    with ServerThread(make_config(), engine) as s:
        held = _hold_two_batches(s, engine)
        stream = Stream(s.stub)
        stream.send(1, encode_request([marked_sequence(81, 6)]), timeout_s=0.2)
        wait_until(lambda: 1 in stream.answers, timeout=2.5, what="DEADLINE_EXCEEDED with the device still busy")
        assert stream.answers[1].code == grpc.StatusCode.DEADLINE_EXCEEDED.value[0]
        assert stream.answers[1].reason == "deadline_exceeded"
        assert s.server.queue.depth() == (0, 0) and engine.launched == 2
        engine.release(100)
        [f.result() for f in held]
        stream.close()
        wait_until(lambda: s.server._active == 0, what="every request settled")
    assert 81 not in first_tokens(engine) and stream.order == [1]
