"""The per-process connection cap against a real `ivy serve` (ivy/connection_cap.py): RELIABILITY 48 (idle
connections make room) and 49 (with every connection busy, a reserve for health probes)."""

from __future__ import annotations

import http.client
import socket
import threading
import time
import urllib.request
from contextlib import contextmanager
from typing import Iterator

import pytest

from fake_tulip import FakeTulip, wait_until
from ivy.connection_cap import EVICT_AFTER_S, PROBE_HEADER_TIMEOUT_S
from ivy_testkit import ivy_process, server_connections_open, server_has_read_everything
from raw_sockets import HEAD, closing_reply, embed_once, raw_post

pytestmark = pytest.mark.slow

CAP = 5


def test_over_the_cap_a_new_connection_closes_the_one_idle_longest() -> None:
    """RELIABILITY 48: with the cap full of idle connections (silent ones, a kept-alive one) each new connection
    closes the one idle longest, without an answer, and the newer ones stay open; a client over the cap (the
    kubelet's liveness probe, say) is served."""
    env = dict(IVY_MAX_CONNECTIONS="8", IVY_KEEP_ALIVE_TIMEOUT_S="60", IVY_HEADER_READ_TIMEOUT_S="60",
               IVY_WORKERS="1")
    with FakeTulip() as fake, ivy_process(IVY_REPLICAS=fake.address, **env) as port:
        wait_until(lambda: server_connections_open(port) == 0, timeout=30)  # the readiness probes' are gone
        kept = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        kept.request("GET", "/health")
        assert kept.getresponse().read() and kept.sock is not None  # idle longest: kept alive after its answer
        crowd = [socket.create_connection(("127.0.0.1", port)) for _ in range(7)]  # the cap of 8 full
        time.sleep(EVICT_AFTER_S + 0.3)  # idle long enough to be closed to make room
        crowd += [socket.create_connection(("127.0.0.1", port)) for _ in range(4)]  # 12 in all
        assert closing_reply(kept.sock, 5) == b"", "the connection idle longest was not closed, or was answered"
        for s in crowd[:3]:
            assert closing_reply(s, 5) == b"", "an older idle connection over the cap was not closed, or was answered"
        assert all(closing_reply(s, 0.1) is None for s in crowd[3:]), "a newer idle connection was closed"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as r:
            assert r.status == 200  # over the cap: crowd[3] makes room
        assert closing_reply(crowd[3], 5) == b"" and closing_reply(crowd[4], 0.1) is None

        for s in crowd:
            s.close()


@contextmanager
def _every_connection_busy(**env: str) -> Iterator[int]:
    """A real `ivy serve` with a cap of CAP connections, every one holding a request the fake Tulip keeps
    waiting; yields the port, then lets the requests finish and checks the gateway serves again."""
    env = dict(IVY_MAX_CONNECTIONS=str(CAP), IVY_WORKERS="1", **env)
    with FakeTulip() as fake, ivy_process(IVY_REPLICAS=fake.address, **env) as port:
        wait_until(lambda: server_connections_open(port) == 0, timeout=30)  # the readiness probes' are gone
        fake.gate = threading.Event()
        busy = [threading.Thread(target=embed_once, args=(port,), daemon=True) for _ in range(CAP)]
        for t in busy:
            t.start()
        # every request read and held (Ivy may share one call among them: the fake sees fewer calls)
        wait_until(lambda: fake.waiting >= 1 and server_connections_open(port) == CAP
                   and server_has_read_everything(port), timeout=30)
        try:
            yield port
        finally:
            fake.gate.set()
            for t in busy:
                t.join(timeout=30)
        wait_until(lambda: server_connections_open(port) == 0, timeout=30)
        assert embed_once(port)[0] == 200


def _is_503(reply: bytes | None) -> bool:
    return reply is not None and reply.startswith(b"HTTP/1.1 503") and b"retry-after" in reply.lower()


def test_without_a_probe_reserve_every_connection_busy_means_a_fast_503() -> None:
    """RELIABILITY 48 with --probe-connections 0: nothing can make room, so a new connection is answered 503 with
    Retry-After at once; when the requests in progress are answered it is served again."""
    with _every_connection_busy(IVY_PROBE_CONNECTIONS="0") as port:
        started = time.monotonic()
        refused = socket.create_connection(("127.0.0.1", port))
        reply = closing_reply(refused, 3)
        assert _is_503(reply), reply
        assert time.monotonic() - started < PROBE_HEADER_TIMEOUT_S  # at once, not after a wait for a request


