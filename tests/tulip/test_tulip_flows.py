"""Which requests wait as one in Tulip's queue: those that share a non-empty EmbedRequest.flow (the chunks of one
Ivy request), never those that merely share a request_id (a client's X-Request-Id, for logs only), RELIABILITY 59."""

import pytest
from tulip_testkit import (FakeEngine, ServerThread, encode_request, first_tokens, make_config, marked_sequence,
                           wait_until)

from test_tulip_server import _hold_two_batches


def _order(flows: tuple[str, str], request_ids: tuple[str, str]) -> list[int]:
    """Markers in launch order after a long request (12 sequences, markers 1-12) and a one-sequence request (marker
    100) are queued behind two held batches, with the given flows and request ids."""
    engine = FakeEngine(gated=True)
    with ServerThread(make_config(max_batch_tokens=64, max_batch_seqs=4), engine) as s:
        held = _hold_two_batches(s, engine)
        futures = []
        for seqs, flow, rid in (([marked_sequence(m, 10) for m in range(1, 13)], flows[0], request_ids[0]),
                                ([marked_sequence(100, 10)], flows[1], request_ids[1])):
            want = s.server.queue.depth()[0] + len(seqs)
            request = encode_request(seqs, request_id=rid)
            request.flow = flow
            futures.append(s.stub.Embed.future(request, timeout=60))
            wait_until(lambda n=want: s.server.queue.depth()[0] == n, what="request queued")
        engine.release(10_000)
        for f in futures + held:
            f.result()
        return first_tokens(engine)[2:]


@pytest.mark.parametrize("request_ids", [("trace-1", "trace-1"), ("", "")])
def test_a_shared_request_id_is_not_a_shared_place(request_ids) -> None:
    order = _order(("", ""), request_ids)
    assert order.index(100) < 4  # its own request: it rides in the first batch beside the long one's share


def test_a_shared_flow_waits_as_one_request() -> None:
    order = _order(("ivy-flow-7", "ivy-flow-7"), ("a", "b"))
    assert order.index(100) == 12  # the same request's next sequence: after the 12 queued before it
