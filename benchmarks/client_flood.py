"""Clients flooding the gateway's concurrency cap beside a client that sends one request at a time: what that
client gets, with the clients' shares of the slots on (IVY_CLIENT_SHARE=0.5, the default) and off (1).

    python -m benchmarks.client_flood [--flooders 1] [--flood 48] [--cap 16] [--device-ms 4] [--seconds 6]

Starts `tulip serve` with the zero-cost engine given a device of --device-ms a batch (so the cap fills) and one
`ivy serve` worker in front of it (benchmarks.overhead.Stack), an API key a client. The flooders (a key each) run
--flood connections between them, each sending again at once whatever it was answered, 429s included (clients with
no back-off). The victim sends one 128-token text at a time and, on a 429, waits the Retry-After it was given, as a
well behaved client does. Printed per setting: the victim's requests answered 200 and 429, its p50 and p99 latency
end to end (its waits included) and its answered requests a second; the flooders' answered requests and 429s a
second, and their other failures (any other status, a timeout) in all.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import orjson

from benchmarks.overhead import EMBED, Stack, text_of_tokens
from ivy.http_connection import Connection
from rose.spec import bundled_model_dir, load_spec
from rose.tokenizer import Tokenizer

VICTIM = "victim-key"


def _client(url: str, key: str) -> Connection:
    return Connection(url, {"content-type": "application/json", "authorization": f"Bearer {key}"}, timeout_s=60)


def run(stack: Stack, payload: bytes, flood_keys: list[str], flood: int, seconds: float) -> dict:
    stop = time.monotonic() + seconds
    flooded = {200: 0, 429: 0, "other": 0}
    lock = threading.Lock()

    def flooder(key: str) -> None:
        client = _client(stack.url, key)
        while time.monotonic() < stop:
            try:
                status = client.post(EMBED, payload).status_code
            except Exception:  # noqa: BLE001 - a timeout or a reset: counted, and the flood goes on
                status = "other"
            with lock:
                flooded[status if status in (200, 429) else "other"] += 1

    threads = [threading.Thread(target=flooder, args=(flood_keys[i % len(flood_keys)],)) for i in range(flood)]
    for t in threads:
        t.start()
    time.sleep(0.5)  # the flood at its height before the victim starts
    victim, latencies, answered, refused = _client(stack.url, VICTIM), [], 0, 0
    start = time.monotonic()
    while time.monotonic() < stop:
        t0 = time.perf_counter()
        while True:
            response = victim.post(EMBED, payload)
            if response.status_code != 429:
                break
            refused += 1
            if time.monotonic() >= stop:
                break
            time.sleep(float(response.headers.get("retry-after", "1")))
        if response.status_code == 200:
            answered += 1
            latencies.append(time.perf_counter() - t0)
    victim_s = time.monotonic() - start
    for t in threads:
        t.join()
    ms = sorted(x * 1e3 for x in latencies) or [float("nan")]
    return {"victim_200": answered, "victim_429": refused, "victim_p50_ms": statistics.median(ms),
            "victim_p99_ms": ms[min(len(ms) - 1, int(0.99 * len(ms)))], "victim_per_s": answered / victim_s,
            "flood_per_s": flooded[200] / seconds, "flood_429_per_s": flooded[429] / seconds,
            "flood_other": flooded["other"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--flooders", type=int, default=1, help="flooding clients (an API key each)")
    parser.add_argument("--flood", type=int, default=48, help="the flooders' connections, split evenly")
    parser.add_argument("--cap", type=int, default=16, help="IVY_MAX_CONCURRENT_REQUESTS (one worker)")
    parser.add_argument("--device-ms", type=float, default=4.0, help="the zero engine's time a batch")
    parser.add_argument("--seconds", type=float, default=6.0)
    args = parser.parse_args(argv)
    model_dir = str(bundled_model_dir())
    payload = orjson.dumps({"input": text_of_tokens(Tokenizer(load_spec(model_dir)), 128, model_dir),
                            "encoding_format": "base64"})
    flood_keys = [f"flood-key-{i}" for i in range(args.flooders)]
    rows = []
    for share in ("1", "0.5"):
        env = {"IVY_CLIENT_SHARE": share, "IVY_MAX_CONCURRENT_REQUESTS": str(args.cap),
               "IVY_API_KEY_LANES": ",".join(f"{k}=interactive" for k in [*flood_keys, VICTIM]),
               "IVY_COALESCE": "false",
               "ZERO_ENGINE_DEVICE_MS": str(args.device_ms)}
        stack = Stack(1, model_dir, env=env)
        try:
            stack.wait_ready()
            rows.append((share, run(stack, payload, flood_keys, args.flood, args.seconds)))
        finally:
            stack.stop()
    print(f"{'client share':>12} {'victim 200':>10} {'victim 429':>10} {'p50 ms':>8} {'p99 ms':>8} "
          f"{'victim/s':>9} {'flood/s':>8} {'flood 429/s':>11} {'flood other':>11}")
    for share, r in rows:
        print(f"{share:>12} {r['victim_200']:>10} {r['victim_429']:>10} {r['victim_p50_ms']:>8.1f} "
              f"{r['victim_p99_ms']:>8.1f} {r['victim_per_s']:>9.1f} {r['flood_per_s']:>8.0f} "
              f"{r['flood_429_per_s']:>11.0f} {r['flood_other']:>11}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
