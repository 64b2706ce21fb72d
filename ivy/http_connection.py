"""One keep-alive HTTP/1.1 client connection on the standard library: `ivy index`'s and the benchmarks'.

httpx costs ~0.3 ms of Python per request on a 2-core VM (0.08 ms for http.client against the same
trivial server; benchmarks/NOTES.md), which a latency benchmark would book to the server and a batch job
would spend on the client. This keeps what both need: a base URL (http or https, with a path prefix),
default headers, a timeout, keep-alive with TCP_NODELAY, one resend on a new connection when the server
closed an idle one, and errors of one type (`HTTPError`). Stdlib only: the gateway's install carries it.
One Connection per thread or process; it is not thread-safe.
"""

from __future__ import annotations

import http.client
import socket
from dataclasses import dataclass, field
from urllib.parse import urlsplit


class HTTPError(OSError):
    """The request could not be sent or its answer not read (refused, reset, timed out, bad URL)."""


@dataclass(frozen=True)
class Response:
    status_code: int
    content: bytes
    headers: dict[str, str] = field(default_factory=dict)  # names in lower case

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")

    @property
    def cold(self) -> bool:
        """X-Cold-Start: 1 (ours): the request met a CUDA-graph layout without its graph yet."""
        return self.headers.get("x-cold-start") == "1"


# Failures that mean "the kept-alive connection was closed under us": safe to send once more on a new one.
_STALE = (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError, ConnectionAbortedError)


class Connection:
    def __init__(self, url: str, headers: dict[str, str] | None = None, timeout_s: float = 60.0) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise HTTPError(f"not an http(s) URL: {url!r}")
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port or (443 if self._https else 80)
        self._prefix = parts.path.rstrip("/")
        self._headers = dict(headers or {})
        self._timeout_s = timeout_s
        self._conn: http.client.HTTPConnection | None = None

    def _connect(self) -> http.client.HTTPConnection:
        cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        conn = cls(self._host, self._port, timeout=self._timeout_s)
        conn.connect()
        conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn

    def request(self, method: str, path: str, body: bytes | None = None) -> Response:
        for attempt in (0, 1):
            fresh = self._conn is None
            try:
                if fresh:
                    self._conn = self._connect()
                self._conn.request(method, self._prefix + path, body=body, headers=self._headers)
                answer = self._conn.getresponse()
                content = answer.read()
                if answer.will_close:
                    self.close()
                return Response(answer.status, content, {k.lower(): v for k, v in answer.getheaders()})
            except _STALE as exc:
                self.close()
                if fresh or attempt:
                    raise HTTPError(f"{method} {path}: {type(exc).__name__}: {exc}") from None
            except (OSError, http.client.HTTPException) as exc:
                self.close()
                raise HTTPError(f"{method} {path}: {type(exc).__name__}: {exc}") from None
        raise AssertionError("unreachable")

    def get(self, path: str) -> Response:
        return self.request("GET", path)

    def post(self, path: str, content: bytes) -> Response:
        return self.request("POST", path, content)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
