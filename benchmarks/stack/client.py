"""HTTP client for a deployed stack or a peer: one keep-alive connection (standard
library, ivy/http_connection.py), client-side wall time per call.

Route styles:
- `ours`: embeddings on POST /v1/embeddings, scoring on POST /v1/rerank {"model", "query", "documents"}
  (the Cohere/Jina shape Ivy serves).
- `openai`: only POST /v1/embeddings (text-embeddings-inference, vLLM, ...). Scoring embeds the query
  and the documents in one request and scores by cosine on the client, inside the timed section.

The timed section covers sending, the server, reading the body and decoding it (orjson when installed;
base64 for embeddings): what a real client waits for. Tokens come from the response's `usage.prompt_tokens`
when the server reports it, else from the client-side count passed in.
"""

from __future__ import annotations

import base64
import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ivy.http_connection import Connection, HTTPError

try:  # orjson is the gateway's dependency and much faster; the client also runs without it
    import orjson

    _dumps, _loads = orjson.dumps, orjson.loads
except ImportError:  # pragma: no cover - exercised only where orjson is missing
    import json

    _dumps, _loads = (lambda obj: json.dumps(obj).encode()), json.loads

ROUTE_STYLES = ("ours", "openai")
MAX_LENGTH_KEYS = ("max_model_len", "max_input_length", "max_length", "max_seq_len", "max_tokens",
                   "context_length", "max_position_embeddings")


