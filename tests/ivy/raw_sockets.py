"""Raw-socket helpers for the tests that hold connections open against a real `ivy serve` (hostile clients,
the connection cap): requests written byte for byte, and what the server sends back before it closes."""

from __future__ import annotations

import http.client
import json
import socket
import time

HEAD = b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"


def embed_once(port: int) -> tuple[int, float]:
    """(status, seconds) of one request on a fresh connection."""
    started = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("POST", "/v1/embeddings", json.dumps({"input": ["a normal client"]}),
                     {"content-type": "application/json"})
        return conn.getresponse().status, time.monotonic() - started
    finally:
        conn.close()


def closing_reply(sock: socket.socket, timeout: float) -> bytes | None:
    """What the server sends before closing: b"" when it closed without a word, None when it kept it open."""
    sock.settimeout(timeout)
    reply = b""
    try:
        while chunk := sock.recv(65536):
            reply += chunk
    except TimeoutError:
        return None
    except OSError:  # reset: closed while we were still sending
        pass
    return reply


def status_lines(sock: socket.socket, timeout: float) -> list[bytes]:
    """The status lines of every answer the server sends within `timeout` (or until it closes)."""
    sock.settimeout(timeout)
    reply = b""
    try:
        while chunk := sock.recv(65536):
            reply += chunk
    except (TimeoutError, OSError):  # still open, or reset
        pass
    return [line for line in reply.split(b"\r\n") if line.startswith(b"HTTP/1.1 ")]


def one_answer(sock: socket.socket, timeout: float) -> bytes:
    """One whole answer (headers and its Content-Length of body), however the server's writes arrive."""
    sock.settimeout(timeout)
    reply = b""
    while b"\r\n\r\n" not in reply or len(reply.split(b"\r\n\r\n", 1)[1]) < content_length(reply):
        chunk = sock.recv(65536)
        if not chunk:
            break
        reply += chunk
    return reply


def content_length(reply: bytes) -> int:
    for line in reply.split(b"\r\n\r\n", 1)[0].split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":", 1)[1])
    return 0


def raw_post(body: bytes, extra: bytes = b"") -> bytes:
    return HEAD + b"Content-Length: %d\r\n" % len(body) + extra + b"\r\n" + body
