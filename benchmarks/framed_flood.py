"""A lone client's latency on Tulip's framed port while another connection floods it with small requests.

    python -m benchmarks.framed_flood [--device-ms 1.7] [--seconds 4] [--flood-tokens 2] [--json FILE]

Starts `tulip serve` with the zero engine (benchmarks/zero_engine.py: a fake device taking `--device-ms` a
batch) and its framed port, then measures one client sending one 128-token request at a time over its own framed
connection (as an Ivy worker does), first alone, then while a second connection writes small requests as fast
as its socket takes them (thousands a read) and reads its answers on another thread. Each flood request carries a
NaN deadline, so Tulip parses it and answers INVALID_ARGUMENT without queueing it: the flood costs the loop,
not the device nor the queue (a flood of valid work would make the lone client wait its turn behind it, FCFS). What a flood may cost the
lone client is a share of the device and of the loop, not the loop itself: tulip/framed.py admits at most
FRAMES_BEFORE_YIELD frames a connection before the loop turns. Prints p50 / p99 / max of the lone client's
latency, idle and flooded, and the flood's answers a second. Run it with uvloop importable to measure Tulip on
uvloop (TULIP_EVENT_LOOP=auto), where one loop turn hands a connection many reads.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import socket
import sys
import threading
import time
from typing import Self

import numpy as np

from benchmarks.tulip_handoffs import drive_framed, grpc_request, start_tulip, wait_serving
from protos import embed_pb2
from protos.framing import LENGTH, frame
from rose.spec import bundled_model_dir


class Flood:
    """Another process writing small requests as fast as its socket takes them (ids 1-127 again and again: each
    is refused at once, so none is in flight twice), its answers' bytes read and counted (`answered`)."""

    def __init__(self, port: int, tokens: int) -> None:
        self.port, self.tokens = port, tokens
        spawn = multiprocessing.get_context("spawn")
        self._answered = spawn.Value("q", 0)
        self._process = spawn.Process(
            target=_flood, args=(port, tokens, self._answered), daemon=True)

    @property
    def answered(self) -> int:
        """Bytes of answers read so far."""
        return self._answered.value

    def __enter__(self) -> Self:
        self._process.start()
        return self

    def __exit__(self, *exc) -> None:
        self._process.terminate()
        self._process.join(10)


def _flood(port: int, tokens: int, answered) -> None:
    sock = socket.create_connection(("127.0.0.1", port))
    request = grpc_request([101] + [1000] * max(tokens - 2, 0) + [102])
    chunk = b"".join(frame(embed_pb2.StreamRequest(id=1 + i % 127, request=request, timeout_s=float("nan")))
                     for i in range(8192))

    def read() -> None:
        while data := sock.recv(1 << 20):
            with answered.get_lock():
                answered.value += len(data)

    threading.Thread(target=read, daemon=True).start()
    while True:
        sock.sendall(chunk)


async def lone_client(port: int, request, seconds: float) -> tuple[np.ndarray, float]:
    """Latencies (ms) of one request at a time on the lone client's own connection, opened first, for `seconds`;
    and the time its connection took to open (ms)."""
    t0 = time.perf_counter()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    connect_ms = (time.perf_counter() - t0) * 1e3
    latencies: list[float] = []
    end, request_id = time.monotonic() + seconds, 0
    while time.monotonic() < end:
        request_id += 1
        sent = time.perf_counter()
        writer.write(frame(embed_pb2.StreamRequest(id=request_id, request=request, timeout_s=10)))
        (size,) = LENGTH.unpack(await reader.readexactly(LENGTH.size))
        answer = embed_pb2.StreamResponse.FromString(await reader.readexactly(size))
        if answer.code:
            raise SystemExit(f"tulip answered code {answer.code}: {answer.message}")
        latencies.append(time.perf_counter() - sent)
    writer.close()
    return np.asarray(latencies) * 1e3, connect_ms


def summary(measured: tuple[np.ndarray, float]) -> dict:
    lat, connect_ms = measured
    return {"n": len(lat), "connect_ms": connect_ms, "p50_ms": float(np.percentile(lat, 50)), "p99_ms": float(np.percentile(lat, 99)),
            "max_ms": float(lat.max())}


def _refusal_bytes() -> int:
    """The framed size of one flood request's answer (INVALID_ARGUMENT on a 1-byte id)."""
    from tulip.errors import InvalidRequest
    from tulip.stream import error_answer

    message = f"timeout_s = {float('nan')} is not a deadline: seconds from now, or 0 for none"  # tulip.stream's
    return len(frame(error_answer(1, InvalidRequest(message))))


async def main_async(args) -> dict:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        framed_port = probe.getsockname()[1]
    env = {"ZERO_ENGINE_DEVICE_MS": str(args.device_ms), "TULIP_FRAMED_PORT": str(framed_port)}
    proc, port = start_tulip(args.model or str(bundled_model_dir()), env)
    request = grpc_request([101] + [1000 + i for i in range(126)] + [102])
    try:
        await wait_serving(port, proc)
        await drive_framed(framed_port, request, 100, 1)  # warm-up
        idle = summary(await lone_client(framed_port, request, args.seconds))
        with Flood(framed_port, args.flood_tokens) as flood:
            await asyncio.sleep(0.5)  # the flood under way
            before = flood.answered
            t0 = time.perf_counter()
            flooded = summary(await lone_client(framed_port, request, args.seconds))
            rate = (flood.answered - before) / (time.perf_counter() - t0) / _refusal_bytes()
    finally:
        proc.terminate()
        proc.wait(20)
    return {"device_ms": args.device_ms, "flood_tokens": args.flood_tokens, "idle": idle, "flooded": flooded,
            "flood_answers_per_s": rate}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.framed_flood", description=__doc__.split("\n")[0])
    parser.add_argument("--device-ms", type=float, default=1.7, help="the fake device's time per batch")
    parser.add_argument("--seconds", type=float, default=4.0, help="the lone client's time, idle and flooded")
    parser.add_argument("--flood-tokens", type=int, default=2, help="tokens of each flood request")
    parser.add_argument("--model", default="", help="model folder (Info and tokenizer); default: bundled")
    parser.add_argument("--json", default="")
    args = parser.parse_args(argv)
    result = asyncio.run(main_async(args))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    print(f"{'lone client':12s} {'n':>6s} {'p50 ms':>8s} {'p99 ms':>8s} {'max ms':>9s} {'connect ms':>11s}")
    for name in ("idle", "flooded"):
        r = result[name]
        print(f"{name:12s} {r['n']:6d} {r['p50_ms']:8.3f} {r['p99_ms']:8.3f} {r['max_ms']:9.1f} {r['connect_ms']:11.1f}")
    print(f"flood answers/s: {result['flood_answers_per_s']:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
