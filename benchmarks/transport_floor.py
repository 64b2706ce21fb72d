"""The floor of the Ivy -> Tulip hop: one request and its answer over a grpc.aio bidirectional stream (how Ivy
talks to Tulip) beside the same protobuf bytes with a length prefix over a plain asyncio TCP connection (the
framed stream) and over a unix socket (the framed stream of a Tulip on the same host).

    python -m benchmarks.transport_floor [--requests 3000] [--inflight 1,16] [--reply-bytes 4096]
        [--transports grpc,framed,unix]

Two processes: a server that answers each StreamRequest with a StreamResponse carrying `--reply-bytes` of
embedding (no work, no threads of its own), and this client, which keeps K requests in flight on one
connection. Both sides use uvloop when installed, as Ivy and Tulip do (grpc-sync: the server is grpcio's threaded
one, the client the same grpc.aio stream). Prints p50 / p99 per round trip,
round trips per second and CPU milliseconds per round trip of each process: what any per-request work in
Tulip and Ivy comes on top of.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np

from benchmarks.overhead import cpu_seconds, free_port, grpc_request, median_row
from benchmarks.tulip_handoffs import drive, drive_framed
from protos import embed_pb2, embed_pb2_grpc
from protos.framing import FrameBuffer, frame
from tulip.cli import run_loop


def _answer(message: embed_pb2.StreamRequest, reply: bytes) -> embed_pb2.StreamResponse:
    return embed_pb2.StreamResponse(id=message.id, response=embed_pb2.EmbedResponse(
        embeddings=reply, rows=1, dimensions=len(reply) // 4, tokens=128))


class _Echo(embed_pb2_grpc.EmbedderServicer):
    def __init__(self, reply: bytes) -> None:
        self.reply = reply

    async def EmbedStream(self, request_iterator, context):
        async for message in request_iterator:
            await context.write(_answer(message, self.reply))


class _SyncEcho(embed_pb2_grpc.EmbedderServicer):
    """The same stream served by grpcio's synchronous server (a thread pool), for the grpc-sync transport."""

    def __init__(self, reply: bytes) -> None:
        self.reply = reply

    def EmbedStream(self, request_iterator, context):
        for message in request_iterator:
            yield _answer(message, self.reply)


class _FramedEcho(asyncio.Protocol):
    def __init__(self, reply: bytes) -> None:
        self.reply, self.frames, self.transport = reply, FrameBuffer(1 << 30), None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        for payload in self.frames.feed(data):
            self.transport.write(frame(_answer(embed_pb2.StreamRequest.FromString(payload), self.reply)))


def serve(kind: str, port: int | str, reply_bytes: int) -> None:
    reply = bytes(reply_bytes)
    if kind == "grpc-sync":
        server = grpc.server(ThreadPoolExecutor(max_workers=4))
        embed_pb2_grpc.add_EmbedderServicer_to_server(_SyncEcho(reply), server)
        server.add_insecure_port(f"127.0.0.1:{port}")
        server.start()
        server.wait_for_termination()
        return

    async def main() -> None:
        if kind == "grpc":
            server = grpc.aio.server()
            embed_pb2_grpc.add_EmbedderServicer_to_server(_Echo(reply), server)
            server.add_insecure_port(f"127.0.0.1:{port}")
            await server.start()
            await server.wait_for_termination()
        elif kind == "unix":
            server = await asyncio.get_running_loop().create_unix_server(lambda: _FramedEcho(reply), port)
            await server.serve_forever()
        else:
            server = await asyncio.get_running_loop().create_server(lambda: _FramedEcho(reply), "127.0.0.1", port)
            await server.serve_forever()

    run_loop(main(), "auto")


def measure(kind: str, args, inflight: int) -> dict:
    port = free_port() if kind != "unix" else os.path.join(tempfile.mkdtemp(prefix="transport-floor-"), "echo.sock")
    server = multiprocessing.get_context("spawn").Process(target=serve, args=(kind, port, args.reply_bytes), daemon=True)
    server.start()
    request = grpc_request(list(range(101, 101 + args.tokens)))
    client = drive if kind.startswith("grpc") else drive_framed
    pids = {"server": [server.pid], "client": [os.getpid()]}

    async def session():
        deadline = time.monotonic() + 30
        while True:
            try:
                await client(port, request, 50, 1)  # warm-up (and wait for the server)
                break
            except (OSError, grpc.aio.AioRpcError):
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)
        cpu0 = {k: cpu_seconds(v) for k, v in pids.items()}
        t0 = time.perf_counter()
        lat = await client(port, request, args.requests, inflight)
        wall = time.perf_counter() - t0
        return lat, wall, {k: 1e3 * (cpu_seconds(v) - cpu0[k]) / len(lat) for k, v in pids.items()}

    try:
        lat, wall, cpu = run_loop(session(), "auto")
        lat = np.asarray(lat) * 1e3
    finally:
        server.kill()
        server.join(5)
        if kind == "unix":
            shutil.rmtree(os.path.dirname(port), ignore_errors=True)
    return {"transport": kind, "inflight": inflight, "p50_ms": float(np.percentile(lat, 50)),
            "p99_ms": float(np.percentile(lat, 99)), "per_s": len(lat) / wall,
            "server_cpu_ms": cpu["server"], "client_cpu_ms": cpu["client"]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.transport_floor", description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--inflight", default="1,16")
    parser.add_argument("--tokens", type=int, default=128, help="token ids in each request")
    parser.add_argument("--reply-bytes", type=int, default=4096, help="embedding bytes in each answer (1024 floats)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--transports", default="grpc,framed,unix",
                        help="grpc, grpc-sync (the same stream on grpcio's threaded server), framed (TCP) and unix")
    args = parser.parse_args(argv)
    rows = []
    for k in (int(x) for x in args.inflight.split(",")):
        for kind in args.transports.split(","):
            rows.append(median_row([measure(kind, args, k) for _ in range(args.repeat)]))
    print(f"{'transport':10s} {'inflight':>8s} {'p50 ms':>8s} {'p99 ms':>8s} {'per s':>9s} {'server cpu':>10s} {'client cpu':>10s}")
    for r in rows:
        print(f"{r['transport']:10s} {r['inflight']:8d} {r['p50_ms']:8.3f} {r['p99_ms']:8.3f} {r['per_s']:9.0f} "
              f"{r['server_cpu_ms']:10.3f} {r['client_cpu_ms']:10.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
