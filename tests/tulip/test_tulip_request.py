"""Request validation: every bad field gets INVALID_ARGUMENT naming the field and the limit."""

import numpy as np
import pytest

from protos import embed_pb2
from rose.head import Encoding
from tulip.errors import InvalidRequest, ResponseTooLarge
from tulip.request import RequestLimits, parse_embed_request

LIMITS = RequestLimits(max_length=16, dimensions=8, pooling="mean", vocab_size=100, max_response_bytes=10_000)


def i32(*values) -> bytes:
    return np.asarray(values, dtype="<i4").tobytes()


def req(ids=(1, 2, 3), lens=(3,), **kw) -> embed_pb2.EmbedRequest:
    return embed_pb2.EmbedRequest(token_ids=i32(*ids), seq_lens=i32(*lens), **kw)


@pytest.mark.parametrize("request_, message", [
    (embed_pb2.EmbedRequest(token_ids=b"\x01\x00\x00", seq_lens=i32(1)), r"token_ids has 3 bytes"),
    (req(ids=(), lens=()), r"seq_lens is empty"),
    (req(lens=(3, 0)), r"seq_lens\[1\] = 0"),
    (req(ids=tuple(range(17)), lens=(17,)), r"seq_lens\[0\] = 17 exceeds the model's max_length 16"),
    (req(lens=(2,)), r"sum\(seq_lens\) = 2 but token_ids holds 3 ids"),
    (req(ids=(1, 100, 3)), r"token_ids\[1\] is outside the vocabulary \[0, 100\)"),
    (req(ids=(1, -5, 3)), r"token_ids\[1\] is outside"),
    (req(dimensions=9), r"dimensions = 9 exceeds the model's 8"),
    (req(encoding=7), r"encoding = 7 is not one of"),
    (req(spans=i32(0, 0)), r"spans has 8 bytes; expected a multiple of 12"),
    (req(spans=i32(1, 0, 1)), r"spans\[0\] names sequence 1; the request has 1"),
    (req(spans=i32(0, 0, 2, 0, 2, 2)), r"spans\[1\] = \[2, 2\) is not a non-empty range inside sequence 0 of length 3"),
    (req(spans=i32(0, 1, 4)), r"spans\[0\] = \[1, 4\)"),
    # more rows than tokens: 1.3 M spans on one token passed every check and made 5 GB of rows for a 1024-wide model
    (req(spans=i32(0, 0, 1, 0, 0, 1, 0, 1, 2, 0, 0, 1)), r"sequence 0 has 4 spans but 3 tokens"),
])
def test_invalid_requests_name_the_field_and_limit(request_, message) -> None:
    with pytest.raises(InvalidRequest, match=message):
        parse_embed_request(request_, LIMITS)


def test_response_size_is_checked_before_any_work() -> None:
    limits = RequestLimits(max_length=16, dimensions=8, pooling="mean", max_response_bytes=200)
    many = req(ids=tuple(range(10)), lens=(1,) * 10)
    with pytest.raises(ResponseTooLarge, match=r"10 rows.*max_message_mb"):
        parse_embed_request(many, limits)
    # The same rows fit as int8 (8 bytes a row) or binary.
    parse_embed_request(req(ids=tuple(range(10)), lens=(1,) * 10, encoding=Encoding.INT8), limits)


def test_spans_are_grouped_by_sequence_and_keep_response_order() -> None:
    r = req(ids=(1, 2, 3, 4, 5), lens=(2, 3), spans=i32(1, 1, 3, 0, 0, 1, 1, 0, 1, 0, 1, 2))
    p = parse_embed_request(r, LIMITS)
    assert p.num_rows == 4 and p.num_tokens == 5
    assert [s.tolist() for s in p.spans] == [[[0, 1], [1, 2]], [[1, 3], [0, 1]]]
    assert [r.tolist() for r in p.rows] == [[1, 3], [0, 2]]


@pytest.mark.parametrize("spans, message", [
    (i32(0, 0, 3, 0, 1, 4), r"spans\[1\] = \[1, 4\) overlaps spans\[0\] = \[0, 3\) in sequence 0"),
    (i32(0, 0, 2, 0, 0, 2), r"spans\[1\] = \[0, 2\) overlaps spans\[0\] = \[0, 2\)"),
    (i32(0, 2, 4, 1, 0, 1, 0, 0, 3), r"spans\[2\] = \[0, 3\) overlaps spans\[0\] = \[2, 4\)"),  # not in order
])
def test_overlapping_spans_are_refused_naming_them(spans, message) -> None:
    """ROSE's pack_batch refuses a batch whose spans overlap, so such a request, admitted, failed every request
    batched with it (INTERNAL for its neighbours): it is an INVALID_ARGUMENT of its own at admission."""
    with pytest.raises(InvalidRequest, match=message):
        parse_embed_request(req(ids=(1, 2, 3, 4, 5, 6), lens=(4, 2), spans=spans), LIMITS)
    touching = i32(0, 0, 2, 0, 2, 4, 1, 0, 2)  # [0, 2) and [2, 4) touch, and another sequence's [0, 2): fine
    assert parse_embed_request(req(ids=(1, 2, 3, 4, 5, 6), lens=(4, 2), spans=touching), LIMITS).num_rows == 3


def test_sequence_without_span_is_not_embedded() -> None:
    p = parse_embed_request(req(ids=(1, 2, 3), lens=(1, 2), spans=i32(1, 0, 2)), LIMITS)
    assert len(p.sequences) == 1 and p.sequences[0].tolist() == [2, 3] and p.num_tokens == 2


def test_plain_request_uses_model_pooling() -> None:
    cls_limits = RequestLimits(max_length=16, dimensions=8, pooling="cls")
    p = parse_embed_request(req(ids=(1, 2, 3, 4), lens=(3, 1)), cls_limits)
    assert [s.tolist() for s in p.spans] == [[[0, 1]], [[0, 1]]]
    assert p.options.normalize is None and p.options.dimensions == 0
    p = parse_embed_request(req(normalize=False, dimensions=4), LIMITS)
    assert p.options.normalize is False and p.options.dimensions == 4


def test_token_types_are_sliced_per_sequence_and_checked() -> None:
    pairs = RequestLimits(max_length=16, dimensions=1, pooling="cls", vocab_size=100, type_vocab_size=2)
    r = req(ids=(1, 2, 3, 4, 5), lens=(2, 3), token_types=bytes([0, 1, 0, 0, 1]))
    p = parse_embed_request(r, pairs)
    assert [t.tolist() for t in p.token_types] == [[0, 1], [0, 0, 1]]
    assert parse_embed_request(req(), pairs).token_types is None  # absent: type 0 everywhere
    spanned = parse_embed_request(req(ids=(1, 2, 3), lens=(1, 2), spans=i32(1, 0, 2), token_types=bytes([1, 0, 1])),
                                  pairs)
    assert [t.tolist() for t in spanned.token_types] == [[0, 1]]  # kept with the sequences that are embedded
    with pytest.raises(InvalidRequest, match=r"token_types has 2 bytes; expected one per token id \(3\)"):
        parse_embed_request(req(token_types=bytes([0, 1])), pairs)
    with pytest.raises(InvalidRequest, match=r"token_types\[2\] = 2; this model takes token types below 2"):
        parse_embed_request(req(token_types=bytes([0, 1, 2])), pairs)
    with pytest.raises(InvalidRequest, match=r"token_types\[1\] = 1; this model takes token types below 1"):
        parse_embed_request(req(token_types=bytes([0, 1, 0])), LIMITS)  # most models: type 0 only
