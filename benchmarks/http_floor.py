"""The HTTP server's own floor: what uvicorn costs per request before any app work, beside a bare httptools protocol.

    python -m benchmarks.http_floor [--requests 5000] [--repeat 3] [--servers uvicorn,httptools]

Each server runs in its own process on uvloop and answers every POST with a canned body of `--reply-bytes` (5 600:
a 1024-dimension base64 embedding in Ivy's JSON); the client (this process) sends `--body-bytes` of JSON (~700: a
128-token text request) on one keep-alive connection, one request at a time, after a warm-up:

    uvicorn    `uvicorn` (httptools, uvloop, no access log) with a bare ASGI callable: read the body, send the answer
               (what every Ivy request pays before Ivy's own code: the parser's callbacks, the scope and message
               dicts, the ASGI task per request, the header encoding)
    httptools  an asyncio Protocol that feeds the same parser and writes the answer from on_message_complete: the
               floor of any HTTP/1.1 server written over uvloop and httptools

Prints p50 / p99 µs a round trip and the server's CPU µs a request (/proc's schedstat), medians over --repeat rounds: the
size of what a leaner HTTP layer for the hot routes could save (benchmarks/NOTES.md, "The HTTP server's own floor").
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import socket
import statistics
import time

import numpy as np

from benchmarks.overhead import free_port, median_row
from tulip.cli import run_loop


def _bare_asgi(reply: bytes):
    """An ASGI app that reads the whole body, as an app does, and answers `reply`."""
    head = [(b"content-type", b"application/json"), (b"content-length", str(len(reply)).encode())]

    async def app(scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        more = True
        while more:
            message = await receive()
            more = message.get("more_body", False)
        await send({"type": "http.response.start", "status": 200, "headers": head})
        await send({"type": "http.response.body", "body": reply})

    return app


class _BareHttpProtocol(asyncio.Protocol):
    def __init__(self, answer: bytes) -> None:
        import httptools

        self.answer, self.transport = answer, None
        self.parser = httptools.HttpRequestParser(self)

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_body(self, body: bytes) -> None:
        pass

    def on_message_complete(self) -> None:
        self.transport.write(self.answer)


def serve(kind: str, port: int, reply_bytes: int) -> None:
    reply = b"x" * reply_bytes
    if kind == "uvicorn":
        import uvicorn

        uvicorn.run(_bare_asgi(reply), host="127.0.0.1", port=port, loop="uvloop", http="httptools",
                    access_log=False, log_level="warning", lifespan="off")
        return
    answer = (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % reply_bytes) + reply

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(lambda: _BareHttpProtocol(answer), "127.0.0.1", port)
        await server.serve_forever()

    run_loop(main(), "auto")


# The client is a bare socket, not ivy.http_connection.Connection (the benchmarks' keep-alive client): http.client's own
# ~80 µs a request on this project's CPU would sit in every round trip beside a floor of ~30.
def _connect(port: int) -> socket.socket:
    deadline = time.monotonic() + 30
    while True:
        try:
            sock = socket.create_connection(("127.0.0.1", port))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(10)  # a server that stops answering fails the run instead of hanging it
            return sock
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _round_trip(sock: socket.socket, request: bytes) -> None:
    """Send `request`, read one whole answer: its head, then content-length bytes of body (nothing is pipelined, so
    nothing is left over)."""
    sock.sendall(request)
    data = b""
    while (end := data.find(b"\r\n\r\n")) < 0:
        data += _recv(sock)
    head = data[:end].lower()
    length = int(head.split(b"content-length:", 1)[1].split(b"\r\n", 1)[0])
    while len(data) < end + 4 + length:
        data += _recv(sock)


def _recv(sock: socket.socket) -> bytes:
    chunk = sock.recv(65536)
    if not chunk:
        raise ConnectionError("the server closed the connection")
    return chunk


def _cpu_ns(pid: int) -> int:
    """Nanoseconds on a CPU of every thread of `pid` (/proc's schedstat: /proc's stat counts 10 ms ticks, too coarse
    for tens of µs a request)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                total += int(f.read().split()[0])
        except OSError:  # a thread gone meanwhile
            pass
    return total


def measure(kind: str, args) -> dict:
    port = free_port()
    server = multiprocessing.get_context("spawn").Process(target=serve, args=(kind, port, args.reply_bytes),
                                                          daemon=True)
    server.start()
    body = b'{"input": "' + b"a" * max(args.body_bytes - 14, 0) + b'"}'
    request = (b"POST /v1/embeddings HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
               b"content-length: %d\r\n\r\n" % len(body)) + body
    sock = None
    try:
        sock = _connect(port)
        for _ in range(500):  # warm-up
            _round_trip(sock, request)
        cpu0, times = _cpu_ns(server.pid), []
        for _ in range(args.requests):
            start = time.perf_counter()
            _round_trip(sock, request)
            times.append(time.perf_counter() - start)
        cpu = (_cpu_ns(server.pid) - cpu0) / 1e9
    finally:
        if sock is not None:
            sock.close()
        server.terminate()
        server.join(5)
    return {"server": kind, "p50_us": statistics.median(times) * 1e6, "p99_us": float(np.percentile(times, 99)) * 1e6,
            "server_cpu_us": cpu / args.requests * 1e6}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.http_floor", description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--body-bytes", type=int, default=700, help="the request's JSON body (a 128-token text)")
    parser.add_argument("--reply-bytes", type=int, default=5600, help="the answer's body (a base64 1024-d row)")
    parser.add_argument("--servers", default="uvicorn,httptools")
    args = parser.parse_args(argv)
    kinds = args.servers.split(",")
    rounds = {k: [] for k in kinds}
    for _ in range(args.repeat):  # the servers alternate, so a drift of the machine falls on both
        for kind in kinds:
            rounds[kind].append(measure(kind, args))
    print(f"{'server':10s} {'p50 us':>8s} {'p99 us':>8s} {'server cpu us':>14s}")
    for kind in kinds:
        r = median_row(rounds[kind])
        print(f"{kind:10s} {r['p50_us']:8.1f} {r['p99_us']:8.1f} {r['server_cpu_us']:14.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
