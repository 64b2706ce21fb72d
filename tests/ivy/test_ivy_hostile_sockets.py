"""Hostile sockets against a real `ivy serve` (issue 15): RELIABILITY cases 26, 27, 44 and 46 (the connection cap,
48 and 49: test_ivy_connection_cap.py)."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time

import pytest

from fake_tulip import FakeTulip, wait_until
from ivy_testkit import event_loop_turned, ivy_process, server_connections_open, server_has_read_everything
from raw_sockets import HEAD, closing_reply, embed_once, one_answer, raw_post, status_lines

pytestmark = pytest.mark.slow


class _Latencies(threading.Thread):
    """Another client's requests, one after another, while the test does something hostile."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.port, self.results, self.done = port, [], threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            self.results.append(embed_once(self.port))
            time.sleep(0.02)  # pacing, not a wait: a steady client that leaves the CPU to the server and attacker

    def stop(self) -> list[tuple[int, float]]:
        self.done.set()
        self.join(timeout=20)
        return self.results


@pytest.mark.parametrize("shape", ["one huge header", "many headers"])
def test_huge_headers_get_431_fast_while_others_are_served(shape) -> None:
    """RELIABILITY 26: httptools joins a header's pieces with bytes +=, so a 150 MB header held the event loop
    ~20 s; with the limit (64 KiB by default) the sender is cut off after a bounded size, others unaffected."""
    with FakeTulip() as fake, ivy_process(IVY_REPLICAS=fake.address) as port:
        others = _Latencies(port)
        others.start()
        wait_until(lambda: len(others.results) >= 2, timeout=30)  # the other client is being served
        attacker = socket.create_connection(("127.0.0.1", port))
        attacker.settimeout(2)
        piece = b"a" * 65536 if shape == "one huge header" else b"X-A: b\r\n" * 8192
        sent, started = 0, time.monotonic()
        try:
            attacker.sendall(HEAD + (b"X-Big: " if shape == "one huge header" else b""))
            while sent < 64 * 2**20 and time.monotonic() - started < 20:
                attacker.sendall(piece)
                sent += len(piece)
        except OSError:  # closed or reset by the server, or it stopped reading
            pass
        cut_after = time.monotonic() - started
        reply = closing_reply(attacker, 5)
        attacker.close()
        during = len(others.results)
        wait_until(lambda: len(others.results) >= during + 2, timeout=30)  # and still is, after the attack
        results = others.stop()
    assert reply is not None and (reply == b"" or reply.startswith(b"HTTP/1.1 431")), (reply or b"")[:200]
    assert sent < 16 * 2**20, f"the server read {sent / 2**20:.0f} MiB of headers"
    assert cut_after < 5
    assert results and all(status == 200 for status, _ in results), results
    assert max(seconds for _, seconds in results) < 3.0, results  # ~0.05 s on a loaded 2-core VM; no limit: 9 s


def test_idle_and_trickling_connections_are_closed_and_capped() -> None:
    """RELIABILITY 27: a connection that sends nothing, one idle after its answer (keep-alive) and one that
    trickles its headers are closed after their timeouts; once they are gone new clients are served."""
    env = dict(IVY_KEEP_ALIVE_TIMEOUT_S="1", IVY_HEADER_READ_TIMEOUT_S="2", IVY_MAX_CONNECTIONS="24")
    with FakeTulip() as fake, ivy_process(IVY_REPLICAS=fake.address, **env) as port:
        # The readiness probes' connections are gone: the cap below counts only this test's connections.
        wait_until(lambda: server_connections_open(port) == 0, timeout=30)
        silent = [socket.create_connection(("127.0.0.1", port)) for _ in range(8)]
        kept = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        kept.request("GET", "/health")
        assert kept.getresponse().read() and kept.sock is not None  # keep-alive: the socket stays open
        trickler = socket.create_connection(("127.0.0.1", port))
        started = time.monotonic()
        closed_at = None
        for byte in HEAD + b"X-Slow: " + b"s" * 100:  # one byte every 0.1 s: 13 s for the headers
            try:
                trickler.sendall(bytes([byte]))
            except OSError:
                closed_at = time.monotonic() - started
                break
            if closing_reply(trickler, 0.1) is not None:  # the server answered or closed
                closed_at = time.monotonic() - started
                break
        assert closed_at is not None and closed_at < 4, closed_at
        for s in silent:
            assert closing_reply(s, 3) is not None, "an idle connection was never closed"
        assert closing_reply(kept.sock, 3) is not None, "a keep-alive connection was never closed"

        wait_until(lambda: server_connections_open(port) == 0, timeout=30)  # the server has let them go
        assert embed_once(port)[0] == 200