def test_with_every_connection_busy_health_probes_are_still_served() -> None:
    """RELIABILITY 49: with every connection of the cap holding a request in progress, the kubelet's liveness and
    readiness probes (GET /health, GET /ready) and Prometheus's scrape (GET /metrics) are served over the cap, each
    connection closed after its answer (a 503 there restarted a gateway that was only busy); an inference request
    over the cap is answered 503 with Retry-After as soon as its headers arrive, and a connection that sends
    nothing within PROBE_HEADER_TIMEOUT_S gets the same 503 then."""
    with _every_connection_busy(IVY_PROBE_CONNECTIONS="2", IVY_HEADER_READ_TIMEOUT_S="60") as port:
        for path in ("/health", "/ready", "/metrics"):
            probe = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            probe.request("GET", path)  # keep-alive asked for: the server closes it anyway
            answer = probe.getresponse()
            assert (answer.status, answer.getheader("connection")) == (200, "close"), (path, answer.status)
            answer.read()
            probe.close()

        started = time.monotonic()
        inference = socket.create_connection(("127.0.0.1", port))
        inference.sendall(raw_post(b'{"input": ["over the cap"]}'))
        reply = closing_reply(inference, 5)
        assert _is_503(reply) and b"every one busy" in reply, reply
        assert time.monotonic() - started < PROBE_HEADER_TIMEOUT_S  # answered on its headers, not on the timeout

        started = time.monotonic()
        silent = socket.create_connection(("127.0.0.1", port))
        reply = closing_reply(silent, 5)
        waited = time.monotonic() - started
        assert _is_503(reply), reply
        assert 0.5 * PROBE_HEADER_TIMEOUT_S < waited < PROBE_HEADER_TIMEOUT_S + 2, waited


def test_an_inference_request_with_a_large_body_in_the_reserve_gets_its_503_not_a_reset() -> None:
    """RELIABILITY 49: a client sends its whole body before it reads. The reserve answered 503 on the headers and
    closed with the body unread, and a socket closed with bytes unread is reset: a client posting a body at the
    payload limit (2 MiB) could see a reset instead of the 503 that says retry later (on loopback, whose buffers
    take ~1 MB; over a network, with smaller windows, far less). Its body is read first now (up to the drain's
    2 MiB), and a body that never comes is answered within PROBE_HEADER_TIMEOUT_S."""
    with _every_connection_busy(IVY_PROBE_CONNECTIONS="2", IVY_HEADER_READ_TIMEOUT_S="60") as port:
        body = b'{"input": ["%s"]}' % (b"x" * (2 * 1024 * 1024 - 20))
        for _ in range(3):
            client = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            client.request("POST", "/v1/embeddings", body, {"content-type": "application/json"})
            answer = client.getresponse()
            assert (answer.status, answer.getheader("connection")) == (503, "close")
            assert answer.getheader("retry-after") and b"every one busy" in answer.read()
            client.close()

        started = time.monotonic()
        stalled = socket.create_connection(("127.0.0.1", port))
        stalled.sendall(HEAD + b"Content-Length: 1000\r\n\r\n{")  # the rest of its body never comes
        assert _is_503(closing_reply(stalled, 5))
        assert time.monotonic() - started < PROBE_HEADER_TIMEOUT_S + 2


