"""The remote embedder: POST /v1/embeddings on any OpenAI-compatible server, one keep-alive connection per
worker thread (ivy/http_connection.py, shared with the benchmarks: stdlib, TCP_NODELAY, one resend when the
server closed an idle connection). Float rows travel as base64 float32 (the same values as a JSON list, a
quarter of the bytes).

Errors: a 400/413/422 is about what the batch carries (`RowError`, with the input index when the server names
it as `input[i]`); 408, 429, 5xx and broken or refused connections are retried `retries` times, GET /v1/models
at the start too (a server down is "could not reach", not "no model"); anything else (401, 404) stops the job.
Each wait is the longer of the backoff (0.5 s doubling, at most 30 s) and the server's Retry-After (seconds,
fractions too, or an HTTP-date; at most MAX_RETRY_AFTER_S): never sooner than the server asked, and a short
Retry-After (Ivy's 1-2 s while no replica serves) cannot spend the retries faster than the backoff would.
"""

from __future__ import annotations

import base64
import json
import logging
import math
import re
import threading
import time
from datetime import UTC
from email.utils import parsedate_to_datetime

import numpy as np

from ivy.http_connection import Connection, HTTPError, Response

WIRE = {"float": ("base64", "<f4"), "base64_int8": ("base64_int8", np.int8), "base64_binary": ("base64_binary",
                                                                                                  np.uint8)}
_INPUT_PARAM = re.compile(r"^input\[(\d+)\]")
# A wait longer than this is taken as this: a batch job's retries should end in a clear error (and --resume)
# within `retries` x 5 min, not park unattended for the day a wild Retry-After (or a skewed clock's date) asks;
# a rate-limit window or a rolling restart fits well under it. (Ivy caps its own estimate at 3600 s.)
MAX_RETRY_AFTER_S = 300.0
log = logging.getLogger("ivy.index")


