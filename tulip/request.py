"""From the wire to work: validate an EmbedRequest and split it into sequences with their spans (and token types).

The one place where protos' packed bytes become numpy arrays (views, no copies). Every check raises
InvalidRequest naming the field and the limit, or ResponseTooLarge before any work is queued. Error
messages carry positions and counts, never token ids' values beyond the offending one's range check.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from rose.batch import sequence_spans
from rose.head import Encoding, OutputOptions
from rose.spec import find_output
from tulip.errors import InvalidRequest, ResponseTooLarge

_RESPONSE_OVERHEAD_BYTES = 64  # proto framing of the scalar fields around the embeddings bytes


@dataclass(frozen=True)
class RequestLimits:
    max_length: int  # longest sequence the model takes
    dimensions: int  # native embedding width
    pooling: str  # the model's pooling when a request has no spans
    vocab_size: int = 0  # ids must be < vocab_size; 0 = unknown, unchecked
    max_response_bytes: int = 0  # 0 = unchecked
    type_vocab_size: int = 1  # token types must be < type_vocab_size (BERT cross-encoders: 2)
    outputs: tuple = ()  # rose.spec.Output per output of the native row; () = one output of `dimensions`


@dataclass(frozen=True)
class ParsedRequest:
    sequences: list[np.ndarray]  # int32 ids of each sequence to embed
    spans: list[np.ndarray]  # int32 [k, 2] relative spans per sequence
    rows: list[np.ndarray]  # int64 [k] output row of each span
    num_rows: int
    num_tokens: int  # tokens of the sequences that are embedded
    options: OutputOptions
    token_types: list[np.ndarray] | None = None  # uint8 per sequence, as `sequences`; None = type 0
    columns: tuple[int, int] | None = None  # (start, width) of the requested output in the native row; None = all
    normalize_default: bool | None = None  # that output's own default; None = the model's


def _int32_field(data: bytes, name: str, width: int = 4) -> np.ndarray:
    if len(data) % width:
        raise InvalidRequest(f"{name} has {len(data)} bytes; expected a multiple of {width} (int32 little-endian)")
    return np.frombuffer(data, dtype="<i4")


_ROWS = np.arange(4096, dtype=np.int64).reshape(-1, 1)  # read-only views: one output row per sequence
_ROWS.flags.writeable = False


def _row(i: int) -> np.ndarray:
    return _ROWS[i] if i < _ROWS.shape[0] else np.array([i], dtype=np.int64)


@functools.lru_cache(maxsize=4096)
def _whole_sequence_span(length: int, pooling: str) -> np.ndarray:
    """The [1, 2] relative span that pools a whole sequence of `length` tokens (cached, read-only)."""
    span = sequence_spans(np.zeros(1, dtype=np.int64), np.array([length]), pooling)
    span.flags.writeable = False
    return span


def bytes_per_row(dimensions: int, encoding: Encoding) -> int:
    if encoding == Encoding.INT8:
        return dimensions
    if encoding == Encoding.BINARY:
        return (dimensions + 7) // 8
    return dimensions * 4


def parse_embed_request(request, limits: RequestLimits) -> ParsedRequest:
    ids = _int32_field(request.token_ids, "token_ids")
    lens = _int32_field(request.seq_lens, "seq_lens")
    if lens.size == 0:
        raise InvalidRequest("seq_lens is empty: send at least one sequence")
    # Checks are two reductions each (min/max); the offending index is only looked for on failure.
    lens_list = lens.tolist()
    if min(lens_list) < 1:
        i = int(np.flatnonzero(lens < 1)[0])
        raise InvalidRequest(f"seq_lens[{i}] = {lens[i]}; every sequence needs at least one token")
    if max(lens_list) > limits.max_length:
        i = int(np.flatnonzero(lens > limits.max_length)[0])
        raise InvalidRequest(f"seq_lens[{i}] = {lens[i]} exceeds the model's max_length {limits.max_length}")
    total = sum(lens_list)
    if total != ids.size:
        raise InvalidRequest(f"sum(seq_lens) = {total} but token_ids holds {ids.size} ids")
    if limits.vocab_size and ids.size and (ids.min() < 0 or ids.max() >= limits.vocab_size):
        out_of_range = np.flatnonzero((ids < 0) | (ids >= limits.vocab_size))
        raise InvalidRequest(f"token_ids[{out_of_range[0]}] is outside the vocabulary [0, {limits.vocab_size})")

    try:
        encoding = Encoding(request.encoding)
    except ValueError:
        raise InvalidRequest(f"encoding = {request.encoding} is not one of "
                             f"{[e.value for e in Encoding]}") from None
    chosen = _output(str(getattr(request, "output", "")), limits.outputs)
    width = chosen.width if chosen is not None else limits.dimensions
    dims = int(request.dimensions)
    if dims > width:
        raise InvalidRequest(f"dimensions = {dims} exceeds the model's {width}")
    normalize = request.normalize if request.HasField("normalize") else None
    options = OutputOptions(dimensions=dims, normalize=normalize, encoding=encoding)

    types = _token_types(request.token_types, ids.size, limits.type_vocab_size)
    sequences, type_rows, start = [], [], 0
    for n in lens_list:
        sequences.append(ids[start:start + n])
        if types is not None:
            type_rows.append(types[start:start + n])
        start += n

    if request.spans:
        triples = _int32_field(request.spans, "spans", width=12).reshape(-1, 3)
        if triples.shape[0] == 0:
            raise InvalidRequest("spans is empty")
        seq, begin, end = triples[:, 0], triples[:, 1], triples[:, 2]
        seq_ok = (seq >= 0) & (seq < lens.size)
        seq_len = np.where(seq_ok, lens[np.clip(seq, 0, lens.size - 1)], 0)
        bad = np.flatnonzero(~seq_ok | (begin < 0) | (begin >= end) | (end > seq_len))
        if bad.size:
            i = bad[0]
            if not seq_ok[i]:
                raise InvalidRequest(f"spans[{i}] names sequence {seq[i]}; the request has {lens.size}")
            raise InvalidRequest(f"spans[{i}] = [{begin[i]}, {end[i]}) is not a non-empty range "
                                 f"inside sequence {seq[i]} of length {seq_len[i]}")
        counts = np.bincount(seq, minlength=lens.size)
        over = np.flatnonzero(counts > lens)  # a row per token at most (late chunking, token vectors): the rows'
        if over.size:  # memory stays proportional to the tokens the queue counts
            i = over[0]
            raise InvalidRequest(f"spans: sequence {i} has {counts[i]} spans but {lens[i]} tokens; at most one "
                                 "span per token")
        by_start = np.lexsort((begin, seq))  # overlapping spans fail ROSE's whole batch (pack_batch), every
        a, b = by_start[:-1], by_start[1:]     # neighbour's request with it: refused here, this request alone
        clash = np.flatnonzero((seq[a] == seq[b]) & (begin[b] < end[a]))
        if clash.size:
            i, j = sorted((int(a[clash[0]]), int(b[clash[0]])))
            raise InvalidRequest(f"spans[{j}] = [{begin[j]}, {end[j]}) overlaps spans[{i}] = [{begin[i]}, {end[i]}) "
                                 f"in sequence {seq[i]}: each token pools into at most one row")
        order = np.argsort(seq, kind="stable")  # rows grouped by sequence, span order kept within one
        groups = np.split(order, np.cumsum(counts)[:-1])
        pairs = triples[:, 1:].astype(np.int32)
        keep = [i for i in range(lens.size) if counts[i]]  # a sequence without a span is not embedded
        parsed_seqs = [sequences[i] for i in keep]
        type_rows = [type_rows[i] for i in keep] if types is not None else type_rows
        parsed_spans = [pairs[groups[i]] for i in keep]
        parsed_rows = [groups[i].astype(np.int64) for i in keep]
        num_rows = int(triples.shape[0])
        num_tokens = int(lens[keep].sum(dtype=np.int64))
    else:
        parsed_seqs = sequences
        parsed_spans = [_whole_sequence_span(n, limits.pooling) for n in lens_list]
        parsed_rows = [_row(i) for i in range(lens.size)]
        num_rows = int(lens.size)
        num_tokens = total

    if limits.max_response_bytes:
        size = num_rows * bytes_per_row(dims or width, encoding) + _RESPONSE_OVERHEAD_BYTES
        if size > limits.max_response_bytes:
            raise ResponseTooLarge(
                f"the response would be {size} bytes ({num_rows} rows); the message limit is "
                f"{limits.max_response_bytes} bytes (max_message_mb): send fewer sequences per request")
    return ParsedRequest(sequences=parsed_seqs, spans=parsed_spans, rows=parsed_rows,
                         num_rows=num_rows, num_tokens=num_tokens, options=options,
                         token_types=type_rows if types is not None else None,
                         columns=(chosen.start, chosen.width) if chosen is not None else None,
                         normalize_default=chosen.normalize if chosen is not None else None)


def _output(name: str, outputs: tuple):
    """The requested output of the model's (None: a model with one output, all its columns); unknown refused."""
    if not outputs:
        if name not in ("", "embed"):
            raise InvalidRequest(f"output = {name!r}: this model has one output, 'embed'")
        return None
    found = find_output(outputs, name)
    if found is None:
        raise InvalidRequest(f"output = {name!r} is not one of this model's {[o.name for o in outputs]}")
    return found


def _token_types(data: bytes, num_ids: int, limit: int) -> np.ndarray | None:
    """The optional uint8 token type per id; refused when its length or a value breaks the model's limit."""
    if not data:
        return None
    types = np.frombuffer(data, dtype=np.uint8)
    if types.size != num_ids:
        raise InvalidRequest(f"token_types has {types.size} bytes; expected one per token id ({num_ids})")
    if types.size and int(types.max()) >= limit:
        i = int(np.flatnonzero(types >= limit)[0])
        raise InvalidRequest(f"token_types[{i}] = {types[i]}; this model takes token types below {limit}")
    return types
