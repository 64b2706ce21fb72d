"""Prometheus metrics, and the outermost ASGI layer that records every request and hides crashes.

With several uvicorn workers `ivy serve` points PROMETHEUS_MULTIPROC_DIR at a fresh folder before the
workers start, so /metrics (answered by any worker) aggregates all of them (prometheus-client's
multiprocess mode). Labels are route templates and status codes only: no request content; and the replica
series' address, whose series go when the replica leaves (forget_replica, RELIABILITY 50).
"""

from __future__ import annotations

import itertools
import logging
import os
import re
import time
import traceback
import uuid
import warnings
from contextvars import ContextVar

import orjson
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import REGISTRY
from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("ivy")

_LATENCY = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

REQUESTS = Counter("ivy_requests", "HTTP requests by route and status", ["route", "status"])
REQUEST_SECONDS = Histogram("ivy_request_seconds", "HTTP request latency", ["route"], buckets=_LATENCY)
IN_FLIGHT = Gauge("ivy_requests_in_flight", "Inference requests admitted and not finished",
                  multiprocess_mode="livesum")
INPUTS = Counter("ivy_inputs", "Inputs of requests answered: texts, id lists, chunks, documents embedded; "
                 "scoring counts the request's texts, queries and documents, whatever the model (a cross-encoder's "
                 "pairs included)", ["route"])
TOKENS = Counter("ivy_tokens", "Tokens sent to replicas for requests answered (what usage reports; a request "
                 "refused or failed counts none)", ["route"])
TOKENIZE_SECONDS = Histogram("ivy_tokenize_seconds", "Templating + tokenization time per request", buckets=_LATENCY)
TOKENIZER_WORDS = Counter("ivy_tokenizer_words", "Words of ASCII texts looked up in the tokenizer's word cache "
                          "(BERT-family tokenizers: rose/word_cache.py)")
TOKENIZER_NEW_WORDS = Counter("ivy_tokenizer_new_words", "Distinct words per call not in the word cache, encoded by "
                              "`tokenizers` (their share of ivy_tokenizer_words: the cache's miss rate)")
GRPC_SECONDS = Histogram("ivy_grpc_seconds", "Embed RPC latency per chunk", ["replica"], buckets=_LATENCY)
CHUNKS = Counter("ivy_chunks", "gRPC chunks sent, by replica", ["replica"])
COALESCED = Histogram("ivy_requests_per_call", "Requests sharing one gRPC call (ivy/coalesce.py)",
                      buckets=(1, 2, 4, 8, 16, 32, 64))
RETRIES = Counter("ivy_chunk_retries", "Chunks retried on another replica", ["reason"])
CLIENT_SHARE_REFUSALS = Counter("ivy_client_share_refusals", "Requests refused (429) because their client held its "
                                "share of a worker's request slots after another client was refused as full "
                                "(IVY_CLIENT_SHARE)")
CONNECTIONS_REFUSED = Counter("ivy_connections_refused", "Connections answered and closed by ivy.connections' limits "
                              "(header_too_large, header_timeout, connection_cap, send_timeout; drain_too_large, "
                              "drain_timeout: the rest of a body answered early; idle_evicted: the connection idle "
                              "longest, closed to make room over the cap; probe_only, probe_timeout, probe_evicted: "
                              "503 in the probe reserve over a busy cap)", ["reason"])
REPLICA_UP = Gauge("ivy_replica_up", "1 when the replica is SERVING the expected model", ["replica"],
                   multiprocess_mode="livemax")
REPLICA_GONE = -1.0  # ivy_replica_up of a replica gone from DNS: below 0 and 1, so a worker that still routes
# to it wins the max; its series are left out of /metrics (render)
OUTSTANDING = Gauge("ivy_replica_outstanding_tokens", "Tokens sent to a replica and not answered", ["replica"],
                    multiprocess_mode="livesum")
REPLICA_SERIES = (REPLICA_UP, OUTSTANDING, CHUNKS, GRPC_SECONDS)  # every metric labelled by a replica's address
REPLICAS = Gauge("ivy_replicas", "Tulip replicas routed to (configured, or resolved from DNS)",
                 multiprocess_mode="livemax")
REPLICAS_SERVING = Gauge("ivy_replicas_serving", "Replicas SERVING the expected model (the fewest any worker sees)",
                         multiprocess_mode="livemin")
DEGRADED = Gauge("ivy_degraded", "1 while ready with some replica not serving (/ready says degraded)",
                 multiprocess_mode="livemax")

GC_PAUSE = Histogram("ivy_gc_pause_seconds", "Pauses of the cyclic garbage collector (the worker's requests wait), "
                     "by generation", ["generation"], buckets=(0.0001, 0.00025, 0.0005) + _LATENCY)
