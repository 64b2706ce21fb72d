"""Where a process's CPU goes, from py-spy's collapsed stacks (`py-spy record --format raw --threads`):
samples per thread, and the functions with the most samples on top of the stack (self) and anywhere in it
(inclusive), as shares and as CPU µs per request.

    python -m benchmarks.profile_summary RAW [RAW ...] [--rate 1000] [--requests N] [--top 15] [--json FILE]

py-spy drops idle samples unless --idle, so samples / rate is CPU time (about: a thread in a system call that
py-spy does not count as idle shows up too). With --native (py-spy's C frames; it then keeps blocked threads),
`--drop-idle` drops the stacks whose C leaf is a blocking wait (epoll, poll, futex and the like, and libc code
at an address without a symbol, which is where its futex waits show) and reports their share apart. A frame is reported as `function (file)` with the line dropped;
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


IDLE_LEAVES = ("epoll_wait", "epoll_pwait", "poll", "ppoll", "select", "pselect", "nanosleep", "clock_nanosleep",
               "pthread_cond_wait", "pthread_cond_timedwait", "sem_wait", "sem_timedwait", "do_futex_wait",
               "__futex_abstimed_wait_common", "syscall", "accept", "accept4", "recv", "recvmsg", "read")


def is_idle_leaf(frame: str) -> bool:
    name = frame.split(" (", 1)[0]
    return name in IDLE_LEAVES or (name.startswith("0x") and "(libc.so" in frame)


def parse(text: str, drop_idle: bool = False) -> tuple[Counter, Counter, Counter, int, int]:
    """(samples per thread, self samples per frame, inclusive samples per frame, samples kept, dropped as idle)."""
    threads, own, inclusive = Counter(), Counter(), Counter()
    total = dropped = 0
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
        if drop_idle and frames and is_idle_leaf(frames[-1]):
            dropped += n
            continue
        total += n
        threads[thread] += n
        if frames:
            own[frames[-1]] += n
            for f in set(frames):
                inclusive[f] += n
    return threads, own, inclusive, total, dropped


def summarize(path: Path, rate: float, requests: int | None, top: int, drop_idle: bool = False) -> dict:
    threads, own, inclusive, total, dropped = parse(path.read_text(), drop_idle)
    total = max(total, 1)
    per_request = (1e6 / rate / requests) if requests else None

    def rows(counter: Counter) -> list[dict]:
        return [{"frame": f, "share": n / total, "us_per_request": n * per_request if per_request else None}
                for f, n in counter.most_common(top)]

    return {"file": path.name, "samples": total, "idle_dropped": dropped, "cpu_s": total / rate,
            "cpu_us_per_request": total * per_request if per_request else None,
            "threads": {t: n / total for t, n in threads.most_common()}, "self": rows(own),
            "inclusive": rows(inclusive)}


def print_summary(s: dict) -> None:
    per = f", {s['cpu_us_per_request']:.0f} µs CPU a request" if s["cpu_us_per_request"] else ""
    idle = f" ({s['idle_dropped']} dropped as waiting)" if s.get("idle_dropped") else ""
    print(f"== {s['file']}: {s['samples']} samples{idle}, {s['cpu_s']:.2f} s CPU{per}")
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
    p.add_argument("--drop-idle", action="store_true", help="drop stacks whose C leaf is a blocking wait")
    args = p.parse_args(argv)
    summaries = [summarize(path, args.rate, args.requests, args.top, args.drop_idle) for path in args.raw]
    for s in summaries:
        print_summary(s)
    if args.json:
        args.json.write_text(json.dumps(summaries, indent=1))


if __name__ == "__main__":
    main()
