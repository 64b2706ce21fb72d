"""RELIABILITY case 19: a client trickling its body gets 408 and is closed; others are unaffected."""

from __future__ import annotations

import json
import socket
import time
import urllib.request

import pytest

from fake_tulip import FakeTulip, wait_until
from ivy_testkit import ivy_process, server_has_read_everything, server_sockets

pytestmark = pytest.mark.slow


def _post(url: str, body: dict) -> int:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.status


def test_trickling_body_gets_408_and_closed_while_others_are_served() -> None:
    # A cap of one request in flight: the trickling body must not hold it (it is read outside the cap).
    with FakeTulip() as fake, ivy_process(IVY_REPLICAS=fake.address, IVY_BODY_READ_TIMEOUT_S="1",
                                          IVY_MAX_CONCURRENT_REQUESTS="1") as port:
        body = json.dumps({"input": ["a slow client"]}).encode()
        slow = socket.create_connection(("127.0.0.1", port))
        slow.sendall(b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body[:5])
        started = time.monotonic()
        # The server has read the headers and the first bytes: the slow request is in its body read now.
        wait_until(lambda: server_sockets(port) and server_has_read_everything(port), timeout=30)
        # While the slow body trickles, a normal request is answered at once, not refused with 429.
        assert _post(f"http://127.0.0.1:{port}/v1/embeddings", {"input": ["a normal client"]}) == 200
        slow.settimeout(0.2)
        reply = b""
        # One byte every 0.2 s (pacing: the client must be slow): the whole body would take ~7 s, far past the
        # 1 s body timeout, and the 408 is asserted within 5 s of the first byte (4 s of margin for load).
        for byte in body[5:]:
            try:
                slow.sendall(bytes([byte]))
            except OSError:
                break  # the server closed the connection
            try:
                chunk = slow.recv(4096)
            except TimeoutError:
                continue
            except OSError:  # reset: the server closed while we were still sending
                break
            reply += chunk
            if not chunk or reply:
                break  # the answer has begun (or the connection closed): stop sending into it
            if time.monotonic() - started > 8:
                break
        slow.settimeout(2)
        try:  # the rest of the answer, until the server closes
            while chunk := slow.recv(4096):
                reply += chunk
        except OSError:
            pass
        slow.close()
        assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
        assert b"request_body_timeout" in reply
        assert time.monotonic() - started < 5


def test_over_the_cap_a_request_is_refused_before_its_body_is_read() -> None:
    """Load shedding costs no body reading or parsing: headers alone get the 429."""
    import threading

    from fake_tulip import wait_until

    gate = threading.Event()
    with FakeTulip(gate=gate) as fake, ivy_process(IVY_REPLICAS=fake.address, IVY_MAX_CONCURRENT_REQUESTS="1") as port:
        held = threading.Thread(target=lambda: _post(f"http://127.0.0.1:{port}/v1/embeddings", {"input": ["held"]}))
        held.start()
        wait_until(lambda: fake.waiting == 1)
        conn = socket.create_connection(("127.0.0.1", port))
        conn.sendall(b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100000\r\n\r\n")  # the body never comes
        conn.settimeout(5)
        reply = conn.recv(4096)
        conn.close()
        gate.set()
        held.join(timeout=10)
        assert reply.startswith(b"HTTP/1.1 429"), reply[:200]
