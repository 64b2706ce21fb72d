"""A real Tulip gRPC server on loopback, driving the fake engine: correctness under concurrency, queue order,
deadlines, cancellation, admission, message size, health/Info, overlap of packing with engine work."""

import random
import socket
import time
import urllib.request

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tulip_testkit import (
    FakeEngine,
    FakeInfo,
    ServerThread,
    decode_response,
    encode_request,
    first_tokens,
    make_config,
    marked_sequence,
    solo_embedding,
    wait_until,
)

from protos import embed_pb2
from rose.batch import Batch
from tulip.server import SERVICE_NAME


def check_batches_respect_budget(engine, max_tokens: int, max_seqs: int) -> None:
    for b in engine.batches:
        assert b.num_seqs <= max_seqs
        assert b.num_tokens <= max_tokens or b.num_seqs == 1


def random_request(rng: random.Random, i: int) -> embed_pb2.EmbedRequest:
    n_seqs = rng.randint(1, 4)
    seqs = [[rng.randrange(1000) for _ in range(rng.choice([1, 3, 17, 40, 90, 128]))] for _ in range(n_seqs)]
    spans = None
    if i % 4 == 0:  # late chunking: spans in shuffled order, over several sequences
        spans = []
        for s, seq in enumerate(seqs):  # 1-3 disjoint spans a sequence, gaps allowed (ROSE refuses overlaps)
            cuts = sorted(rng.sample(range(len(seq) + 1), min(len(seq) + 1, 2 * rng.randint(1, 3))))
            for start, end in zip(cuts[::2], cuts[1::2]):
                spans.append((s, start, end))
        rng.shuffle(spans)
    return encode_request(seqs, spans=spans, dimensions=rng.choice([0, 0, 4, 8, 16]),
                          normalize=rng.choice([None, True, False]), encoding=rng.choice([0, 0, 1, 2]),
                          request_id=f"r{i}")


def test_500_concurrent_mixed_requests_each_equal_their_solo_embedding() -> None:
    engine = FakeEngine()
    config = make_config(max_batch_tokens=96, max_batch_seqs=8)
    rng = random.Random(5)
    requests = [random_request(rng, i) for i in range(500)]
    with ServerThread(config, engine) as s:
        futures = [s.stub.Embed.future(r, timeout=120) for r in requests]
        for req, fut in zip(requests, futures):
            resp = fut.result()
            assert resp.tokens == len(np.frombuffer(req.token_ids, "<i4"))
            np.testing.assert_array_equal(decode_response(resp), solo_embedding(req), err_msg=req.request_id)
    check_batches_respect_budget(engine, 96, 8)
    assert engine.max_outstanding <= 2
    assert len(engine.batches) > 50  # many batches, so packing boundaries were crossed


def test_queue_order_is_observable_under_load() -> None:
    """Requests in arrival order, interleaved by the scheduler's rule (tulip/scheduler.py, RELIABILITY 30)."""
    engine = FakeEngine(gated=True)
    budget, max_seqs = 64, 4
    with ServerThread(make_config(max_batch_tokens=budget, max_batch_seqs=max_seqs), engine) as s:
        held = _hold_two_batches(s, engine)
        rng = random.Random(1)
        requests, futures = [], []
        for i in range(80):  # queued one at a time so that the arrival order is known
            first = 1 + sum(len(r) for r in requests)
            seqs = [marked_sequence(first + k, rng.randint(1, 40)) for k in range(rng.randint(1, 2))]
            want = s.server.queue.depth()[0] + len(seqs)
            futures.append(s.stub.Embed.future(encode_request(seqs), timeout=60))
            wait_until(lambda n=want: s.server.queue.depth()[0] == n, what="request queued")
            requests.append([(q[0], len(q)) for q in seqs])
        engine.release(10_000)
        for f in futures + held:
            f.result()
        queue = s.server.queue
        expected = interleaved_batches(requests, budget, max_seqs, queue.share_tokens, queue.share_seqs)
    got = [[int(x[0]) for x in np.split(b.token_ids, b.cu_seqlens[1:-1])] for b in engine.batches[2:]]
    assert got == expected
    assert first_tokens(engine)[2:] == [m for b in expected for m in b]
    # every request's own sequences reached the engine in their order
    seen = first_tokens(engine)
    assert all([seen.index(m) for m, _ in r] == sorted(seen.index(m) for m, _ in r) for r in requests)


