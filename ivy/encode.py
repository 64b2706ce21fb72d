"""Output encodings: which wire encoding to ask Tulip for, and how each row goes into the JSON body.

float -> a JSON list of float32 values; base64 -> little-endian float32 bytes (what the openai client
decodes), or vLLM's `embed_dtype` (float16, bfloat16, fp8_e4m3, fp8_e5m2) and `endianness` (`base64_dtype`), the
bytes torch's cast writes; base64_int8 -> signed
int8 bytes; base64_binary -> 1 bit per dimension, least significant bit
first (Perplexity's layout). Tulip already applied Matryoshka truncation, normalization and quantization
(rose.head), so Ivy only reshapes bytes here.
"""

from __future__ import annotations

import base64
import sys
from collections.abc import Sequence
from itertools import chain
from typing import Any

import numpy as np

from ivy.errors import IvyError, Problem
from protos import embed_pb2
from rose.head import Encoding

WIRE_ENCODING = {
    "float": Encoding.FLOAT32,
    "base64": Encoding.FLOAT32,
    "base64_int8": Encoding.INT8,
    "base64_binary": Encoding.BINARY,
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
                  encoding: Encoding | int, request_id: str,
                  spans: Sequence[Sequence[tuple[int, int]]] | None = None, lane: int = 0,
                  token_types: Sequence[Sequence[int]] | None = None, output: str = "") -> embed_pb2.EmbedRequest:
    """One Embed call's request: `seqs` (holding `tokens` ids) packed little-endian int32, with optional
    (sequence, start, end) span triples and token types (one uint8 per id, cross-encoder pairs); `output`: which
    of the model's outputs (rose.retrieval_spec; "" = its first)."""
    req = embed_pb2.EmbedRequest(
        token_ids=packed_ids(seqs, tokens),
        seq_lens=np.fromiter(map(len, seqs), dtype="<i4", count=len(seqs)).tobytes(),
        dimensions=dimensions, encoding=int(encoding), request_id=request_id, lane=lane, output=output)
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


BFLOAT16 = ("<bf2", ">bf2")  # numpy has no bfloat16: its bytes are made by hand (_bfloat16_bytes)
# numpy has no fp8 either (_fp8_bytes): torch's float8_e4m3fn and float8_e5m2 as (mantissa bits, least normal
# exponent, the code of anything past the largest finite value: e4m3fn saturates at 448 as torch casts, e5m2 is inf)
_FP8 = {"e4m3": (3, -6, 0x7E), "e5m2": (2, -14, 0x7C)}


_ORDER = {"native": "<" if sys.byteorder == "little" else ">", "little": "<", "big": ">"}
_BASE64_DTYPES = {(dtype, order): mark + code for dtype, code in (("float32", "f4"), ("float16", "f2"),
                                                                   ("bfloat16", "bf2"), ("fp8_e4m3", "e4m3"),
                                                                   ("fp8_e5m2", "e5m2"))
                  for order, mark in _ORDER.items()}  # one byte a value: fp8's order changes nothing


def base64_dtype(embed_dtype: str = "float32", endianness: str = "native") -> str:
    """The bytes of a base64 row for vLLM's embed_dtype (float32, float16, bfloat16, fp8_e4m3, fp8_e5m2) and
    endianness (native = this server's, little, big): a numpy dtype string, one of BFLOAT16, or an order mark and
    a key of _FP8."""
    return _BASE64_DTYPES[embed_dtype, endianness]


def wire_dtype(fmt: str, embed_dtype: str | None, endianness: str | None, *, sent: bool = True) -> str:
    """A request's base64 bytes (base64_dtype; omitted fields are vLLM's defaults). embed_dtype is base64's
    only: with base64_int8 or base64_binary sent as encoding_format, whose bytes the format sets, another than
    float32 is a 422 naming it; with float (vLLM's default, where vLLM ignores it), or a model's own default format
    (`sent` false: pplx-embed's base64_int8), it is ignored."""
    if sent and embed_dtype not in (None, "float32") and fmt in ("base64_int8", "base64_binary"):
        raise IvyError(Problem.INVALID_PARAMETER, f"embed_dtype applies to encoding_format base64 only; {fmt} has "
                       "its own bytes (send float32 or omit it)", param="embed_dtype")
    return _BASE64_DTYPES[embed_dtype or "float32", endianness or "native"]


def _bfloat16_bytes(row: np.ndarray, dtype: str) -> bytes:
    """float32 -> bfloat16 as torch's `.to(torch.bfloat16)` casts it (vLLM's embed_dtype): round to nearest, ties
    to even; the upper 16 bits of the rounded float32 (rows hold no NaN: Tulip fails such a batch)."""
    bits = np.ascontiguousarray(row, dtype=np.float32).view(np.uint32)
    rounded = ((bits + (0x7FFF + ((bits >> 16) & 1))) >> 16).astype(np.uint16)
    return rounded.astype(dtype[0] + "u2", copy=False).tobytes()


def _fp8_bytes(row: np.ndarray, kind: str) -> bytes:
    """float32 -> fp8 (`kind` of _FP8) as torch's `.to(torch.float8_e4m3fn / float8_e5m2)` casts it: round to
    nearest, ties to even, subnormals kept, past the largest finite value _FP8's code; the sign bit on top. A
    value's code is its exponent's steps above the least, then its rounded mantissa, so a carry out of the
    mantissa is the next exponent's first code and the codes grow with the magnitude (14 µs a 1024-wide row on
    this VM, against bfloat16's 6.6)."""
    mantissa, least, above = _FP8[kind]
    x = np.asarray(row, dtype=np.float32)
    a = np.abs(x)
    finite = np.isfinite(a).all()
    if not finite:  # as torch casts them: NaN 0x7F, an infinity what is past the largest finite value
        nan, a = np.isnan(a), np.where(np.isfinite(a), a, 0)
    exponent = np.frexp(np.maximum(a, np.float32(2.0 ** least)))[1] - 1  # the subnormals' is the least
    units = np.rint(np.ldexp(a, mantissa - exponent)).astype(np.int32)  # exact scaling, then ties to even
    code = np.minimum(((exponent - least) << mantissa) + units, above)
    if not finite:
        code[np.isinf(x)] = above
        code[nan] = 0x7F
    return (code | (np.signbit(x) << 7)).astype(np.uint8).tobytes()


def row_value(row: np.ndarray, fmt: str, dtype: str = "<f4") -> Any:
    """One row as its JSON value (orjson serializes the numpy float32 array as a list); `dtype`: base64's bytes
    (base64_dtype)."""
    if fmt == "float":
        return row if row.dtype == np.float32 else row.astype(np.float32)
    if fmt == "base64":
        if dtype in BFLOAT16:
            raw = _bfloat16_bytes(row, dtype)
        elif dtype[1:] in _FP8:
            raw = _fp8_bytes(row, dtype[1:])
        elif dtype[1:] == "f2":
            with np.errstate(over="ignore"):  # |x| over 65504 is inf in float16, as torch casts it
                raw = np.ascontiguousarray(row, dtype=dtype).tobytes()
        else:
            raw = np.ascontiguousarray(row, dtype=dtype).tobytes()
        return base64.b64encode(raw).decode("ascii")
    return base64.b64encode(np.ascontiguousarray(row).tobytes()).decode("ascii")
