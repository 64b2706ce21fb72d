"""A client that sends its request and then reads nothing of the answer, against a real `ivy serve` (RELIABILITY
40): each such answer (2048 inputs: ~9 MB of JSON) stayed in the worker's memory for as long as the socket
stayed open; now the connection is dropped once --send-timeout-s passes with nothing of the answer sent,
while a slow reader that keeps reading gets its whole answer."""

from __future__ import annotations

import json
import socket
import time
import urllib.request

import pytest

from fake_tulip import FakeTulip, wait_until
from ivy_testkit import ivy_process

pytestmark = pytest.mark.slow

BODY = json.dumps({"input": [f"w{i}" for i in range(2048)], "encoding_format": "float"}).encode()
REQUEST = (b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "
           + str(len(BODY)).encode() + b"\r\nConnection: close\r\n\r\n" + BODY)


def _client() -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # its kernel takes little of the answer
    return sock


def _read_all(sock: socket.socket, rate: float = 0.0, timeout: float = 60.0) -> tuple[bytes, bool]:
    """(what arrived, whether the server ended the connection), read at most `rate` bytes/s (0 = at once)."""
    sock.settimeout(timeout)
    data = b""
    started = time.monotonic()
    try:
        while chunk := sock.recv(16384):
            data += chunk
            if rate:
                time.sleep(max(0.0, started + len(data) / rate - time.monotonic()))
    except TimeoutError:
        return data, False
    except ConnectionResetError:
        pass
    return data, True


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    raise AssertionError(f"no content-length in {head[:200]!r}")


def _dropped(port: int) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    lines = [line for line in text.splitlines() if line.startswith('ivy_connections_refused_total{reason="send_timeout"}')]
    return float(lines[0].rsplit(" ", 1)[1]) if lines else 0.0


def test_a_client_that_reads_nothing_is_dropped_and_a_slow_reader_is_not() -> None:
    with FakeTulip() as fake, ivy_process(IVY_REPLICAS=fake.address, IVY_SEND_TIMEOUT_S="5") as port:
        stalled = _client()
        stalled.connect(("127.0.0.1", port))
        stalled.sendall(REQUEST)
        wait_until(lambda: _dropped(port) >= 1, timeout=40)  # the answer was built, then not read for 5 s
        data, ended = _read_all(stalled, timeout=10)
        head, _, body = data.partition(b"\r\n\r\n")
        assert ended and len(body) < _content_length(head), "cut short: the unsent part was dropped"
        slow = _client()
        slow.connect(("127.0.0.1", port))
        slow.sendall(REQUEST)
        started = time.monotonic()
        data, ended = _read_all(slow, rate=1.5e6)  # ~6.5 s for the ~9.7 MB: each 5 s with progress
        head, _, body = data.partition(b"\r\n\r\n")
        assert ended and head.startswith(b"HTTP/1.1 200") and len(body) == _content_length(head), head[:200]
        assert len(json.loads(body)["data"]) == 2048
        assert time.monotonic() - started > 5  # longer than the send timeout, yet never cut
        assert _dropped(port) == 1
