"""The floor of the Ivy -> Tulip hop: one request and its answer over a grpc.aio bidirectional stream (how Ivy
talks to Tulip) beside the same protobuf bytes over a plain asyncio TCP connection with a length prefix.

    python -m benchmarks.transport_floor [--requests 3000] [--inflight 1,16] [--reply-bytes 4096]

Two processes: a server that answers each StreamRequest with a StreamResponse carrying `--reply-bytes` of
embedding (no work, no threads of its own), and this client, which keeps K requests in flight on one
connection. Both sides use uvloop when installed, as Ivy and Tulip do. Prints p50 / p99 per round trip,
round trips per second and CPU milliseconds per round trip of each process: what any per-request work in
Tulip and Ivy comes on top of.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import struct
import sys
import time

import grpc
import numpy as np

from benchmarks.overhead import cpu_seconds, free_port, grpc_request
from protos import embed_pb2, embed_pb2_grpc

LEN = struct.Struct("<I")


def _loop_policy() -> None:
    try:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:
        pass


def _answer(message: embed_pb2.StreamRequest, reply: bytes) -> embed_pb2.StreamResponse:
    return embed_pb2.StreamResponse(id=message.id, response=embed_pb2.EmbedResponse(
        embeddings=reply, rows=1, dimensions=len(reply) // 4, tokens=128))


class _Echo(embed_pb2_grpc.EmbedderServicer):
    def __init__(self, reply: bytes) -> None:
        self.reply = reply

    async def EmbedStream(self, request_iterator, context):
        async for message in request_iterator:
            await context.write(_answer(message, self.reply))


class _FramedEcho(asyncio.Protocol):
    def __init__(self, reply: bytes) -> None:
        self.reply, self.buffer, self.transport = reply, bytearray(), None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while len(self.buffer) >= 4:
            (n,) = LEN.unpack_from(self.buffer)
            if len(self.buffer) < 4 + n:
                return
            message = embed_pb2.StreamRequest.FromString(bytes(self.buffer[4:4 + n]))
            del self.buffer[:4 + n]
            out = _answer(message, self.reply).SerializeToString()
            self.transport.write(LEN.pack(len(out)) + out)


def serve(kind: str, port: int, reply_bytes: int) -> None:
    _loop_policy()
    reply = bytes(reply_bytes)

    async def main() -> None:
        if kind == "grpc":
            server = grpc.aio.server()
            embed_pb2_grpc.add_EmbedderServicer_to_server(_Echo(reply), server)
            server.add_insecure_port(f"127.0.0.1:{port}")
            await server.start()
            await server.wait_for_termination()
        else:
            server = await asyncio.get_running_loop().create_server(lambda: _FramedEcho(reply), "127.0.0.1", port)
            await server.serve_forever()

    asyncio.run(main())


async def _grpc_client(port: int, request, n: int, inflight: int) -> list[float]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        outbox: asyncio.Queue = asyncio.Queue()

        async def messages():
            while (m := await outbox.get()) is not None:
                yield m

        call = embed_pb2_grpc.EmbedderStub(channel).EmbedStream(messages())
        sent, lat, next_id = {}, [], 0

        def send() -> None:
            nonlocal next_id
            next_id += 1
            sent[next_id] = time.perf_counter()
            outbox.put_nowait(embed_pb2.StreamRequest(id=next_id, request=request, timeout_s=10))

        for _ in range(inflight):
            send()
        async for answer in call:
            lat.append(time.perf_counter() - sent.pop(answer.id))
            if next_id < n:
                send()
            elif not sent:
                break
        outbox.put_nowait(None)
        call.cancel()
        return lat


async def _framed_client(port: int, request, n: int, inflight: int) -> list[float]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    sent, lat, next_id = {}, [], 0

    def send() -> None:
        nonlocal next_id
        next_id += 1
        sent[next_id] = time.perf_counter()
        out = embed_pb2.StreamRequest(id=next_id, request=request, timeout_s=10).SerializeToString()
        writer.write(LEN.pack(len(out)) + out)

    for _ in range(inflight):
        send()
    while sent:
        (size,) = LEN.unpack(await reader.readexactly(4))
        answer = embed_pb2.StreamResponse.FromString(await reader.readexactly(size))
        lat.append(time.perf_counter() - sent.pop(answer.id))
        if next_id < n:
            send()
    writer.close()
    return lat


def measure(kind: str, args, inflight: int) -> dict:
    port = free_port()
    server = multiprocessing.get_context("spawn").Process(target=serve, args=(kind, port, args.reply_bytes), daemon=True)
    server.start()
    request = grpc_request(list(range(101, 101 + args.tokens)))
    client = _grpc_client if kind == "grpc" else _framed_client
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
        lat, wall, cpu = asyncio.run(session())
        lat = np.asarray(lat) * 1e3
    finally:
        server.kill()
        server.join(5)
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
    args = parser.parse_args(argv)
    _loop_policy()
    rows = []
    for k in (int(x) for x in args.inflight.split(",")):
        for kind in ("grpc", "framed"):
            runs = [measure(kind, args, k) for _ in range(args.repeat)]
            rows.append({key: (float(np.median([r[key] for r in runs])) if isinstance(runs[0][key], float)
                               else runs[0][key]) for key in runs[0]})
    print(f"{'transport':10s} {'inflight':>8s} {'p50 ms':>8s} {'p99 ms':>8s} {'per s':>9s} {'server cpu':>10s} {'client cpu':>10s}")
    for r in rows:
        print(f"{r['transport']:10s} {r['inflight']:8d} {r['p50_ms']:8.3f} {r['p99_ms']:8.3f} {r['per_s']:9.0f} "
              f"{r['server_cpu_ms']:10.3f} {r['client_cpu_ms']:10.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