def test_a_flood_of_fake_probes_stays_within_the_cap_and_its_reserve() -> None:
    """RELIABILITY 49: twenty connections over a busy cap that trickle a probe's request line (a slowloris against
    the reserve of 2) never hold more than the reserve: each newcomer closes, with a 503, the one waiting longest
    for its request, so the worker holds cap + reserve connections, and a real probe after the flood is served."""
    with _every_connection_busy(IVY_PROBE_CONNECTIONS="2", IVY_HEADER_READ_TIMEOUT_S="60") as port:
        fakes = []
        for _ in range(20):
            fake_probe = socket.create_connection(("127.0.0.1", port))
            fake_probe.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # never its last line
            fakes.append(fake_probe)
        wait_until(lambda: server_connections_open(port) <= CAP + 2, timeout=0.6 * PROBE_HEADER_TIMEOUT_S)
        assert all(closing_reply(s, 0.01) is None for s in fakes[-2:]), "the newest fake probes were not held"
        for s in fakes[:-2]:
            assert _is_503(closing_reply(s, 5))
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as r:
            assert r.status == 200
        for s in fakes[-2:]:  # the reserve's last two: closed (503) for the real probe, or on their timeout
            assert _is_503(closing_reply(s, PROBE_HEADER_TIMEOUT_S + 2))
        for s in fakes:
            s.close()
        reused = socket.create_connection(("127.0.0.1", port))
        reused.sendall(HEAD + b"Content-Length: 2\r\n\r\n{}")  # the reserve takes no other request
        assert _is_503(closing_reply(reused, 5))


def test_an_unread_answer_under_the_high_water_mark_is_dropped_at_the_send_timeout() -> None:
    """RELIABILITY 40, 48: a client that asks for a 34 KB answer (/openapi.json, open without a key) and reads none
    of it leaves the rest under the transport's 64 KiB high-water mark, so writing never paused and no send timeout
    ran; the keep-alive close waits to flush and eviction skips a connection with unsent bytes, so a few such
    clients held the cap for good. The answer's end now starts the send watch: the connection is aborted."""
    env = dict(IVY_MAX_CONNECTIONS="8", IVY_SEND_TIMEOUT_S="2", IVY_KEEP_ALIVE_TIMEOUT_S="1")
    with FakeTulip() as fake, ivy_process(IVY_REPLICAS=fake.address, **env) as port:
        stalled = socket.socket()
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1)  # the kernel takes ~nothing of the answer
        stalled.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, 536)
        stalled.connect(("127.0.0.1", port))
        stalled.sendall(b"GET /openapi.json HTTP/1.1\r\nHost: x\r\n\r\n")
        wait_until(lambda: server_connections_open(port) == 1, timeout=5)
        wait_until(lambda: server_connections_open(port) == 0, timeout=15)  # aborted within two send timeouts
        stalled.close()


def test_a_websocket_handshake_leaves_nothing_in_the_caps_books() -> None:
    """RELIABILITY 48, 49: uvicorn hands an upgraded connection to its WebSocket protocol and the HTTP protocol's
    connection_lost never runs; the connection stayed among the idle (or the probe reserve's) for good: ~7 KB a
    handshake, and reserve places lost until a restart."""
    import asyncio

    from uvicorn.config import Config
    from uvicorn.server import ServerState

    from ivy import connection_cap
    from ivy.connections import HttpToolsLimits

    async def app(scope, receive, send) -> None:  # as Ivy: no WebSocket route, the handshake refused
        if scope["type"] == "websocket":
            await send({"type": "websocket.close"})

    class Transport:
        def __init__(self) -> None:
            self.closing, self.protocol = False, None

        def write(self, data) -> None:
            pass

        def get_extra_info(self, name, default=None):
            return {"peername": ("127.0.0.1", 5000), "sockname": ("127.0.0.1", 8000)}.get(name, default)

        def is_closing(self) -> bool:
            return self.closing

        def close(self) -> None:
            self.closing = True

        def set_protocol(self, protocol) -> None:
            self.protocol = protocol

        def get_write_buffer_size(self) -> int:
            return 0

        def pause_reading(self) -> None:
            pass

        def resume_reading(self) -> None:
            pass

    async def run() -> None:
        config = Config(app=app, lifespan="off", log_level="warning", ws="auto")
        config.load()
        protocol = HttpToolsLimits(config=config, server_state=ServerState(), app_state={})
        protocol.connection_made(Transport())
        assert connection_cap._IDLE.get(protocol) is not None
        protocol.data_received(b"GET /v1/embeddings HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
                               b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                               b"Sec-WebSocket-Version: 13\r\n\r\n")
        await asyncio.sleep(0.1)
        assert protocol not in connection_cap._IDLE and protocol not in connection_cap._RESERVE

    pytest.importorskip("websockets")
    pytest.importorskip("httptools")
    asyncio.run(run())
