"""Output encodings: which wire encoding to ask Tulip for, and how each row goes into the JSON body.

float -> a JSON list of float32 values; base64 -> little-endian float32 bytes (what the openai client
decodes), or vLLM's `embed_dtype` and `endianness` (ivy.embed_dtypes); base64_int8 -> signed int8 bytes;
base64_binary -> 1 bit per dimension, least significant bit first (Perplexity's layout); vLLM's bytes and
bytes_only -> no JSON: every row's base64 bytes back to back (ivy.routes_embeddings.bytes_answer). Tulip already
applied Matryoshka truncation, normalization and quantization (rose.head), so Ivy only reshapes bytes here.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from itertools import chain
from typing import Any

import numpy as np

from ivy.embed_dtypes import value_bytes
from ivy.errors import IvyError, Problem
from protos import embed_pb2
from rose.head import Encoding

WIRE_ENCODING = {
    "float": Encoding.FLOAT32,
    "base64": Encoding.FLOAT32,
    "base64_int8": Encoding.INT8,
    "base64_binary": Encoding.BINARY,
    "bytes": Encoding.FLOAT32,
    "bytes_only": Encoding.FLOAT32,
}


def default_format(native_int8: bool) -> str:
    """float, except for models whose native output is int8 (pplx-embed), which Perplexity serves as base64_int8."""
    return "base64_int8" if native_int8 else "float"


def decode_rows(response: embed_pb2.EmbedResponse) -> np.ndarray:
    """The response's rows as float32 [rows, d], int8 [rows, d] or uint8 [rows, ceil(d/8)]."""
    rows, dims = int(response.rows), int(response.dimensions)
    enc = Encoding(response.encoding)
    if enc == Encoding.FLOAT32:
        arr = np.frombuffer(response.embeddings, dtype="<f4").astype(np.float32, copy=False)
        width = dims
    elif enc == Encoding.INT8:
        arr = np.frombuffer(response.embeddings, dtype=np.int8)
        width = dims
    else:
        arr = np.frombuffer(response.embeddings, dtype=np.uint8)
        width = (dims + 7) // 8
    if arr.size != rows * width:
        raise ValueError(f"replica sent {arr.size} values for {rows} rows of width {width}")
    return arr.reshape(rows, width)


def embed_request(seqs: Sequence[Sequence[int]], tokens: int, *, dimensions: int, normalize: bool | None,
                  encoding: Encoding | int, request_id: str, flow: str = "",
                  spans: Sequence[Sequence[tuple[int, int]]] | None = None, lane: int = 0,
                  token_types: Sequence[Sequence[int]] | None = None, output: str = "") -> embed_pb2.EmbedRequest:
    """One Embed call's request: `seqs` (holding `tokens` ids) packed little-endian int32, with optional
    (sequence, start, end) span triples and token types (one uint8 per id, cross-encoder pairs); `output`: which
    of the model's outputs (rose.spec ModelSpec.outputs; "" = its first); `flow`: the calls that share it wait as one
    request in Tulip's queue (ivy.request_trace.request_flow; "" = this call alone)."""
    req = embed_pb2.EmbedRequest(
        token_ids=packed_ids(seqs, tokens),
        seq_lens=np.fromiter(map(len, seqs), dtype="<i4", count=len(seqs)).tobytes(),
        dimensions=dimensions, encoding=int(encoding), request_id=request_id, lane=lane, output=output,
        flow=flow)
    if normalize is not None:
        req.normalize = normalize
    if spans is not None:
        triples = [(k, start, end) for k, doc in enumerate(spans) for start, end in doc]
        req.spans = np.asarray(triples, dtype="<i4").reshape(-1).tobytes()
    if token_types is not None:
        req.token_types = np.fromiter(chain.from_iterable(token_types), dtype=np.uint8, count=tokens).tobytes()
    return req


def packed_ids(seqs: Sequence[Sequence[int]], tokens: int) -> bytes:
    """The sequences' `tokens` ids as little-endian int32 bytes: arrays (token ids a client sent, checked by
    ivy.tokenization) are joined as they are; lists (a tokenizer's) are flattened by chain.from_iterable in C,
    not a Python loop per token. At 4096 ids the arrays' path skips reading 4096 Python ints a second time:
    -115 µs a request on the H200 host (benchmarks/NOTES.md, "Token ids in the gateway")."""
    if seqs and all(isinstance(s, np.ndarray) for s in seqs):
        joined = np.concatenate(seqs).astype("<i4", copy=False)
        if joined.size != tokens:
            raise ValueError(f"{joined.size} ids where {tokens} were counted")
        return joined.tobytes()
    return np.fromiter(chain.from_iterable(seqs), dtype="<i4", count=tokens).tobytes()


def checked_rows(response: embed_pb2.EmbedResponse, expected: int) -> np.ndarray:
    """decode_rows, refusing an answer with another row count than the request asked for."""
    rows = decode_rows(response)
    if rows.shape[0] != expected:
        raise IvyError(Problem.BACKEND_ERROR, f"a replica returned {rows.shape[0]} rows for {expected}")
    return rows


def row_value(row: np.ndarray, fmt: str, dtype: str = "<f4") -> Any:
    """One row as its JSON value (orjson serializes the numpy float32 array as a list); `dtype`: base64's values
    (ivy.embed_dtypes.wire_dtype)."""
    if fmt == "float":
        return row if row.dtype == np.float32 else row.astype(np.float32)
    if fmt == "base64":
        return base64.b64encode(value_bytes(row, dtype)).decode("ascii")
    return base64.b64encode(np.ascontiguousarray(row).tobytes()).decode("ascii")
