"""One client flooding the gateway's concurrency cap beside a client that sends one request at a time: what the
second client gets, with one client's share of the slots on (IVY_CLIENT_SHARE=0.5, the default) and off (1).

    python -m benchmarks.client_flood [--flood 48] [--cap 16] [--device-ms 4] [--seconds 6]

Starts `tulip serve` with the zero-cost engine given a device of --device-ms a batch (so the cap fills) and one
`ivy serve` worker in front of it (benchmarks.overhead.Stack), two API keys. The flooder (key A) runs --flood
connections, each sending again at once whatever it was answered, 429s included (a client with no back-off). The
victim (key B) sends one 128-token text at a time and, on a 429, waits the Retry-After it was given, as a well
behaved client does. Printed per setting: the victim's requests answered 200 and 429, its p50 and p99 latency
end to end (its waits included) and its answered requests a second; the flooder's answered requests and 429s a
second, and its other failures (any other status, a timeout) in all.
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

KEYS = ("flood-key", "victim-key")


def _client(url: str, key: str) -> Connection:
    return Connection(url, {"content-type": "application/json", "authorization": f"Bearer {key}"}, timeout_s=60)


def run(stack: Stack, payload: bytes, flood: int, seconds: float) -> dict:
    stop = time.monotonic() + seconds
    flooded = {200: 0, 429: 0, "other": 0}
    lock = threading.Lock()

    def flooder() -> None:
        client = _client(stack.url, KEYS[0])
        while time.monotonic() < stop:
            try:
                status = client.post(EMBED, payload).status_code
            except Exception:  # noqa: BLE001 - a timeout or a reset: counted, and the flood goes on
                status = "other"
            with lock:
                flooded[status if status in (200, 429) else "other"] += 1

    threads = [threading.Thread(target=flooder) for _ in range(flood)]
    for t in threads:
        t.start()
    time.sleep(0.5)  # the flood at its height before the victim starts
    victim, latencies, answered, refused = _client(stack.url, KEYS[1]), [], 0, 0
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
    parser.add_argument("--flood", type=int, default=48, help="the flooder's connections")
    parser.add_argument("--cap", type=int, default=16, help="IVY_MAX_CONCURRENT_REQUESTS (one worker)")
    parser.add_argument("--device-ms", type=float, default=4.0, help="the zero engine's time a batch")
    parser.add_argument("--seconds", type=float, default=6.0)
    args = parser.parse_args(argv)
    model_dir = str(bundled_model_dir())
    payload = orjson.dumps({"input": text_of_tokens(Tokenizer(load_spec(model_dir)), 128, model_dir),
                            "encoding_format": "base64"})
    rows = []
    for share in ("1", "0.5"):
        env = {"IVY_CLIENT_SHARE": share, "IVY_MAX_CONCURRENT_REQUESTS": str(args.cap),
               "IVY_API_KEY_LANES": ",".join(f"{k}=interactive" for k in KEYS), "IVY_COALESCE": "false",
               "ZERO_ENGINE_DEVICE_MS": str(args.device_ms)}
        stack = Stack(1, model_dir, env=env)
        try:
            stack.wait_ready()
            rows.append((share, run(stack, payload, args.flood, args.seconds)))
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
