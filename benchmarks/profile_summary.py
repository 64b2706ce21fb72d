"""Where a process's CPU goes, from py-spy's collapsed stacks (`py-spy record --format raw --threads`):
samples per thread, and the functions with the most samples on top of the stack (self) and anywhere in it
(inclusive), as shares and as CPU µs per request.

    python -m benchmarks.profile_summary RAW [RAW ...] [--rate 1000] [--requests N] [--top 15] [--json FILE]

py-spy drops idle samples unless --idle, so samples / rate is CPU time (about: a thread in a system call that
py-spy does not count as idle shows up too). A frame is reported as `function (file)` with the line dropped;
file paths are cut to the part after site-packages/ or the repository's root.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from pathlib import Path

_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::\d+)?\)$")


def short_frame(frame: str) -> str:
    m = _FRAME.match(frame.strip())
    if not m:
        return frame.strip()
    path = m["file"]
    for marker in ("site-packages/", "/lib/python3", "dist-packages/"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    else:
        for top in ("/ivy/", "/tulip/", "/rose/", "/protos/", "/benchmarks/"):
            if top in path:
                path = top[1:] + path.split(top, 1)[1]
                break
    return f"{m['func']} ({path})"


def parse(text: str) -> tuple[Counter, Counter, Counter, int]:
    """(samples per thread, self samples per frame, inclusive samples per frame, all samples)."""
    threads, own, inclusive = Counter(), Counter(), Counter()
    total = 0
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        parts = stack.split(";")
        thread = parts[0]
        if thread.startswith("thread ("):
            thread = thread.split(": ", 1)[-1]
            parts = parts[1:]
        frames = [short_frame(p) for p in parts]
        total += n
        threads[thread] += n
        if frames:
            own[frames[-1]] += n
            for f in set(frames):
                inclusive[f] += n
    return threads, own, inclusive, total


def summarize(path: Path, rate: float, requests: int | None, top: int) -> dict:
    threads, own, inclusive, total = parse(path.read_text())
    per_request = (1e6 / rate / requests) if requests else None

    def rows(counter: Counter) -> list[dict]:
        return [{"frame": f, "share": n / total, "us_per_request": n * per_request if per_request else None}
                for f, n in counter.most_common(top)]

    return {"file": path.name, "samples": total, "cpu_s": total / rate,
            "cpu_us_per_request": total * per_request if per_request else None,
            "threads": {t: n / total for t, n in threads.most_common()}, "self": rows(own),
            "inclusive": rows(Counter({f: n for f, n in inclusive.items()}))}


def print_summary(s: dict) -> None:
    per = f", {s['cpu_us_per_request']:.0f} µs CPU a request" if s["cpu_us_per_request"] else ""
    print(f"== {s['file']}: {s['samples']} samples, {s['cpu_s']:.2f} s CPU{per}")
    print("   threads: " + ", ".join(f"{t} {share:.0%}" for t, share in s["threads"].items()))
    for kind in ("self", "inclusive"):
        print(f"   {kind}:")
        for r in s[kind]:
            us = f"{r['us_per_request']:7.1f} µs" if r["us_per_request"] is not None else ""
            print(f"     {r['share']:6.1%} {us}  {r['frame'][:110]}")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("raw", nargs="+", type=Path)
    p.add_argument("--rate", type=float, default=1000.0, help="py-spy's --rate (samples a second)")
    p.add_argument("--requests", type=int, default=None, help="requests served while recording: µs a request")
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    summaries = [summarize(path, args.rate, args.requests, args.top) for path in args.raw]
    for s in summaries:
        print_summary(s)
    if args.json:
        args.json.write_text(json.dumps(summaries, indent=1))


if __name__ == "__main__":
    main()