class StackError(RuntimeError):
    """The server answered something a benchmark cannot use (an HTTP error or a malformed body)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Sample:
    """One timed request: when it started, how long it took, how many items and tokens it carried."""

    start_s: float
    latency_s: float
    items: int
    tokens: int
    tokens_from_usage: bool
    ok: bool = True
    cold: bool = False  # the server said it met a graph layout without its graph (reported apart)
    timing: tuple[float, ...] | None = None  # the server's own account, ms: TIMING_KEYS (nan where not sent)
    client_cpu_s: float | None = None  # this client thread's CPU time for the request (encode, parse, decode)


# The server's timing headers (ivy.request_trace.RequestTrace; text-embeddings-inference sends the first four), as the
# record's `server_timing_p50_ms` keys: Ivy's whole time, its tokenizing, and Tulip's queue, inference and whole.
TIMING_HEADERS = {"ivy_total": "x-total-time", "tokenization": "x-tokenization-time", "queue": "x-queue-time",
                  "inference": "x-inference-time", "batcher": "x-batcher-time"}
TIMING_KEYS = tuple(TIMING_HEADERS)


def timing_of(headers: dict[str, str]) -> tuple[float, ...] | None:
    """The timing headers of one response, ms in TIMING_KEYS order (nan where absent); None without any."""
    values = tuple(_ms(headers.get(name)) for name in TIMING_HEADERS.values())
    return None if all(v != v for v in values) else values


def _ms(text: str | None) -> float:
    try:
        return float(text) if text is not None else float("nan")
    except ValueError:
        return float("nan")


def decode_embedding(item: Any) -> np.ndarray:
    """An embedding from either encoding: a list of floats or base64 little-endian float32."""
    if isinstance(item, str):
        return np.frombuffer(base64.b64decode(item), dtype="<f4")
    return np.asarray(item, dtype=np.float32)


def cosine_scores(query: np.ndarray, docs: np.ndarray) -> np.ndarray:
    q = query / max(float(np.linalg.norm(query)), 1e-12)
    d = docs / np.maximum(np.linalg.norm(docs, axis=1, keepdims=True), 1e-12)
    return d @ q


class StackClient:
    """A synchronous client, one per process or thread; every call returns a `Sample`."""

    def __init__(self, url: str, model: str, route_style: str = "ours", encoding_format: str = "base64",
                 api_key: str | None = None, timeout_s: float = 60.0) -> None:
        if route_style not in ROUTE_STYLES:
            raise ValueError(f"route style must be one of {ROUTE_STYLES}, not {route_style!r}")
        self.model = model
        self.route_style = route_style
        self.last_cold = False
        self.last_timing: tuple[float, ...] | None = None
        self.encoding_format = encoding_format
        headers = {"content-type": "application/json"}
        if api_key:
            headers["authorization"] = f"Bearer {api_key}"
        self.http = Connection(url, headers, timeout_s)

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> "StackClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        response = self.http.post(path, content=_dumps(body))
        self.last_cold = response.cold
        self.last_timing = timing_of(response.headers)
        if response.status_code != 200:
            raise StackError(f"POST {path} -> {response.status_code}: {response.text[:300]}",
                             response.status_code)
        try:
            return _loads(response.content)
        except ValueError as exc:  # orjson's and json's decode errors are ValueErrors
            raise StackError(f"POST {path} returned a body that is not JSON: {exc}") from None

    def get_json(self, path: str) -> dict[str, Any] | None:
        try:
            response = self.http.get(path)
        except HTTPError:
            return None
        if response.status_code != 200:
            return None
        try:
            return _loads(response.content)
        except ValueError:
            return None

    @staticmethod
    def _usage_tokens(body: dict[str, Any]) -> int | None:
        usage = body.get("usage") or {}
        tokens = usage.get("prompt_tokens", usage.get("total_tokens"))
        return int(tokens) if isinstance(tokens, (int, float)) and tokens > 0 else None

    def embeddings(self, texts: list[str] | Sequence[Sequence[int]], encoding_format: str | None = None,
                   priority: str | None = None) -> tuple[np.ndarray, int | None]:
        """Embed texts or token-id lists (`input` takes both): the matrix and the usage tokens. `priority`
        (ours: the lane, "interactive" | "bulk") is sent only when given."""
        request = {"model": self.model, "input": texts, "encoding_format": encoding_format or self.encoding_format}
        if priority is not None:
            request["priority"] = priority
        body = self._post("/v1/embeddings", request)
        data = body.get("data")
        if not isinstance(data, list) or len(data) != len(texts):
            raise StackError(f"/v1/embeddings returned {len(data) if isinstance(data, list) else 'no'} "
                             f"embeddings for {len(texts)} inputs")
        data = sorted(data, key=lambda d: d.get("index", 0))
        return np.stack([decode_embedding(d["embedding"]) for d in data]), self._usage_tokens(body)

    def embed_ids(self, seqs: Sequence[Sequence[int]], client_tokens: int, score: bool = False) -> Sample:
        """One timed /v1/embeddings request with token-id lists; `score`: seqs[0] is a query scored
        against the rest by client-side cosine, inside the timed section."""
        start, cpu = time.perf_counter(), time.thread_time()
        matrix, tokens = self.embeddings(seqs)
        if score:
            cosine_scores(matrix[0], matrix[1:])
        return self._sample(start, cpu, len(seqs) - score, tokens, client_tokens)

    def score_route(self, ids: bool) -> str:
        """How score-latency is measured on this client (recorded as the record's `route`)."""
        if ids:
            return "/v1/embeddings, query + documents as one token-id batch, + client cosine"
        return "/v1/rerank" if self.route_style == "ours" else "/v1/embeddings + cosine"

    def embed(self, texts: list[str], client_tokens: int, priority: str | None = None) -> Sample:
        """One timed embeddings request (in the `priority` lane when given)."""
        start, cpu = time.perf_counter(), time.thread_time()
        _, tokens = self.embeddings(texts, priority=priority)
        return self._sample(start, cpu, len(texts), tokens, client_tokens)

    def score(self, query: str, documents: list[str], client_tokens: int) -> Sample:
        """One timed scoring request: /v1/rerank for `ours`, embed + client cosine for `openai`."""
        start, cpu = time.perf_counter(), time.thread_time()
        if self.route_style == "ours":
            body = self._post("/v1/rerank", {"model": self.model, "query": query, "documents": documents})
            results = body.get("results", body.get("data"))
            if not isinstance(results, list) or len(results) != len(documents):
                raise StackError(f"/v1/rerank returned {len(results) if isinstance(results, list) else 'no'}"
                                 f" results for {len(documents)} documents")
            tokens = self._usage_tokens(body)
        else:
            matrix, tokens = self.embeddings([query, *documents])
            cosine_scores(matrix[0], matrix[1:])
        return self._sample(start, cpu, len(documents), tokens, client_tokens)

    def _sample(self, start: float, cpu: float, items: int, tokens: int | None, client_tokens: int) -> Sample:
        """The request timed from `start` (perf_counter) and `cpu` (thread_time): the last answer's server flags."""
        return Sample(start, time.perf_counter() - start, items, tokens or client_tokens, tokens is not None,
                      cold=self.last_cold, timing=self.last_timing, client_cpu_s=time.thread_time() - cpu)

    def models(self) -> dict[str, Any] | None:
        return self.get_json("/v1/models")

    def max_length(self) -> int | None:
        """The served model's max input length as GET /v1/models (or TEI's GET /info) reports it."""
        listing = self.models() or {}
        entries = [e for e in listing.get("data", []) if isinstance(e, dict)]
        entries.sort(key=lambda e: e.get("id") != self.model)  # the requested model first
        info = self.get_json("/info") or {}
        for entry in [*entries, info]:
            for key in MAX_LENGTH_KEYS:
                value = entry.get(key)
                if isinstance(value, int) and value > 0:
                    return value
        return None

    def baseline_latency_ms(self, count: int = 50) -> dict[str, Any] | None:
        """Round trip of a trivial GET, to tell the client's and the network's share apart."""
        for path in ("/health", "/v1/models"):
            times = []
            for _ in range(count):
                start = time.perf_counter()
                try:
                    response = self.http.get(path)
                except HTTPError:
                    break
                times.append(time.perf_counter() - start)
                if response.status_code != 200:
                    times = []
                    break
            if times:
                return {"path": path, "requests": len(times),
                        "p50_ms": float(np.percentile(times, 50) * 1e3)}
        return None