def interleaved_batches(requests, budget: int, max_seqs: int, share_tokens: int, share_seqs: int) -> list[list[int]]:
    """The batches the scheduler's rule builds from `requests` (lists of (marker, length)) all queued before
    the first is taken: each request, oldest first, takes up to its share (at least one sequence), then the
    room left is filled in the same order; a request's next sequence that does not fit waits."""
    waiting = [list(r) for r in requests]
    batches = []
    while waiting:
        batch, tokens = [], 0
        for share in ((share_tokens, share_seqs), None):
            for req in waiting:
                got_tokens = got_seqs = 0
                while req and tokens < budget and len(batch) < max_seqs:
                    marker, n = req[0]
                    if batch and tokens + n > budget:
                        break
                    if share and got_seqs and (got_tokens + n > share[0] or got_seqs >= share[1]):
                        break
                    req.pop(0)
                    batch.append(marker)
                    tokens, got_tokens, got_seqs = tokens + n, got_tokens + n, got_seqs + 1
        waiting = [r for r in waiting if r]
        batches.append(batch)
    return batches


def _hold_two_batches(s: ServerThread, engine: FakeEngine):
    """Occupy both in-flight slots with gated batches (one request each), so later work stays queued."""
    held = []
    for i in range(2):
        held.append(s.stub.Embed.future(encode_request([marked_sequence(900 + i, 8)]), timeout=60))
        wait_until(lambda n=i + 1: engine.launched == n, what=f"batch {i + 1} launched")
    wait_until(lambda: s.server.worker.inflight == 2, what="two batches in flight")
    return held


def test_expired_deadline_never_reaches_the_engine() -> None:
    """RELIABILITY 14 and 15: a deadline shorter than the queued work ends DEADLINE_EXCEEDED promptly, its work
    never reaches the engine, and the next call is correct."""
    engine = FakeEngine(gated=True)
    with ServerThread(make_config(), engine) as s:
        held = _hold_two_batches(s, engine)
        doomed = s.stub.Embed.future(encode_request([marked_sequence(77, 10)]), timeout=0.2)
        with pytest.raises(grpc.RpcError) as err:
            doomed.result()
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        wait_until(lambda: s.server.queue.depth() == (0, 0), what="expired work removed from the queue")
        engine.release(100)
        [f.result() for f in held]
        after = encode_request([marked_sequence(78, 10)])
        np.testing.assert_array_equal(decode_response(s.stub.Embed(after, timeout=10)), solo_embedding(after))
    assert 77 not in first_tokens(engine) and 78 in first_tokens(engine)


def test_cancelled_rpc_is_dropped_and_neighbours_are_correct() -> None:
    """RELIABILITY 16 on Tulip's side: a cancelled call's sequences are dropped; its neighbours are correct."""
    engine = FakeEngine(gated=True)
    with ServerThread(make_config(), engine) as s:
        held = _hold_two_batches(s, engine)
        before = encode_request([marked_sequence(10, 5)])
        gone = encode_request([marked_sequence(11, 5), marked_sequence(12, 7)])
        after = encode_request([marked_sequence(13, 9)])
        f_before = s.stub.Embed.future(before, timeout=30)
        wait_until(lambda: s.server.queue.depth()[0] == 1)
        f_gone = s.stub.Embed.future(gone, timeout=30)
        wait_until(lambda: s.server.queue.depth()[0] == 3)
        f_after = s.stub.Embed.future(after, timeout=30)
        wait_until(lambda: s.server.queue.depth()[0] == 4)
        f_gone.cancel()
        wait_until(lambda: s.server.queue.depth()[0] == 2, what="cancelled work removed from the queue")
        engine.release(100)
        for req, fut in ((before, f_before), (after, f_after)):
            np.testing.assert_array_equal(decode_response(fut.result()), solo_embedding(req))
        [f.result() for f in held]
    seen = first_tokens(engine)
    assert 11 not in seen and 12 not in seen and seen.index(10) < seen.index(13)


