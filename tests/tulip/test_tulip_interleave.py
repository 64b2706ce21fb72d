"""RELIABILITY 30 through the server: a maximum-size request does not hold a small one behind it."""

import numpy as np
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


def test_a_small_request_behind_a_huge_one_is_in_the_next_batch() -> None:
    engine = FakeEngine(gated=True)
    with ServerThread(make_config(max_batch_tokens=256, max_batch_seqs=16), engine) as s:
        huge = encode_request([marked_sequence(100 + i, 64) for i in range(64)], request_id="huge")  # 16 full batches
        big = s.stub.Embed.future(huge, timeout=60)
        wait_until(lambda: engine.launched == 2, what="two of the huge request's batches on the device")
        small = encode_request([marked_sequence(7, 1)], request_id="small")
        quick = s.stub.Embed.future(small, timeout=60)
        wait_until(lambda: s.server.queue.depth()[0] == 64 - 8 + 1, what="the small request queued")
        engine.release(1)  # the first batch completes: the next one is packed
        wait_until(lambda: engine.launched == 3, what="the next batch launched")
        third = engine.batches[2]
        assert 7 in third.token_ids[third.cu_seqlens[:-1]].tolist()  # a sequence's first token is its marker
        assert third.num_tokens == 3 * 64 + 1  # and the huge request filled what room was left
        engine.release(2)
        np.testing.assert_array_equal(decode_response(quick.result()), solo_embedding(small))
        assert s.server.queue.depth()[0] > 40  # while most of the huge request still waits
        engine.release(100)
        np.testing.assert_array_equal(decode_response(big.result()), solo_embedding(huge))
