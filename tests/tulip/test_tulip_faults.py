"""Faults inside one replica: a failed batch drops the rest of its request."""

import grpc
import numpy as np
import pytest
from tulip_testkit import (
    FakeEngine,
    ServerThread,
    decode_response,
    encode_request,
    make_config,
    marked_sequence,
    solo_embedding,
    wait_until,
)


def first_tokens(engine) -> list[int]:
    return [int(s[0]) for s in engine.seen_sequences()]


def test_failed_batch_cancels_the_rest_of_its_request() -> None:
    """RELIABILITY 36: a request whose batch failed in the engine is answered with the error, and its
    sequences still queued never run; the next request is correct."""
    engine = FakeEngine(gated=True, fail_when=lambda b: int(b.token_ids[0]) == 999)
    with ServerThread(make_config(max_batch_tokens=32, max_inflight_batches=2), engine) as s:
        seqs = [marked_sequence(999, 30), marked_sequence(2, 30), marked_sequence(3, 30)]
        doomed = s.stub.Embed.future(encode_request(seqs), timeout=30)
        # [999] and [2] are on the "device", [3] waits in the queue
        wait_until(lambda: engine.launched == 2 and s.server.queue.depth()[0] == 1, what="two batches launched")
        engine.release(1)  # the batch [999] fails
        with pytest.raises(grpc.RpcError) as err:
            doomed.result()
        assert err.value.code() == grpc.StatusCode.INTERNAL
        wait_until(lambda: s.server.queue.depth() == (0, 0), what="the failed request's work left the queue")
        after = encode_request([marked_sequence(5, 4)])
        answer = s.stub.Embed.future(after, timeout=30)
        engine.release(100)
        np.testing.assert_array_equal(decode_response(answer.result()), solo_embedding(after))
    assert 3 not in first_tokens(engine) and 5 in first_tokens(engine)