_GC_PAUSE = [GC_PAUSE.labels(str(g)) for g in range(3)]


def observe_gc_pause(generation: int, seconds: float) -> None:
    _GC_PAUSE[generation].observe(seconds)


KNOWN_ROUTES = {"/v1/embeddings", "/v1/contextualizedembeddings", "/v1/score", "/v1/rerank", "/v2/rerank", "/v1/models",
                "/embed", "/embed_sparse", "/embed_multi_vector", "/tokenize", "/health", "/ready", "/metrics",
                "/rerank", "/score", "/embeddings", "/similarity", "/decode", "/detokenize", "/v2/embed", "/v1/embed",
                "/info", "/pooling", "/predict", "/classify", "/"}  # from /rerank: the peers' paths (POST /: TEI's /embed)


_REQUEST_CHILDREN: dict[tuple[str, int], tuple] = {}


def _request_children(route: str, status: int) -> tuple:
    """(requests counter, latency histogram) for a route and status, resolved once per pair."""
    key = (route, status)
    children = _REQUEST_CHILDREN.get(key)
    if children is None:
        children = _REQUEST_CHILDREN[key] = (REQUESTS.labels(route, str(status)), REQUEST_SECONDS.labels(route))
    return children


def render() -> tuple[bytes, str]:
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        _forget_dead_workers(os.environ["PROMETHEUS_MULTIPROC_DIR"])
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return generate_latest(_LiveReplicasOnly(registry)), CONTENT_TYPE_LATEST
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST


_LIVE_FILE = re.compile(r"^gauge_live[a-z]*_(\d+)\.db$")


def _forget_dead_workers(folder: str) -> None:
    """A worker uvicorn restarted (killed, crashed) leaves its live gauges' files, which every scrape still read:
    its last ivy_replica_up of 1 kept a replica gone from DNS in /metrics for good (RELIABILITY 50). The files of
    a process no longer alive are dropped, as prometheus-client's mark_process_dead does."""
    from prometheus_client import multiprocess

    try:
        names = os.listdir(folder)
    except OSError:
        return
    for pid in {int(m[1]) for m in map(_LIVE_FILE.match, names) if m}:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            multiprocess.mark_process_dead(pid, folder)
        except PermissionError:
            pass  # alive, another user's


def forget_replica(address: str) -> None:
    """A replica gone for good (left DNS: a rolled pod's IP): its series leave /metrics (RELIABILITY 50), or a
    cluster whose Tulip pods roll would grow them without bound, and an up series left at 0 would read as a replica
    down (the TulipReplicaDown alert) after every rollout. With one worker its children are removed. With several
    (multiprocess mode) they cannot be: each worker's values live in its own mmap file (counter_PID.db, ...), which
    prometheus-client only appends to (remove() drops the worker's child object, warns, and leaves the entry, which
    every scrape then reads). So its up gauge is set to REPLICA_GONE and render() leaves out every series of an
    address whose up gauge is REPLICA_GONE in every live worker (_LiveReplicasOnly); what stays is the entries
    themselves, ~2.8 KB an address a worker (measured: 1000 addresses, 2.8 MB), until the worker restarts. An
    address that comes back (pod IPs are reused) takes its entries back, so they are bounded by the addresses the
    Service's pods can get (the pod CIDRs of the nodes Tulip runs on: ~250 a node)."""
    REPLICA_UP.labels(address).set(REPLICA_GONE)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # multiprocess mode's "not implemented": known, handled above
        for metric in REPLICA_SERIES:
            metric.remove(address)


class _LiveReplicasOnly:
    """A registry's metrics without the series of replicas every live worker has forgotten (ivy_replica_up at
    REPLICA_GONE: forget_replica). A replica some worker still routes to keeps its series, all workers' summed."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def collect(self):
        families = list(self.registry.collect())
        live = {s.labels["replica"] for family in families if family.name == REPLICA_UP._name
                for s in family.samples if s.value != REPLICA_GONE}
        for family in families:
            family.samples = [s for s in family.samples if s.labels.get("replica", "") in live
                              or "replica" not in s.labels]
            yield family


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


def observe_words(words: int, new: int) -> None:
    """The word cache's tallies of one tokenizer call."""
    TOKENIZER_WORDS.inc(words)
    if new:
        TOKENIZER_NEW_WORDS.inc(new)


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
            requests, seconds = _request_children(route, status)
            requests.inc()
            seconds.observe(time.perf_counter() - trace.start)
            if trace.tokenize_s:
                TOKENIZE_SECONDS.observe(trace.tokenize_s)