def test_queue_bound_answers_resource_exhausted() -> None:
    engine = FakeEngine(gated=True)
    with ServerThread(make_config(max_batch_tokens=32, max_queue_tokens=64), engine) as s:
        held = _hold_two_batches(s, engine)
        queued = s.stub.Embed.future(encode_request([marked_sequence(1, 30), marked_sequence(2, 30)]))
        wait_until(lambda: s.server.queue.depth() == (2, 60))
        with pytest.raises(grpc.RpcError) as err:
            s.stub.Embed(encode_request([marked_sequence(3, 5)]), timeout=10)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "queue full" in err.value.details() and "max_queue_tokens 64" in err.value.details()
        assert ("tulip-reason", "queue_full") in err.value.trailing_metadata()
        engine.release(100)
        assert queued.result().rows == 2 and all(f.result().rows == 1 for f in held)


def test_message_size_limits() -> None:
    with ServerThread(make_config(max_message_mb=1), FakeEngine()) as s:
        too_big = encode_request([[1] * 100] * 3000)  # 1.2 MB of ids
        with pytest.raises(grpc.RpcError) as err:
            s.stub.Embed(too_big, timeout=10)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        many_rows = encode_request([[1]] * 20000)  # small request, 1.28 MB float32 response
        with pytest.raises(grpc.RpcError) as err:
            s.stub.Embed(many_rows, timeout=10)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "max_message_mb" in err.value.details()
        assert ("tulip-reason", "response_too_large") in err.value.trailing_metadata()
        ok = s.stub.Embed(encode_request([[1]] * 20000, encoding=2), timeout=30)  # binary fits
        assert ok.rows == 20000


