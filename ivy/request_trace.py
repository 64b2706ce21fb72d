"""A request's trace, and the outermost ASGI layer that records every request and hides crashes (RequestMetrics):
its request id (REQUEST_ID), its key in Tulip's queue (request_flow), where its time went (RequestTrace, answered as
timing headers) and its usage, counted into ivy.metrics' series once it is answered."""

from __future__ import annotations

import itertools
import logging
import os
import re
import time
import traceback
import uuid
from contextvars import ContextVar

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ivy.metrics import INPUTS, KNOWN_ROUTES, TOKENIZE_SECONDS, TOKENS, request_children

log = logging.getLogger("ivy")

REQUEST_ID: ContextVar[str] = ContextVar("ivy_request_id", default="")


class RequestTrace:
    """One request's record (set by RequestMetrics, shared with the request's child tasks): its usage, counted
    once it is answered with a 2xx (count_usage); whether a batch of it ran on a replica without its CUDA graph
    yet (answered as X-Cold-Start: 1, so a benchmark can report cold hits apart from the steady state), and
    where its time went, answered as text-embeddings-inference's timing headers in milliseconds (microsecond
    precision where TEI rounds to whole milliseconds):
      x-total-time         Ivy's time: the request's headers read -> the response's start
      x-tokenization-time  tokenizing, templating and id checks (pool threads included; a route that tokenizes
                           two groups at once, /similarity's, reports their sum)
      x-queue-time         Tulip: the request read -> its first batch launched
      x-inference-time     Tulip: that launch -> its last rows on the host
      x-batcher-time       Tulip: the request read -> its answer ready (queue, inference, output head)
    A request sent to Tulip in several calls (chunks: in parallel, in waves past chunks_in_flight) reports the
    three figures of the call that took longest in Tulip; a request that never reached Tulip, that Tulip
    refused or failed, or whose replica does not measure them (an older Tulip answers 0) sends only the first
    two, and a route that tokenizes nothing (GET /health, a body refused before it) only x-total-time."""

    __slots__ = ("start", "cold", "tokenize_s", "queue_us", "inference_us", "batcher_us", "usage", "flow")

    def __init__(self, start: float) -> None:
        self.start = start
        self.cold = False
        self.tokenize_s = 0.0
        self.queue_us = self.inference_us = self.batcher_us = 0  # 0: no Tulip answer that measured them
        self.usage: list[tuple[str, int, int]] = []  # count_usage's (route, inputs, tokens), until answered
        self.flow = ""  # request_flow's, made when the request first calls a replica

    def count_usage(self) -> None:
        """The request answered: what count_usage held for it goes into ivy_inputs and ivy_tokens."""
        for route, inputs, tokens in self.usage:
            INPUTS.labels(route).inc(inputs)
            TOKENS.labels(route).inc(tokens)
        self.usage.clear()

    def headers(self, now: float) -> list[tuple[bytes, bytes]]:
        out = [(b"x-total-time", b"%.3f" % ((now - self.start) * 1e3))]
        if self.tokenize_s:
            out.append((b"x-tokenization-time", b"%.3f" % (self.tokenize_s * 1e3)))
        if self.batcher_us:
            out += [(b"x-queue-time", b"%.3f" % (self.queue_us / 1e3)),
                    (b"x-inference-time", b"%.3f" % (self.inference_us / 1e3)),
                    (b"x-batcher-time", b"%.3f" % (self.batcher_us / 1e3))]
        if self.cold:
            out.append(COLD_HEADER)
        return out


_TRACE: ContextVar[RequestTrace | None] = ContextVar("ivy_trace", default=None)
COLD_HEADER = (b"x-cold-start", b"1")


_FLOWS = itertools.count(1)


def _flow_prefix() -> str:
    """This process's part of its flow keys: its id and a random salt (made again in a forked child)."""
    global _FLOW_PREFIX
    _FLOW_PREFIX = f"{os.getpid():x}.{uuid.uuid4().hex[:12]}."
    return _FLOW_PREFIX


_FLOW_PREFIX = _flow_prefix()
os.register_at_fork(after_in_child=_flow_prefix)