class RowError(Exception):
    """The request was refused for what it carries; `index`: the input the server named, when it did."""

    def __init__(self, message: str, index: int | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.index, self.param = index, param


class FatalError(RuntimeError):
    """The job cannot go on (auth, unknown model, server down after every retry)."""


class _Retry(Exception):
    def __init__(self, message: str, after_s: float | None = None) -> None:
        super().__init__(message)
        self.after_s = after_s


def retry_after_s(value: str | None) -> float | None:
    """Retry-After as seconds from now (delay-seconds, fractions too, or an HTTP-date; a past date is 0), at most
    MAX_RETRY_AFTER_S; None when absent, negative, not finite or unreadable."""
    if not value or not value.strip():
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        when = when if when.tzinfo else when.replace(tzinfo=UTC)  # HTTP-dates are GMT
        seconds = max(0.0, when.timestamp() - time.time())
    return min(seconds, MAX_RETRY_AFTER_S) if math.isfinite(seconds) and seconds >= 0 else None


def _error_message(body: bytes) -> tuple[str, str | None]:
    try:
        error = json.loads(body).get("error") or {}
        return str(error.get("message") or body[:300].decode("utf-8", "replace")), error.get("param")
    except (ValueError, AttributeError):
        return body[:300].decode("utf-8", "replace"), None


class HttpEmbedder:
    def __init__(self, url: str, *, api_key: str, model_name: str, options: dict, encoding: str,
                 timeout_s: float, retries: int) -> None:
        self._url, self._timeout_s, self.retries = url, timeout_s, retries
        self._headers = {"content-type": "application/json"}
        if api_key:
            self._headers["authorization"] = f"Bearer {api_key}"
        self._local = threading.local()
        self._all: list[Connection] = []  # every thread's, closed together
        self._stop = threading.Event()  # set by close(): workers still retrying give up (Ctrl-C exits promptly)
        self._wire, self._dtype = WIRE[encoding]
        card = self._model_card(model_name)
        self.model_name = model_name or card.get("id", "")
        if not self.model_name:
            raise FatalError(f"{url}/v1/models lists no model; pass --model-name")
        self.card_dimensions = int(card.get("dimensions") or 0)
        self._options = dict(options)  # the request's options, as /v1/embeddings names them

    def _conn(self) -> Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            try:
                conn = self._local.conn = Connection(self._url, self._headers, self._timeout_s)
            except HTTPError as exc:  # a malformed URL
                raise FatalError(str(exc)) from None
            self._all.append(conn)  # list.append is atomic
        return conn

    def _request(self, method: str, path: str, body: bytes | None = None) -> Response:
        try:
            return self._conn().request(method, path, body)
        except HTTPError as exc:  # refused, reset, timed out: the server's reasons, retried
            raise _Retry(f"could not reach {self._url} ({exc})") from None

    def _retrying(self, what: str, call):
        for attempt in range(self.retries + 1):
            if self._stop.is_set():
                raise FatalError(f"{what}: closed")
            try:
                return call()
            except _Retry as exc:
                if attempt == self.retries:
                    raise FatalError(f"{what} failed {attempt + 1} times; last: {exc}") from None
                wait = max(min(30.0, 0.5 * 2 ** attempt), exc.after_s or 0.0)
                if wait >= 30:  # a long silence should not look like a hang
                    log.warning("%s: %s; retrying in %.0f s", what, exc, wait)
                self._wait(wait)
        raise AssertionError("unreachable")

    def _wait(self, seconds: float) -> None:
        if self._stop.wait(seconds):
            raise FatalError("closed while waiting to retry")

    def _model_card(self, wanted: str) -> dict:
        def listing() -> Response:
            answer = self._request("GET", "/v1/models")
            if answer.status_code not in (200, 404, 405):  # 404/405: a server that lists none (--model-name)
                self._raise_for(answer, "GET /v1/models")
            return answer

        answer = self._retrying("GET /v1/models", listing)
        try:
            entries = (json.loads(answer.content).get("data") or []) if answer.status_code == 200 else []
        except (ValueError, AttributeError):
            entries = []
        entries = [e for e in entries if isinstance(e, dict)]
        return next((e for e in entries if e.get("id") == wanted), entries[0] if entries and not wanted else {})

    def embed(self, texts: list[str]) -> tuple[np.ndarray, int]:
        body = json.dumps({"model": self.model_name, "input": texts, "encoding_format": self._wire,
                           **self._options}).encode()
        return self._retrying("POST /v1/embeddings", lambda: self._post(body, len(texts)))

    @staticmethod
    def _raise_for(answer: Response, what: str) -> None:
        """_Retry for the server's passing trouble (408, 429, 5xx), FatalError for the rest."""
        status = answer.status_code
        message, _ = _error_message(answer.content)
        if status in (408, 429) or status >= 500:
            raise _Retry(f"{status}: {message}", retry_after_s(answer.headers.get("retry-after")))
        raise FatalError(f"{what} -> {status}: {message}")

    def _post(self, body: bytes, n: int) -> tuple[np.ndarray, int]:
        answer = self._request("POST", "/v1/embeddings", body)
        status = answer.status_code
        if status != 200:
            message, param = _error_message(answer.content)
            if status in (400, 413, 422):
                if status == 413:  # the batch's size (Ivy names its "body"), not an option: split it
                    param = None
                match = _INPUT_PARAM.match(param or "")
                raise RowError(message, int(match.group(1)) if match else None, param)
            self._raise_for(answer, "POST /v1/embeddings")
        out = json.loads(answer.content)
        data = sorted(out.get("data") or [], key=lambda d: d.get("index", 0))
        if len(data) != n:
            raise FatalError(f"/v1/embeddings returned {len(data)} embeddings for {n} inputs")
        rows = np.stack([self._decode(d["embedding"]) for d in data])
        return rows, int((out.get("usage") or {}).get("prompt_tokens") or 0)

    def _decode(self, value) -> np.ndarray:
        if isinstance(value, str):
            return np.frombuffer(base64.b64decode(value), dtype=self._dtype)
        return np.asarray(value, dtype=np.float32)  # a server that ignored base64 and sent floats

    def close(self) -> None:
        self._stop.set()
        for conn in self._all:
            conn.close()
