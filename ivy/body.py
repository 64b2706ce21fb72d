"""Reading a request body safely: size cap before parsing, bounded decompression, UTF-8, JSON, schema.

The cap applies to what the server holds in memory: a declared Content-Length over it is refused
before a byte is read; a streamed (chunked) body is counted as it arrives and refused as soon as it
passes the cap; a gzip or deflate body is kept compressed until all of it is in (a stalled socket holds its
wire size, never its inflated size: RELIABILITY 32), then inflated in bounded steps and refused when the
inflated size passes the cap (RELIABILITY cases 4, 5, 8, 9). Memory stays at about one cap per request, and
the bodies one worker holds while reading them are capped together (BODIES, --body-bytes-in-flight: RELIABILITY 46).
"""

from __future__ import annotations

import asyncio
import difflib
import functools
import gc
import types
import typing
import zlib
from collections.abc import Callable
from typing import Any, TypeVar

import orjson
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect, Request

from ivy.errors import IvyError, Problem, from_validation_errors
from ivy.peer_fields import PEER_ALIASES

M = TypeVar("M", bound=BaseModel)

_ZLIB_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


class BodyBudget:
    """Bytes of request bodies this worker holds while reading them, and their cap (0: none). Requests count
    against the concurrency cap only once their bodies are in, so without this many clients each uploading a
    body under the payload limit (each within the body timeout) could take the worker's memory; over it a body
    is refused with 429 and Retry-After, as the concurrency cap refuses work (RELIABILITY 46)."""

    def __init__(self, cap: int = 0) -> None:
        self.cap, self.held = cap, 0

    def take(self, nbytes: int) -> None:
        if self.cap and self.held + nbytes > self.cap:
            raise IvyError(Problem.OVERLOADED, f"the server holds its limit of {self.cap} bytes of request bodies "
                           "being read; retry later", limit=self.cap)
        self.held += nbytes

    def give(self, nbytes: int) -> None:
        self.held -= nbytes


BODIES = BodyBudget()  # this process's; its cap set by configure() (create_app, which every worker runs)


def configure(config) -> None:
    BODIES.cap = config.body_bytes_in_flight


def _too_large(limit: int, what: str = "request body") -> IvyError:
    return IvyError(Problem.PAYLOAD_TOO_LARGE, f"the {what} is larger than the limit of {limit} bytes",
                    param="body", limit=limit)


class _Inflater:
    """Incremental gzip/deflate decoder that never produces more than `limit` bytes in total. A gzip body may
    hold several members back to back (RFC 1952), each inflated in turn; anything else after the end of a
    stream, or a stream without its end, is refused as corrupt (never a part of the body silently dropped)."""

    def __init__(self, encoding: str, limit: int) -> None:
        self._wbits = _ZLIB_WBITS[encoding]
        self._raw_deflate = encoding == "deflate"
        self._obj = zlib.decompressobj(self._wbits)
        self._limit = limit
        self._size = 0
        self._parts: list[bytes] = []

    def feed(self, data: bytes) -> None:
        try:
            while data:
                if self._obj.eof:  # a stream ended with more to come: only gzip's next member may follow
                    if self._wbits != _ZLIB_WBITS["gzip"]:
                        raise zlib.error("data after the end of the deflate stream")
                    self._obj = zlib.decompressobj(self._wbits)
                out = self._obj.decompress(data, self._limit + 1 - self._size)
                self._take(out)
                data = self._obj.unused_data if self._obj.eof else self._obj.unconsumed_tail
        except zlib.error:
            if self._raw_deflate and self._size == 0 and not self._parts:
                # Some clients send raw DEFLATE (no zlib header) as "deflate": retry that way once.
                self._raw_deflate = False
                self._obj = zlib.decompressobj(-zlib.MAX_WBITS)
                self.feed(data)
                return
            raise IvyError(Problem.INVALID_JSON, "the compressed body is corrupt", param="body") from None

    def _take(self, out: bytes) -> None:
        self._size += len(out)
        if self._size > self._limit:
            raise _too_large(self._limit, "decompressed request body")
        self._parts.append(out)

    def finish(self) -> bytes:
        try:
            self._take(self._obj.flush())
        except zlib.error:
            raise IvyError(Problem.INVALID_JSON, "the compressed body is corrupt", param="body") from None
        if not self._obj.eof:
            raise IvyError(Problem.INVALID_JSON, "the compressed body is truncated", param="body")
        return b"".join(self._parts)