def test_the_rest_of_a_body_answered_early_is_not_read_as_headers() -> None:
    """RELIABILITY 44: an answer given before the body was read (a bad header, an unknown Content-Encoding, a
    body over the cap) was followed by a second, unasked-for 431 once the unread rest of the body passed the
    header limit, and the connection was closed: the client's next request on it read that 431 or a reset.
    Now the rest is drained (up to the body cap, within the header timeout), the next request on the
    connection is answered, and the next request's headers are still capped."""
    with FakeTulip() as fake, ivy_process(IVY_REPLICAS=fake.address, IVY_PAYLOAD_LIMIT_BYTES="1000000") as port:
        big = json.dumps({"input": "a" * 300_000}).encode()  # under the body cap, over the header limit
        for early in (b"X-Request-Timeout: -1\r\n", b"Content-Encoding: br\r\n"):
            with socket.create_connection(("127.0.0.1", port)) as s:
                s.sendall(raw_post(big, early))
                first = status_lines(s, 1.5)
                assert len(first) == 1 and first[0].split()[1] in (b"415", b"422"), first
                s.sendall(raw_post(json.dumps({"input": "next"}).encode()))
                assert status_lines(s, 1.5) == [b"HTTP/1.1 200 OK"]  # the same connection serves the next one
                started = time.monotonic()
                try:
                    s.sendall(HEAD + b"X-Big: " + b"h" * 200_000)
                except OSError:  # closed while we were still sending
                    pass
                assert status_lines(s, 5)[:1] == [b"HTTP/1.1 431 Request Header Fields Too Large"]
                assert time.monotonic() - started < 5
        with socket.create_connection(("127.0.0.1", port)) as s:  # over the cap: one 413, then closed silently
            try:
                s.sendall(raw_post(b"x" * 3_000_000))
            except OSError:
                pass
            assert [a.split()[1] for a in status_lines(s, 5)] == [b"413"]
        assert embed_once(port)[0] == 200


def test_bodies_being_read_are_capped_together() -> None:
    """RELIABILITY 46: three uploads stalled before their end hold (their Content-Length reserved) 1.2 MB of a
    worker's 1.25 MB budget for bodies being read; a fourth body that would pass it gets 429 with Retry-After
    before it is read, a small request is served meanwhile, and once the uploads are gone a full-size body is
    served again."""
    env = dict(IVY_PAYLOAD_LIMIT_BYTES="400000", IVY_BODY_BYTES_IN_FLIGHT="1250000", IVY_BODY_READ_TIMEOUT_S="60",
               IVY_WORKERS="1")
    body = json.dumps({"input": ["a normal client"], "user": "u" * 399_000}).encode()  # OpenAI's `user`: ignored
    with FakeTulip() as fake, ivy_process(IVY_REPLICAS=fake.address, **env) as port:
        stalled = []
        for _ in range(3):
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(HEAD + b"Content-Length: %d\r\n\r\n" % len(body) + body[:300_000])
            stalled.append(s)
        wait_until(lambda: server_has_read_everything(port), timeout=30)
        event_loop_turned(port)
        refused = socket.create_connection(("127.0.0.1", port))
        refused.sendall(HEAD + b"Content-Length: %d\r\n\r\n" % len(body))  # its body never sent: refused unread
        reply = one_answer(refused, 5)  # the connection is kept to drain a body that never comes
        assert reply.startswith(b"HTTP/1.1 429") and b"retry-after" in reply.lower(), reply[:300]
        assert b"bytes of request bodies" in reply
        assert embed_once(port)[0] == 200  # a small body still fits
        for s in stalled:
            s.close()
        wait_until(lambda: server_connections_open(port) <= 1, timeout=30)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("POST", "/v1/embeddings", body, {"content-type": "application/json"})
        assert conn.getresponse().status == 200
        conn.close()


def test_a_connection_drained_after_an_early_answer_idles_quietly() -> None:
    """RELIABILITY 44: after an early answer (a 422 for its header) and the rest of its body drained, the
    connection is idle like any other: no unasked-for 408 when the header timeout passes, and its next request is
    served."""
    env = dict(IVY_HEADER_READ_TIMEOUT_S="1", IVY_KEEP_ALIVE_TIMEOUT_S="60", IVY_WORKERS="1")
    body = json.dumps({"input": ["a normal client"], "user": "u" * 20_000}).encode()
    with FakeTulip() as fake, ivy_process(IVY_REPLICAS=fake.address, **env) as port:
        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall(HEAD + b"X-Request-Timeout: -1\r\nContent-Length: %d\r\n\r\n" % len(body))
        assert one_answer(sock, 5).startswith(b"HTTP/1.1 422")
        sock.sendall(body)  # the rest, after its answer: drained
        time.sleep(2.5)  # past the header timeout
        sock.sendall(raw_post(body))
        assert status_lines(sock, 5)[:1] == [b"HTTP/1.1 200 OK"], "the next request was not the next answer"


