"""Tulip's own cost per request over EmbedStream, beside a device that takes real time: latency above the
device's, CPU and context switches per request, sequential and with several requests in flight.

    python -m benchmarks.tulip_handoffs [--device-ms 1.7] [--requests 400] [--inflight 1,4,16] [--repeat 3]
        [--env TULIP_INLINE_LAUNCH=false ...] [--json FILE]

Starts `tulip serve` with the zero engine (benchmarks/zero_engine.py) whose fake device takes
`--device-ms` per batch (wait() sleeps without the GIL, as a thread blocked on a CUDA event does), then
sends one 128-token request at a time (inflight 1), or keeps K in flight, over one EmbedStream, as an Ivy
worker does. Each `--env` set (comma-free KEY=VALUE words; "base" = none) is a variant: the variants run
alternately, `--repeat` rounds, medians reported; a variant that sets TULIP_FRAMED_PORT is driven over that
framed EmbedStream (tulip/framed.py) instead of gRPC. Every thread hand-off costs at least one context switch,
so switches per request count the hand-offs; "over device" is the p50 minus the device time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time

import grpc
import numpy as np

from benchmarks.overhead import FACTORY, REPO, context_switches, cpu_seconds, free_port, grpc_request, median_row
from protos.framing import LENGTH, frame
from protos import embed_pb2, embed_pb2_grpc
from rose.spec import bundled_model_dir


def start_tulip(model_dir: str, env: dict[str, str]) -> tuple[subprocess.Popen, int]:
    port = free_port()
    path = [str(REPO), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    proc = subprocess.Popen(
        [sys.executable, "-m", "tulip", "serve", "--port", str(port), "--device", "cpu", "--model", model_dir,
         "--engine-factory", FACTORY, "--metrics-port", "0", "--log-level", "warning"],
        env={**os.environ, **env, "PYTHONPATH": os.pathsep.join(path)}, cwd=REPO)
    return proc, port


async def wait_serving(port: int, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = embed_pb2_grpc.EmbedderStub(channel)
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise SystemExit(f"tulip exited with {proc.returncode}")
            try:
                await stub.Info(embed_pb2.InfoRequest(), timeout=1)
                request = grpc_request([101] + [1000] * 126 + [102])
                await stub.Embed(request, timeout=5)
                return
            except grpc.aio.AioRpcError:
                await asyncio.sleep(0.2)
    raise SystemExit("tulip did not become ready")


async def drive(port: int, request: embed_pb2.EmbedRequest, requests: int, inflight: int) -> list[float]:
    """Latencies of `requests` stream requests, `inflight` kept outstanding on one EmbedStream."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = embed_pb2_grpc.EmbedderStub(channel)
        outbox: asyncio.Queue = asyncio.Queue()
        sent: dict[int, float] = {}
        latencies: list[float] = []

        async def messages():
            while (m := await outbox.get()) is not None:
                yield m

        call = stub.EmbedStream(messages())
        next_id = 0

        def send() -> None:
            nonlocal next_id
            next_id += 1
            sent[next_id] = time.perf_counter()
            outbox.put_nowait(embed_pb2.StreamRequest(id=next_id, request=request, timeout_s=10))

        for _ in range(min(inflight, requests)):
            send()
        async for answer in call:
            if answer.code:
                raise SystemExit(f"tulip answered code {answer.code}: {answer.message}")
            latencies.append(time.perf_counter() - sent.pop(answer.id))
            if next_id < requests:
                send()
            elif not sent:
                break
        outbox.put_nowait(None)
        call.cancel()
        return latencies


