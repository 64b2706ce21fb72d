"""An answer's head and body leave in one send (ivy/answer_writes.py), through Ivy's httptools protocol with a
transport that records its writes: one write for an ordinary answer, the head alone for HEAD and 204, `100
Continue` at once (the client waits for it), a streaming answer's head with its first chunk and then each chunk
as it comes, keep-alive answers each in one write, and nothing lost or reordered on close."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("httptools")

from uvicorn.config import Config  # noqa: E402
from uvicorn.server import ServerState  # noqa: E402

from ivy.answer_writes import JOIN_UNDER, HeadHeld  # noqa: E402
from ivy.connections import HttpToolsLimits  # noqa: E402


class Recorder:
    """The socket's transport: what was sent, in order, one entry per system call."""

    def __init__(self) -> None:
        self.sends: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.sends.append(bytes(data))

    def writelines(self, lines) -> None:
        self.sends.append(b"".join(lines))  # one writev

    def get_extra_info(self, name: str, default=None):
        return {"peername": ("127.0.0.1", 5000), "sockname": ("127.0.0.1", 8000)}.get(name, default)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_write_buffer_size(self) -> int:
        return 0

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def _app(scope, receive, send) -> None:
    path = scope["path"]
    if path == "/continue":  # reads its body: uvicorn answers the client's Expect: 100-continue first
        body = (await receive())["body"]
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(body))]})
        await send({"type": "http.response.body", "body": body})
        return
    if path == "/empty":
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})
        return
    if path == "/stream":
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        for chunk in (b"one", b"two"):
            await asyncio.sleep(0.01)
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        return
    body = b"x" * (2 * JOIN_UNDER if path == "/large" else 2220)
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(body))]})
    await send({"type": "http.response.body", "body": body})


async def _exchange(request: bytes, *more: bytes) -> Recorder:
    config = Config(app=_app, lifespan="off", log_level="warning")
    config.load()
    protocol = HttpToolsLimits(config=config, server_state=ServerState(), app_state={})
    sent = Recorder()
    protocol.connection_made(sent)
    for data in (request, *more):
        protocol.data_received(data)
        await asyncio.sleep(0.1)
    protocol.connection_lost(None)
    return sent


def _run(*data: bytes) -> list[bytes]:
    return asyncio.run(_exchange(*data)).sends


def test_an_answer_goes_out_in_one_send() -> None:
    sends = _run(b"GET /doc HTTP/1.1\r\nhost: x\r\n\r\n")
    assert len(sends) == 1, [len(s) for s in sends]
    assert sends[0].startswith(b"HTTP/1.1 200 OK\r\n") and sends[0].endswith(b"\r\n\r\n" + b"x" * 2220)


def test_each_answer_on_a_kept_alive_connection_is_one_send() -> None:
    request = b"GET /doc HTTP/1.1\r\nhost: x\r\n\r\n"
    sends = _run(request, request, request)
    assert len(sends) == 3 and all(s.startswith(b"HTTP/1.1 200") and s.endswith(b"x" * 2220) for s in sends)


def test_a_large_body_is_one_writev_not_copied_into_the_head() -> None:
    sends = _run(b"GET /large HTTP/1.1\r\nhost: x\r\n\r\n")
    assert len(sends) == 1 and sends[0].endswith(b"x" * 2 * JOIN_UNDER)


def test_heads_without_a_body_are_not_held() -> None:
    for request in (b"HEAD /doc HTTP/1.1\r\nhost: x\r\n\r\n", b"GET /empty HTTP/1.1\r\nhost: x\r\n\r\n"):
        sends = _run(request)
        assert len(sends) == 1 and sends[0].endswith(b"\r\n\r\n"), sends


def test_100_continue_is_sent_at_once_and_the_answer_after_the_body() -> None:
    async def exchange() -> list[bytes]:
        config = Config(app=_app, lifespan="off", log_level="warning")
        config.load()
        protocol = HttpToolsLimits(config=config, server_state=ServerState(), app_state={})
        sent = Recorder()
        protocol.connection_made(sent)
        protocol.data_received(b"POST /continue HTTP/1.1\r\nhost: x\r\nexpect: 100-continue\r\ncontent-length: 5\r\n\r\n")
        await asyncio.sleep(0.05)
        before_body = list(sent.sends)
        protocol.data_received(b"hello")
        await asyncio.sleep(0.05)
        protocol.connection_lost(None)
        return [*before_body, b"--body--", *sent.sends[len(before_body):]]

    sends = asyncio.run(exchange())
    assert sends[0] == b"HTTP/1.1 100 Continue\r\n\r\n" and sends[1] == b"--body--"
    assert len(sends) == 3 and sends[2].startswith(b"HTTP/1.1 200") and sends[2].endswith(b"hello")


def test_a_streaming_answer_sends_its_head_with_the_first_chunk_then_each_chunk() -> None:
    sends = _run(b"GET /stream HTTP/1.1\r\nhost: x\r\n\r\n")
    assert sends[0].startswith(b"HTTP/1.1 200") and sends[0].endswith(b"\r\n\r\n3\r\none\r\n"), sends
    assert sends[1:] == [b"3\r\ntwo\r\n", b"0\r\n\r\n"]


def test_a_held_head_goes_out_before_a_close_and_is_dropped_by_an_abort() -> None:
    sent = Recorder()
    held = HeadHeld(sent)
    held.hold_next = True
    held.write(b"HTTP/1.1 200 OK\r\n\r\n")
    assert sent.sends == [] and held.get_write_buffer_size() == 19
    held.close()
    assert sent.sends == [b"HTTP/1.1 200 OK\r\n\r\n"] and sent.closed

    aborted = []
    sent = Recorder()
    sent.abort = lambda: aborted.append(True)
    held = HeadHeld(sent)
    held.hold_next = True
    held.write(b"HTTP/1.1 200 OK\r\n\r\n")
    held.abort()
    held.flush()
    assert sent.sends == [] and aborted == [True]