def request_flow() -> str:
    """The current request's key in Tulip's queue (EmbedRequest.flow), the same for every call it makes, so its
    chunks wait as one request; never the client's X-Request-Id, which any number of requests may carry (sharing
    a key would join unrelated requests into one, and one that never empties would hold its place ahead of
    older requests: tulip/packer.py). Unique among every gateway's requests: process id, a random salt, a count.
    Outside a request, a new key each call."""
    trace = _TRACE.get()
    if trace is None:
        return f"{_FLOW_PREFIX}0.{next(_FLOWS)}"
    if not trace.flow:
        trace.flow = f"{_FLOW_PREFIX}{next(_FLOWS)}"
    return trace.flow


def note_backend(response) -> None:
    """A replica's EmbedResponse for the current request: its cold flag, and Tulip's timings when this call took
    longer in Tulip than any before it (the three figures of one call, never mixed across calls). A batcher_us
    of 0 is a replica that does not measure them."""
    trace = _TRACE.get()
    if trace is None:
        return
    if response.cold:
        trace.cold = True
    if response.batcher_us > trace.batcher_us:
        trace.queue_us, trace.inference_us, trace.batcher_us = (response.queue_us, response.inference_us,
                                                                response.batcher_us)


def count_usage(route: str, inputs: int, tokens: int) -> None:
    """ivy_inputs and ivy_tokens of the current request, counted when it is answered with a 2xx (RequestMetrics):
    a route that tokenizes before its replica call (ivy.routes_embeddings' encode_inputs) counts nothing for a
    request the replicas then fail or the client leaves, as its usage reports nothing. Outside a request, at once."""
    trace = _TRACE.get()
    if trace is None:
        INPUTS.labels(route).inc(inputs)
        TOKENS.labels(route).inc(tokens)
    else:
        trace.usage.append((route, inputs, tokens))


def observe_tokenize(seconds: float) -> None:
    """One tokenizer call's time: added to the current request's (its x-tokenization-time, and the histogram's one
    sample, taken when the request ends: a score request's queries and documents are two calls, one request);
    outside a request, a sample of its own."""
    trace = _TRACE.get()
    if trace is None:
        TOKENIZE_SECONDS.observe(seconds)
    else:
        trace.tokenize_s += seconds


_REQUEST_ID_OK = re.compile(r"[A-Za-z0-9._:@/+=-]{1,128}")


def request_id_of(scope: Scope) -> str:
    """The caller's X-Request-Id when it is a sane token (so traces join across services), else a new one."""
    for key, value in scope.get("headers", ()):
        if key == b"x-request-id":
            text = value.decode("latin-1")
            if _REQUEST_ID_OK.fullmatch(text):
                return text
            break
    return uuid.uuid4().hex


class RequestMetrics:
    """Pure ASGI middleware: counts and times requests; tags each with a request id (echoed as X-Request-Id,
    sent to Tulip with every chunk, via the REQUEST_ID context variable); turns an unexpected exception
    into the OpenAI 500 body and logs its traceback without the exception message (which could quote
    request text)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        route = path if path in KNOWN_ROUTES else "other"
        rid = request_id_of(scope)
        REQUEST_ID.set(rid)  # this task's context: the route handler runs in it
        trace = RequestTrace(time.perf_counter())
        _TRACE.set(trace)
        rid_header = (b"x-request-id", rid.encode("latin-1"))
        status = 500
        started = False

        async def send_wrapper(message: Message) -> None:
            nonlocal status, started
            if message["type"] == "http.response.start":
                status = message["status"]
                started = True
                if 200 <= status < 300:  # before the answer leaves: a scrape after it sees the request counted
                    trace.count_usage()
                message = {**message, "headers": [*message.get("headers", ()), rid_header,
                                                  *trace.headers(time.perf_counter())]}
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        except Exception as exc:  # noqa: BLE001 - last line of defence; never leak details
            log.error("unhandled %s on %s:\n%s", type(exc).__name__, route,
                      "".join(traceback.format_tb(exc.__traceback__)))
            if not started:
                body = orjson.dumps({"error": {"message": "internal error", "type": "server_error",
                                               "param": None, "code": "internal_error"}})
                await send({"type": "http.response.start", "status": 500,
                            "headers": [(b"content-type", b"application/json"),
                                        (b"content-length", str(len(body)).encode()), rid_header]})
                await send({"type": "http.response.body", "body": body})
            status = 500
        finally:
            requests, seconds = request_children(route, status)
            requests.inc()
            seconds.observe(time.perf_counter() - trace.start)
            if trace.tokenize_s:
                TOKENIZE_SECONDS.observe(trace.tokenize_s)