def test_a_slow_upload_answered_early_is_drained_within_the_body_timeout() -> None:
    """RELIABILITY 44: the rest of a body answered early (a 422 for its header) is drained within the body read
    timeout, not the header timeout: a client that takes 3 s to send its body (the header timeout 1 s, the body
    timeout 5 s), as a client does that reads only once it has sent everything, then reads exactly one answer and
    its next request on the connection is served (it was reset after 1 s); a body that is still arriving when the
    body timeout passes is cut off silently, without a second answer."""
    env = dict(IVY_HEADER_READ_TIMEOUT_S="1", IVY_BODY_READ_TIMEOUT_S="5", IVY_WORKERS="1")
    body = json.dumps({"input": ["a slow upload"], "user": "u" * 600_000}).encode()
    early = HEAD + b"X-Request-Timeout: -1\r\nContent-Length: %d\r\n\r\n" % len(body)
    with FakeTulip() as fake, ivy_process(IVY_REPLICAS=fake.address, **env) as port:
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(early)
            started = time.monotonic()
            try:
                for at in range(0, len(body), 20_000):  # ~3 s in all
                    s.sendall(body[at:at + 20_000])
                    time.sleep(0.1)
            except OSError as exc:
                pytest.fail(f"the drain was cut off after {time.monotonic() - started:.1f} s: {exc!r}")
            assert [a.split()[1] for a in status_lines(s, 1.5)] == [b"422"]
            s.sendall(raw_post(json.dumps({"input": "next"}).encode()))
            assert status_lines(s, 5) == [b"HTTP/1.1 200 OK"]

        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(early)
            assert one_answer(s, 5).startswith(b"HTTP/1.1 422")
            s.sendall(body[:20_000])  # then nothing more: the drain waits the body timeout, then closes
            started = time.monotonic()
            assert closing_reply(s, 10) == b"", "a second answer, or the connection was kept"
            assert 4 < time.monotonic() - started < 8

        with socket.create_connection(("127.0.0.1", port)) as s:  # not a byte of the body, ever: the same bound
            s.sendall(early)  # from the answer (it waited for the keep-alive timeout, 75 s by default, counted busy)
            started = time.monotonic()
            assert one_answer(s, 5).startswith(b"HTTP/1.1 422")
            assert closing_reply(s, 10) == b"", "a second answer, or the connection was kept"
            assert 4 < time.monotonic() - started < 8
        assert embed_once(port)[0] == 200


def test_headers_sent_behind_a_request_in_progress_are_capped_too() -> None:
    """RELIABILITY 26: the header cap and timer counted only bytes sent between requests, so the next request's
    headers sent while one was in progress (pipelining, a slow replica) were read without limit: 100 MiB of one
    header was taken whole, the worker grew 140 MiB and its loop stalled 6.7 s. The sender is cut off after the
    cap however the bytes arrive; others are served meanwhile."""
    with FakeTulip(delay_s=60.0) as fake, ivy_process(IVY_REPLICAS=fake.address) as port:
        attacker = socket.create_connection(("127.0.0.1", port))
        attacker.sendall(raw_post(json.dumps({"input": "hello"}).encode()))
        time.sleep(0.5)  # read by then, and held at the replica for its 60 s: a request in progress
        sent, started = 0, time.monotonic()
        try:
            attacker.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ")
            while sent < 32 * 2**20 and time.monotonic() - started < 20:
                attacker.sendall(b"a" * 65536)
                sent += 65536
        except OSError:  # reset by the server, or it stopped reading
            pass
        attacker.close()
        fake.delay_s = 0.0  # the replica answers again: the worker serves the next client
        status, _ = embed_once(port)
    assert sent < 16 * 2**20, f"the server read {sent / 2**20:.0f} MiB of headers behind a request in progress"
    assert status == 200


def test_an_early_answer_to_expect_100_continue_closes_the_connection() -> None:
    """RELIABILITY 44 with `Expect: 100-continue`: a client answered with a final status before any 100 sends no
    body (RFC 9110 10.1.1) and may send its next request, which was read as the awaited body: no answer for it,
    and the connection held until the drain's 10 s ran out. The connection is closed after the answer instead,
    so the client knows to send its next request on a new one."""
    with FakeTulip() as fake, ivy_process(IVY_REPLICAS=fake.address) as port:
        for early in (b"X-Request-Timeout: -1\r\n", b"Content-Encoding: br\r\n"):
            with socket.create_connection(("127.0.0.1", port)) as s:
                s.sendall(HEAD + b"Content-Length: 200\r\nExpect: 100-continue\r\n" + early + b"\r\n")
                started = time.monotonic()
                reply = closing_reply(s, 5)
                assert reply is not None and time.monotonic() - started < 3, "the connection was held"
                assert reply.split(b"\r\n", 1)[0].split()[1] in (b"415", b"422"), reply[:200]
                assert b"100 Continue" not in reply
        assert embed_once(port)[0] == 200
