"""Tulip's batch pacing on a simulated device (CPU only): pack at once vs pack late (TULIP_PACK_AHEAD_MS).

    python -m benchmarks.pacing_sim [--clients 4,16] [--duration-s 3] [--json out.json]

A real TulipServer in this process drives `SimulatedDevice`: one stream, each batch busy for
`--fixed-ms` + `--per-token-us` x tokens (defaults near the Qwen3-0.6B on the H200: ~1.5 ms for a small
batch, 2.5 µs a token), rows of zeros. Client processes send one lognormal document (16-512 tokens)
per request in a closed loop over gRPC, like the stack benchmark's concurrency suite. Printed: p50/p99
latency, requests/s, mean sequences per batch, for each pack_ahead_ms.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import queue
import threading
import time

import grpc
import numpy as np

from benchmarks.zero_engine import ZeroEngine
from rose.spec import EngineInfo


class _Pending:
    def __init__(self, rows: np.ndarray) -> None:
        self.rows, self.done = rows, threading.Event()

    def ready(self) -> bool:
        return self.done.is_set()

    def wait(self, timeout: float | None = None) -> np.ndarray:
        self.done.wait(timeout)
        return self.rows

    def release(self) -> None:
        pass


class SimulatedDevice(ZeroEngine):
    """ZeroEngine's answers, delivered in launch order after a simulated device time per batch."""

    def __init__(self, info: EngineInfo, fixed_s: float, per_token_s: float) -> None:
        super().__init__(info)
        self.fixed_s, self.per_token_s = fixed_s, per_token_s
        self.batch_seqs: list[int] = []
        self._stream: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._device, daemon=True).start()

    def step(self, batch) -> _Pending:
        lazy = _Pending(super().step(batch).rows)
        self.batch_seqs.append(batch.num_seqs)
        self._stream.put((lazy, self.fixed_s + self.per_token_s * batch.num_tokens))
        return lazy

    def _device(self) -> None:
        while True:
            lazy, seconds = self._stream.get()
            end = time.perf_counter() + seconds
            while (left := end - time.perf_counter()) > 0:
                time.sleep(min(left, 0.0005) if left > 0.001 else 0)
            lazy.done.set()


def _client(address: str, clients: int, duration_s: float, seed: int, out) -> None:
    from protos import embed_pb2, embed_pb2_grpc

    def one(k: int, lat: list) -> None:
        stub = embed_pb2_grpc.EmbedderStub(grpc.insecure_channel(address))
        rng = np.random.default_rng(seed * 1000 + k)
        stop = time.monotonic() + duration_s
        while time.monotonic() < stop:
            n = int(np.clip(rng.lognormal(np.log(128), 0.8), 16, 512))
            ids = rng.integers(1, 30000, n).astype("<i4").tobytes()
            req = embed_pb2.EmbedRequest(token_ids=ids, seq_lens=np.array([n], "<i4").tobytes())
            t0 = time.perf_counter()
            stub.Embed(req, timeout=30)
            lat.append(time.perf_counter() - t0)

    lats = [[] for _ in range(clients)]
    threads = [threading.Thread(target=one, args=(k, lats[k])) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out.put([x for lat in lats for x in lat])


def run(pack_ahead_ms: float, clients: int, duration_s: float, fixed_ms: float, per_token_us: float) -> dict:
    from tulip.config import TulipConfig
    from tulip.server import TulipServer

    info = EngineInfo(model_id="sim", family="qwen3", max_length=512, dimensions=64, pooling="last",
                      tokenizer_fingerprint="sim", native_int8=False, normalize_default=True,
                      attention_backend="sim", device="cpu", dtype="float32")
    engine = SimulatedDevice(info, fixed_ms / 1e3, per_token_us / 1e6)
    config = TulipConfig(port=0, max_batch_tokens=8192, warmup_full_batch="false", pack_ahead_ms=pack_ahead_ms)
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    server = TulipServer(config, engine=engine)
    asyncio.run_coroutine_threadsafe(server.start(), loop).result(30)
    out = mp.get_context("spawn").Queue()
    proc = mp.get_context("spawn").Process(target=_client, args=(f"127.0.0.1:{server.port}", clients, duration_s,
                                                                 1, out))
    proc.start()
    lat = np.array(out.get(timeout=duration_s + 60)) * 1e3
    proc.join()
    asyncio.run_coroutine_threadsafe(server.stop(), loop).result(30)
    loop.call_soon_threadsafe(loop.stop)
    warm = len(lat) // 10  # the first tenth learns the device times
    lat = lat[warm:] if len(lat) > 20 else lat
    return {"pack_ahead_ms": pack_ahead_ms, "clients": clients, "requests": len(lat),
            "p50_ms": round(float(np.percentile(lat, 50)), 3), "p99_ms": round(float(np.percentile(lat, 99)), 3),
            "rps": round(len(lat) / (duration_s * 0.9), 1),
            "mean_seqs_per_batch": round(float(np.mean(engine.batch_seqs)), 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", default="4,16")
    parser.add_argument("--pack-ahead-ms", default="0,1")
    parser.add_argument("--duration-s", type=float, default=3.0)
    parser.add_argument("--fixed-ms", type=float, default=1.5)
    parser.add_argument("--per-token-us", type=float, default=2.5)
    parser.add_argument("--rounds", type=int, default=1, help="repeat the whole grid, alternating variants")
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    rows = []
    for _ in range(args.rounds):
        for clients in (int(c) for c in args.clients.split(",")):
            for ahead in (float(a) for a in args.pack_ahead_ms.split(",")):
                rows.append(run(ahead, clients, args.duration_s, args.fixed_ms, args.per_token_us))
                print(json.dumps(rows[-1]), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