async def read_body(request: Request, limit: int, timeout_s: float | None = None) -> bytes:
    """The body, decompressed, at most `limit` bytes, or IvyError 413 before anything is parsed; 408 when
    the whole body has not arrived within `timeout_s` (a client trickling bytes holds no slot for long)."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            declared_bytes = int(declared)
        except ValueError:
            raise IvyError(Problem.INVALID_JSON, "Content-Length is not a number", param="body") from None
        if declared_bytes > limit:
            raise _too_large(limit)
    else:
        declared_bytes = None
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("", "identity") and encoding not in _ZLIB_WBITS:
        raise IvyError(Problem.UNSUPPORTED_ENCODING, "this Content-Encoding is not supported; "
                       "use gzip, deflate or none", param="content-encoding")
    inflater = _Inflater(encoding, limit) if encoding in _ZLIB_WBITS else None
    first = b""  # most bodies arrive in one chunk, kept as is
    more: bytearray | None = None  # later chunks appended in place: no object per chunk held
    received = held = 0
    if declared_bytes is not None:  # reserved whole before a byte is read: an admitted body never fails midway
        BODIES.take(declared_bytes)
        held = declared_bytes
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                if received + len(chunk) > limit:  # the wire size is capped too: a compressed body is never bigger
                    raise _too_large(limit)
                if declared_bytes is None:  # chunked: counted as it arrives
                    BODIES.take(len(chunk))
                    held += len(chunk)
                received += len(chunk)
                if more is not None:
                    more += chunk
                elif first:
                    more = bytearray(first) + chunk
                else:
                    first = chunk
    except ClientDisconnect:
        raise IvyError(Problem.CLIENT_CLOSED, "the client closed the connection") from None
    except TimeoutError:
        raise IvyError(Problem.BODY_TIMEOUT, f"the request body did not arrive within {timeout_s:g} s",
                       param="body", limit=timeout_s) from None
    finally:
        BODIES.give(held)  # what follows runs without a wait: parsed before another request's body grows
    raw = first if more is None else bytes(more)
    if inflater is None:
        return raw
    inflater.feed(raw)  # only now, all of it in: inflated memory is never held across a wait
    return inflater.finish()


# Bodies larger than this are parsed with the garbage collector off: 2 MB of one-id lists took 180 ms with it on,
# 60 ms off (this project's CPU), the collections' passes over the young lists being most of it; a body of long
# texts makes few objects and gains nothing.
_NO_GC_ABOVE = 64 * 1024


def parse_json(raw: bytes) -> Any:
    """UTF-8 check first (400), then JSON syntax (400); a lone surrogate escape counts as invalid UTF-8."""
    if raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise IvyError(Problem.INVALID_UTF8, f"the body is not valid UTF-8 (byte {exc.start})", param="body") from None
    if not raw.strip():
        raise IvyError(Problem.INVALID_JSON, "the body is empty; send a JSON object", param="body")
    collecting = len(raw) > _NO_GC_ABOVE and gc.isenabled()
    if collecting:  # a body of many small items would run the collector over them every ~700 (RELIABILITY 3)
        gc.disable()
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        if "surrogate" in str(exc):
            raise IvyError(Problem.INVALID_UTF8, "the body contains an unpaired UTF-16 surrogate escape",
                           param="body") from None
        raise IvyError(Problem.INVALID_JSON, f"the body is not valid JSON ({exc.msg} at char {exc.pos})",
                       param="body") from None
    finally:
        if collecting:
            gc.enable()


def check_misspelled_fields(data: Any, model: type[BaseModel]) -> None:
    """Unknown fields are ignored, as other servers and SDKs send their own (OpenAI-style clients pass
    `user`, vendor extras); but one that is a near miss of a field we serve ("dimension") would be silently
    ignored too and change the answer, so it is a 422 naming the field we think was meant. A field that is a
    body model itself (/similarity's `parameters`, where TEI's clients put truncate and truncation_direction)
    is checked the same way, the field named by its path (`parameters.truncation_side`)."""
    _check_keys(data, model, "", [_KEYS_COMPARED])


_KEYS_COMPARED = 16  # bounded work on the event loop, whatever the body holds: at most 16 short keys compared


def _check_keys(data: Any, model: type[BaseModel], prefix: str, left: list[int]) -> None:
    """check_misspelled_fields for `data` against `model`, then its nested body models; `left`: the comparisons
    the whole body may still make (one budget over every level)."""
    if not isinstance(data, dict):
        return
    known = set(model.model_fields)
    longest = max(map(len, known))
    for key in data:
        if not isinstance(key, str) or key in known or key in PEER_ALIASES or len(key) > longest + 3:
            continue
        if left[0] <= 0:
            return
        close = difflib.get_close_matches(key, known, n=1, cutoff=0.8)
        if close:  # never the client's key in the message; the field meant may be there too (input and inputs)
            meant = prefix + close[0]
            message = (f"the body has {meant!r} and also a field close to it that is not served; remove that field"
                       if close[0] in data else f"the body has a field that is not served but is close to {meant!r} "
                       f"(a misspelling?); rename it to {meant!r} or remove it")
            raise IvyError(Problem.INVALID_PARAMETER, message, param=meant)
        left[0] -= 1
    for name, nested in _nested_models(model):
        _check_keys(data.get(name), nested, f"{prefix}{name}.", left)


@functools.cache
def _nested_models(model: type[BaseModel]) -> tuple[tuple[str, type[BaseModel]], ...]:
    """(field, model) of each field whose type is a body model, alone or with None (`X | None`)."""
    found = []
    for name, info in model.model_fields.items():
        kind = info.annotation
        members = typing.get_args(kind) if typing.get_origin(kind) in (typing.Union, types.UnionType) else (kind,)
        models = [m for m in members if isinstance(m, type) and issubclass(m, BaseModel)]
        if len(models) == 1:
            found.append((name, models[0]))
    return tuple(found)


async def read_model(request: Request, model: type[M] | Callable[[Any], type[M]], limit: int,
                     timeout_s: float | None = None) -> M:
    """The body validated against `model`, or against the model `model(data)` chooses from the parsed JSON
    (a route that takes two peers' shapes: POST /rerank)."""
    data = parse_json(await read_body(request, limit, timeout_s))
    if not isinstance(model, type):
        model = model(data)
    check_misspelled_fields(data, model)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise from_validation_errors(exc.errors(include_input=False, include_url=False)) from None
