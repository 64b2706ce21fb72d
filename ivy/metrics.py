"""Prometheus metrics: the gateway's series, their rendering for /metrics, and the replica series' removal (a
request's own record, and the ASGI layer that counts it: ivy.request_trace).

With several uvicorn workers `ivy serve` points PROMETHEUS_MULTIPROC_DIR at a fresh folder before the
workers start, so /metrics (answered by any worker) aggregates all of them (prometheus-client's
multiprocess mode). Labels are route templates and status codes only: no request content; and the replica
series' address, whose series go when the replica leaves (forget_replica, RELIABILITY 50).
"""

from __future__ import annotations

import os
import re
import warnings

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import REGISTRY


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


def request_children(route: str, status: int) -> tuple:
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


def observe_words(words: int, new: int) -> None:
    """The word cache's tallies of one tokenizer call."""
    TOKENIZER_WORDS.inc(words)
    if new:
        TOKENIZER_NEW_WORDS.inc(new)
