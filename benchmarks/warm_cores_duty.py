"""What `ivy up --warm-cores` loops cost and when: their CPU while the stack idles, while one client is served,
and once the client has stopped (after the loops' hold), beside the client's p50.

    python -m benchmarks.warm_cores_duty --url http://127.0.0.1:8080 --model NAME [--serve-s 5] [--idle-s 5]
        [--tokens 128] [--hold-s 1.0] [--json FILE]

The loops are found by their command line (`python -m ivy.warm_cores CPU ...`, any process on the host); their
CPU is read from /proc and reported in cores (CPU seconds over wall seconds). One closed-loop client sends
`--tokens` token ids a request (benchmarks.stack.client). `ivy up` runs the loops only while its Tulips launch
batches (ivy/warm_cores.py): ~0 cores idle and after the hold, up to one per core served (less what the
stack's own threads take).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from benchmarks.overhead import cpu_seconds
from benchmarks.stack.client import StackClient
from ivy import warm_cores


def loop_pids() -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"ivy.warm_cores" in argv:
                pids.append(int(entry.name))
    return sorted(pids)


def phase(name: str, pids: list[int], seconds: float, work=None) -> dict:
    """The loops' CPU over `seconds` (in cores), while `work` (a callable returning latencies in s) runs or not."""
    before, start = cpu_seconds(pids), time.monotonic()
    latencies = work(seconds) if work else time.sleep(seconds) or []
    wall = time.monotonic() - start
    cores = (cpu_seconds(pids) - before) / wall
    p50 = statistics.median(latencies) * 1e3 if latencies else None
    return {"phase": name, "wall_s": round(wall, 2), "loops": len(pids), "loops_cores": round(cores, 2),
            "requests": len(latencies), "p50_ms": round(p50, 3) if p50 else None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.warm_cores_duty", description=__doc__.split("\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8080")
    parser.add_argument("--model", required=True, help="the served model name")
    parser.add_argument("--serve-s", type=float, default=5.0)
    parser.add_argument("--idle-s", type=float, default=5.0)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--hold-s", type=float, default=warm_cores.HOLD_S, help="the loops' hold (waited out)")
    parser.add_argument("--json", default="")
    args = parser.parse_args(argv)
    pids = loop_pids()
    client = StackClient(args.url, args.model, encoding_format="base64")
    ids = [[101] + [2000 + i for i in range(args.tokens - 2)] + [102]]
    client.embed_ids(ids, args.tokens)  # warm: the layout's graph exists

    def serve(seconds: float) -> list[float]:
        out, end = [], time.monotonic() + seconds
        while time.monotonic() < end:
            out.append(client.embed_ids(ids, args.tokens).latency_s)
        return out

    time.sleep(args.hold_s + 0.5)
    rows = [phase("idle", pids, args.idle_s), phase("serving", pids, args.serve_s, serve)]
    time.sleep(args.hold_s + 0.5)
    rows.append(phase("after", pids, args.idle_s))
    client.close()
    print(f"{'phase':8s} {'wall s':>7s} {'loops':>6s} {'loop cores':>11s} {'requests':>9s} {'p50 ms':>7s}")
    for r in rows:
        p50 = f"{r['p50_ms']:7.3f}" if r["p50_ms"] is not None else "      -"
        print(f"{r['phase']:8s} {r['wall_s']:7.2f} {r['loops']:6d} {r['loops_cores']:11.2f} {r['requests']:9d} {p50}")
    if args.json:
        Path(args.json).write_text(json.dumps({"records": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
