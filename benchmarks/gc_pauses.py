"""What the cyclic garbage collector costs a serving stack, with the start-up heap frozen and without.

    python -m benchmarks.gc_pauses [--clients 8] [--duration-s 40] [--tokens 16] [--rounds 2] [--json FILE]

Starts `tulip serve` with ROSE on the CPU (the bundled all-MiniLM-L6-v2, so the replica holds torch's heap as
in serving) and `ivy serve` (1 worker) in front, TULIP_GC_FREEZE and IVY_GC_FREEZE both off, then both on,
alternating for --rounds; each side: closed-loop HTTP client processes for --duration-s, then the
collector's pauses read from both services' `*_gc_pause_seconds{generation}` histograms. Per side: requests,
client latency p50 / p99 / max, and per service the full (generation 2) collections, their mean pause and
the largest bucket one reached, and all collections' seconds per 1000 requests. rose/gc_pauses.py says why.
"""

from __future__ import annotations

import argparse
import json
import time
import urllib.request
from collections import defaultdict

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.overhead import Stack, free_port, http_clients, text_of_tokens
from rose.spec import bundled_model_dir, load_spec
from rose.tokenizer import Tokenizer


def gc_histograms(url: str, name: str) -> dict[str, dict[str, float]]:
    """{generation: {count, sum, le=<bound>: cumulative count...}} of the histogram `name` at url."""
    with urllib.request.urlopen(url, timeout=10) as answer:
        text = answer.read().decode()
    out: dict[str, dict[str, float]] = defaultdict(dict)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.name.startswith(name):
                continue
            gen = sample.labels.get("generation", "?")
            if sample.name.endswith("_bucket"):
                out[gen][f"le={sample.labels['le']}"] = sample.value
            elif sample.name.endswith("_count"):
                out[gen]["count"] = sample.value
            elif sample.name.endswith("_sum"):
                out[gen]["sum"] = sample.value
    return dict(out)


def summary(before: dict, after: dict, requests: int) -> dict:
    """Full collections (count, mean ms, the bound of the largest bucket reached) and all generations'
    collector seconds per 1000 requests, from two scrapes."""
    def change(gen: str, key: str) -> float:
        return after.get(gen, {}).get(key, 0.0) - before.get(gen, {}).get(key, 0.0)

    full = change("2", "count")
    bounds = sorted((float(k[3:]), k) for k in after.get("2", {}) if k.startswith("le="))
    largest = next((b for b, k in bounds if change("2", k) == full), None)  # cumulative: every one was <= b
    seconds = sum(change(g, "sum") for g in ("0", "1", "2"))
    return {"full_collections": int(full), "full_mean_ms": round(change("2", "sum") / full * 1e3, 2) if full else 0.0,
            "full_max_ms_at_most": None if not full or largest is None else largest * 1e3,
            "collections": int(sum(change(g, "count") for g in ("0", "1", "2"))),
            "gc_ms_per_1000_requests": round(seconds * 1e3 / max(requests, 1) * 1000, 2)}


def one_side(freeze: bool, args, body: dict) -> dict:
    flag = "1" if freeze else "0"
    metrics_port = free_port()
    stack = Stack(1, args.model, factory="", metrics_port=metrics_port,
                  env={"TULIP_GC_FREEZE": flag, "IVY_GC_FREEZE": flag})
    try:
        stack.wait_ready(timeout=300)
        tulip_url, ivy_url = f"http://127.0.0.1:{metrics_port}/metrics", f"{stack.url}/metrics"
        http_clients(stack.url, body, args.clients, 3.0)  # warm-up: every batch shape the load makes
        before = {"tulip": gc_histograms(tulip_url, "tulip_gc_pause_seconds"),
                  "ivy": gc_histograms(ivy_url, "ivy_gc_pause_seconds")}
        latencies, _, _ = http_clients(stack.url, body, args.clients, args.duration_s)
        after = {"tulip": gc_histograms(tulip_url, "tulip_gc_pause_seconds"),
                 "ivy": gc_histograms(ivy_url, "ivy_gc_pause_seconds")}
    finally:
        stack.stop()
    lat = np.asarray(latencies) * 1e3
    row = {"freeze": freeze, "requests": len(latencies), "req_per_s": round(len(latencies) / args.duration_s, 1),
           "p50_ms": round(float(np.percentile(lat, 50)), 2), "p99_ms": round(float(np.percentile(lat, 99)), 2),
           "max_ms": round(float(lat.max()), 2)}
    for service in ("tulip", "ivy"):
        row[service] = summary(before[service], after[service], len(latencies))
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=8, help="closed-loop HTTP client processes")
    parser.add_argument("--duration-s", type=float, default=40.0, help="measured seconds per side and round")
    parser.add_argument("--tokens", type=int, default=16, help="tokens per request (one text)")
    parser.add_argument("--rounds", type=int, default=2, help="off/on pairs, alternating")
    parser.add_argument("--model", default=str(bundled_model_dir()), help="model folder (ROSE on the CPU)")
    parser.add_argument("--json", default="", help="write the rows here too")
    args = parser.parse_args()
    text = text_of_tokens(Tokenizer(load_spec(args.model)), args.tokens, args.model)
    body = {"input": [text], "encoding_format": "base64"}
    rows = []
    for _ in range(args.rounds):
        for freeze in (False, True):
            rows.append(one_side(freeze, args, body))
            time.sleep(1)
    print(f"{args.clients} clients x {args.duration_s:g} s, {args.tokens} tokens a request, ROSE on the CPU")
    print(f"{'freeze':>7} {'requests':>9} {'req/s':>7} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7}   "
          f"{'tulip full gcs (mean ms, max <=)':>33} {'gc ms/1k req':>12}   {'ivy full gcs (mean ms, max <=)':>31} "
          f"{'gc ms/1k req':>12}")
    for r in rows:
        t, i = r["tulip"], r["ivy"]
        print(f"{str(r['freeze']):>7} {r['requests']:>9} {r['req_per_s']:>7} {r['p50_ms']:>7} {r['p99_ms']:>7} "
              f"{r['max_ms']:>7}   {t['full_collections']:>14} ({t['full_mean_ms']:>6}, {t['full_max_ms_at_most']}) "
              f"{t['gc_ms_per_1000_requests']:>12}   {i['full_collections']:>12} ({i['full_mean_ms']:>6}, "
              f"{i['full_max_ms_at_most']}) {i['gc_ms_per_1000_requests']:>12}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