async def drive_framed(port: int | str, request: embed_pb2.EmbedRequest, requests: int, inflight: int) -> list[float]:
    """drive() over Tulip's framed EmbedStream (tulip/framed.py) instead of gRPC: its TCP port on this host, or
    its unix socket when `port` is a path."""
    reader, writer = await (asyncio.open_unix_connection(port) if isinstance(port, str)
                            else asyncio.open_connection("127.0.0.1", port))
    sent: dict[int, float] = {}
    latencies: list[float] = []
    next_id = 0

    def send() -> None:
        nonlocal next_id
        next_id += 1
        sent[next_id] = time.perf_counter()
        writer.write(frame(embed_pb2.StreamRequest(id=next_id, request=request, timeout_s=10)))

    for _ in range(min(inflight, requests)):
        send()
    while sent:
        (size,) = LENGTH.unpack(await reader.readexactly(LENGTH.size))
        answer = embed_pb2.StreamResponse.FromString(await reader.readexactly(size))
        if answer.code:
            raise SystemExit(f"tulip answered code {answer.code}: {answer.message}")
        latencies.append(time.perf_counter() - sent.pop(answer.id))
        if next_id < requests:
            send()
    writer.close()
    return latencies


async def measure(port: int, pid: int, request, requests: int, inflight: int, framed_port: int = 0) -> dict:
    run = (lambda n: drive_framed(framed_port, request, n, inflight)) if framed_port else (
        lambda n: drive(port, request, n, inflight))
    await run(min(100, requests))  # warm-up
    cpu0, sw0, t0 = cpu_seconds([pid]), context_switches([pid]), time.perf_counter()
    lat = np.asarray(await run(requests)) * 1e3
    wall = time.perf_counter() - t0
    n = len(lat)
    return {"inflight": inflight, "p50_ms": float(np.percentile(lat, 50)), "p99_ms": float(np.percentile(lat, 99)),
            "req_per_s": n / wall, "cpu_ms_per_req": 1e3 * (cpu_seconds([pid]) - cpu0) / n,
            "switches_per_req": (context_switches([pid]) - sw0) / n}


def parse_env(words: str) -> dict[str, str]:
    return {} if words == "base" else dict(w.split("=", 1) for w in words.split())


async def main_async(args) -> list[dict]:
    model_dir = args.model or str(bundled_model_dir())
    ids = [101] + [1000 + i for i in range(args.tokens - 2)] + [102]
    request = grpc_request(ids)
    levels = [int(x) for x in args.inflight.split(",")]
    variants = args.env or ["base"]
    rounds: dict[tuple[str, int], list[dict]] = {}
    for _ in range(args.repeat):
        for variant in variants:
            env = {"ZERO_ENGINE_DEVICE_MS": str(args.device_ms), **parse_env(variant)}
            proc, port = start_tulip(model_dir, env)
            try:
                await wait_serving(port, proc)
                framed = int(env.get("TULIP_FRAMED_PORT", 0))  # a variant with a framed port is driven over it
                for k in levels:
                    rounds.setdefault((variant, k), []).append(
                        await measure(port, proc.pid, request, args.requests, k, framed))
            finally:
                proc.terminate()
                proc.wait(20)
    rows = []
    for (variant, k), rs in rounds.items():
        row = median_row(rs)
        row.update(variant=variant, inflight=k, rounds=len(rs), over_device_ms=row["p50_ms"] - args.device_ms)
        rows.append(row)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.tulip_handoffs", description=__doc__.split("\n")[0])
    parser.add_argument("--device-ms", type=float, default=1.7, help="the fake device's time per batch")
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--inflight", default="1,4,16", help="requests kept outstanding on the stream")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--model", default="", help="model folder (Info and tokenizer); default: bundled")
    parser.add_argument("--env", action="append", help="a variant: space-separated KEY=VALUE for tulip, or base")
    parser.add_argument("--json", default="")
    args = parser.parse_args(argv)
    rows = asyncio.run(main_async(args))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device_ms": args.device_ms, "rows": rows}, f, indent=1)
    print(f"{'variant':34s} {'inflight':>8s} {'p50':>7s} {'p99':>7s} {'over dev':>8s} {'req/s':>8s} "
          f"{'cpu ms':>7s} {'switch':>7s}")
    for r in rows:
        print(f"{r['variant'][:34]:34s} {r['inflight']:8d} {r['p50_ms']:7.3f} {r['p99_ms']:7.3f} "
              f"{r['over_device_ms']:8.3f} {r['req_per_s']:8.1f} {r['cpu_ms_per_req']:7.3f} {r['switches_per_req']:7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