def test_invalid_request_is_invalid_argument_and_replica_stays_up() -> None:
    with ServerThread(make_config(), FakeEngine()) as s:
        with pytest.raises(grpc.RpcError) as err:
            s.stub.Embed(encode_request([[1] * 200]), timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "max_length 128" in err.value.details()
        assert s.stub.Embed(encode_request([[1, 2]]), timeout=10).rows == 1


def test_info_and_health_follow_loading() -> None:
    engine = FakeEngine()
    config = make_config(served_model_name="served-name", warmup_full_batch="true", max_batch_tokens=256)
    s = ServerThread(config, engine, load=False)  # listening, model not loaded yet
    health = health_pb2_grpc.HealthStub(s.channel)
    try:
        for service in ("", SERVICE_NAME):
            assert health.Check(health_pb2.HealthCheckRequest(service=service)).status == \
                health_pb2.HealthCheckResponse.NOT_SERVING
        for call in (lambda: s.stub.Embed(encode_request([[1]]), timeout=5),
                     lambda: s.stub.Info(embed_pb2.InfoRequest(), timeout=5)):
            with pytest.raises(grpc.RpcError) as err:
                call()
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        s.run(s.server.load())
        assert engine.batches[0].num_tokens == 256  # the full-budget probe ran before SERVING
        for service in ("", SERVICE_NAME):
            assert health.Check(health_pb2.HealthCheckRequest(service=service)).status == \
                health_pb2.HealthCheckResponse.SERVING
        info = s.stub.Info(embed_pb2.InfoRequest(), timeout=5)
        want = FakeInfo()
        assert (info.model_id, info.family, info.max_length, info.dimensions, info.pooling) == \
            ("served-name", want.family, want.max_length, want.dimensions, want.pooling)
        assert info.tokenizer_fingerprint == want.tokenizer_fingerprint and info.native_dtype == "float32"
        assert info.normalized and info.max_batch_tokens == 256 and info.max_batch_seqs == 16
        assert info.attention_backend == "fake" and info.device == "cpu" and info.version
    finally:
        s.close()


def test_next_batch_is_packed_and_launched_while_the_engine_runs_the_previous_one() -> None:
    engine = FakeEngine(gated=True)
    with ServerThread(make_config(), engine) as s:
        first = s.stub.Embed.future(encode_request([marked_sequence(1, 8)]), timeout=30)
        wait_until(lambda: engine.launched == 1)
        second = s.stub.Embed.future(encode_request([marked_sequence(2, 8)]), timeout=30)
        # Batch 2 reaches the engine while batch 1 is still running on it: host packing is hidden.
        wait_until(lambda: engine.launched == 2, what="batch 2 launched behind batch 1")
        assert engine.completed == 0 and engine.launched_while_busy == 1
        third = s.stub.Embed.future(encode_request([marked_sequence(3, 8)]), timeout=30)
        wait_until(lambda: s.server.queue.depth()[0] == 1)
        assert s.server.worker.inflight == 2  # no third batch while two are in flight
        engine.release(1)
        wait_until(lambda: engine.launched == 3, what="batch 3 launched once batch 1 was delivered")
        assert engine.completed == 1 and first.result().rows == 1
        engine.release(2)
        assert second.result().rows == 1 and third.result().rows == 1
    assert engine.max_outstanding == 2 and engine.launched_while_busy == 2


def test_engine_failure_fails_only_its_batch() -> None:
    from tulip_testkit import fake

    def fail_when(batch):
        first = int(batch.token_ids[0])
        return {999: True, 998: fake.PinnedPoolExhausted("at cap")}.get(first)

    engine = FakeEngine(fail_when=fail_when)
    with ServerThread(make_config(), engine) as s:
        with pytest.raises(grpc.RpcError) as err:
            s.stub.Embed(encode_request([marked_sequence(999, 4)]), timeout=10)
        assert err.value.code() == grpc.StatusCode.INTERNAL
        with pytest.raises(grpc.RpcError) as err:
            s.stub.Embed(encode_request([marked_sequence(998, 4)]), timeout=10)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert ("tulip-reason", "engine_overloaded") in err.value.trailing_metadata()
        ok = encode_request([marked_sequence(5, 4)])
        np.testing.assert_array_equal(decode_response(s.stub.Embed(ok, timeout=10)), solo_embedding(ok))


def test_out_of_memory_at_launch_is_overload_and_the_replica_keeps_serving() -> None:
    """RELIABILITY 18 as torch raises it: torch.cuda.OutOfMemoryError from step() itself, not from the wait."""

    class OutOfMemoryError(RuntimeError):  # matched by name, as tulip.errors does for torch's (no torch here)
        pass

    engine = FakeEngine(raise_in_step=lambda b: OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB")
                        if int(b.token_ids[0]) == 997 else None)
    with ServerThread(make_config(), engine) as s:
        with pytest.raises(grpc.RpcError) as err:
            s.stub.Embed(encode_request([marked_sequence(997, 4)]), timeout=10)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert ("tulip-reason", "engine_overloaded") in err.value.trailing_metadata()
        health = health_pb2_grpc.HealthStub(s.channel)
        assert health.Check(health_pb2.HealthCheckRequest(service="")).status == \
            health_pb2.HealthCheckResponse.SERVING
        ok = encode_request([marked_sequence(5, 4)])
        np.testing.assert_array_equal(decode_response(s.stub.Embed(ok, timeout=10)), solo_embedding(ok))


def test_drain_answers_accepted_work_and_refuses_new() -> None:
    import asyncio

    engine = FakeEngine(gated=True)
    with ServerThread(make_config(), engine) as s:
        held = _hold_two_batches(s, engine)
        queued = s.stub.Embed.future(encode_request([marked_sequence(3, 8)]), timeout=30)
        wait_until(lambda: s.server.queue.depth()[0] == 1)
        drain = asyncio.run_coroutine_threadsafe(s.server.drain(), s.loop)
        health = health_pb2_grpc.HealthStub(s.channel)
        wait_until(lambda: health.Check(health_pb2.HealthCheckRequest(service="")).status ==
                   health_pb2.HealthCheckResponse.NOT_SERVING, what="NOT_SERVING at once")
        with pytest.raises(grpc.RpcError) as err:
            s.stub.Embed(encode_request([[1]]), timeout=5)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE and "shutting down" in err.value.details()
        engine.release(100)
        assert drain.result(30) is True
        assert queued.result().rows == 1 and all(f.result().rows == 1 for f in held)


def test_a_short_shutdown_timeout_still_waits_for_accepted_work() -> None:
    """shutdown_timeout_s of 0.5 or less (the config accepts it) kept all of it for the gRPC server's own stop
    and waited for nothing: accepted work still on the device was cut off and the drain reported failure. The
    stop's share is now a part of the timeout, not a fixed 0.5 s."""
    import asyncio

    engine = FakeEngine(gated=True)
    with ServerThread(make_config(shutdown_timeout_s=0.5), engine) as s:
        held = _hold_two_batches(s, engine)
        drain = asyncio.run_coroutine_threadsafe(s.server.drain(), s.loop)
        time.sleep(0.1)  # the device finishes within the drain's time, not before it began
        engine.release(100)
        assert drain.result(10) is True
        assert all(f.result().rows == 1 for f in held)


def test_metrics_endpoint_exports_queue_batch_and_engine_metrics() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with ServerThread(make_config(metrics_port=port), FakeEngine()) as s:
        s.stub.Embed(encode_request([[1, 2, 3]]), timeout=10)
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    for name in ("tulip_queue_sequences", "tulip_queue_tokens", "tulip_queue_wait_seconds_bucket",
                 "tulip_batch_sequences_bucket", "tulip_batch_tokens_sum", "tulip_batch_padded_tokens_sum",
                 "tulip_batch_seconds_bucket", 'tulip_requests_total{status="OK"} 1.0', "tulip_ready 1.0",
                 "rose_pinned_bytes_in_use", "rose_graphs_captured", 'rose_runs_total{bucket="t64",mode="eager"}',
                 "tulip_launch_hold_seconds_count", "tulip_idle_captures_total 0.0"):
        assert name in text, name


def test_worker_drops_a_job_whose_deadline_passed_before_it_was_packed() -> None:
    """The worker's own check, independent of gRPC cancelling the handler."""
    import asyncio
    import time

    from tulip.errors import DeadlineExpired
    from tulip.job import Job
    from tulip.request import RequestLimits, parse_embed_request
    from tulip.scheduler import SequenceQueue
    from tulip.worker import Worker

    engine = FakeEngine()
    queue = SequenceQueue(64, 8, 1024)
    worker = Worker(engine, queue)
    limits = RequestLimits(max_length=128, dimensions=16, pooling="mean")

    async def scenario():
        loop = asyncio.get_running_loop()
        late = Job(parse_embed_request(encode_request([marked_sequence(41, 4)]), limits), native_dimensions=16,
                   loop=loop, deadline=time.monotonic() - 1)
        live = Job(parse_embed_request(encode_request([marked_sequence(42, 4)]), limits), native_dimensions=16,
                   loop=loop)
        queue.push(late, late.sequences)
        queue.push(live, live.sequences)
        worker.start()
        with pytest.raises(DeadlineExpired):
            await asyncio.wait_for(late.future, 10)
        return await asyncio.wait_for(live.future, 10)

    result = asyncio.run(scenario())
    worker.stop(5)
    assert result.rows == 1 and first_tokens(engine) == [42]
    assert isinstance(engine.batches[0], Batch)
