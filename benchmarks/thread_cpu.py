"""Each thread's CPU from /proc, split into user and kernel time, with its wait on a run queue and its switches:
what a process spends per request, and whether that is Python and C in user space or the kernel.

    python -m benchmarks.thread_cpu snap PID [PID ...] > before.json
    python -m benchmarks.thread_cpu diff before.json after.json [--requests N] [--json FILE]
    python -m benchmarks.thread_cpu tables DIR   # DIR's threads_<label>.json beside their layers records

`snap` reads /proc/PID/task/TID/{stat,schedstat,status,comm}; `diff` prints, per process and thread (the
main thread first, then by CPU), user and system µs, run-queue wait µs (runnable but not running: a busy core,
or the host not running the vCPU) and voluntary / involuntary switches, per request when N is given. Linux
only; utime and stime come in clock ticks (10 ms), so a window wants seconds of work.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def _thread(pid: int, tid: int) -> dict | None:
    base = Path(f"/proc/{pid}/task/{tid}")
    try:
        stat = (base / "stat").read_text()
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) "
        run_ns, wait_ns, slices = (int(x) for x in (base / "schedstat").read_text().split()[:3])
        status = dict(line.split(":", 1) for line in (base / "status").read_text().splitlines() if ":" in line)
        return {"comm": (base / "comm").read_text().strip(), "user_s": int(fields[11]) * TICK_S,
                "sys_s": int(fields[12]) * TICK_S, "run_s": run_ns / 1e9, "wait_s": wait_ns / 1e9, "slices": slices,
                "voluntary": int(status["voluntary_ctxt_switches"]),
                "involuntary": int(status["nonvoluntary_ctxt_switches"])}
    except (OSError, ValueError, KeyError):
        return None  # the thread ended meanwhile


def snap(pids: list[int]) -> dict:
    out = {}
    for pid in pids:
        try:
            tids = sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))
        except OSError:
            continue
        out[str(pid)] = {str(t): s for t in tids if (s := _thread(pid, t)) is not None}
    return out


def diff(before: dict, after: dict, requests: int | None = None) -> list[dict]:
    rows = []
    scale = (1.0 / requests) if requests else 1.0  # per request, else the whole window
    per = 1e6 * scale  # seconds -> µs
    for pid, threads in after.items():
        for tid, a in threads.items():
            b = before.get(pid, {}).get(tid) or dict.fromkeys(a, 0)  # started since `before`: all of it
            d = {k: a[k] - b[k] for k in ("user_s", "sys_s", "run_s", "wait_s", "slices", "voluntary", "involuntary")}
            if d["run_s"] <= 0 and d["slices"] == 0:
                continue
            rows.append({"pid": int(pid), "tid": int(tid), "main": pid == tid, "comm": a["comm"],
                         "user_us": d["user_s"] * per, "sys_us": d["sys_s"] * per, "run_us": d["run_s"] * per,
                         "runqueue_wait_us": d["wait_s"] * per, "voluntary": d["voluntary"] * scale,
                         "involuntary": d["involuntary"] * scale})
    rows.sort(key=lambda r: (r["pid"], not r["main"], -r["run_us"]))
    return rows


def print_rows(rows: list[dict], label: str = "", requests: int | None = None) -> None:
    unit = "per request" if requests else "whole window"
    print(f"{label} ({unit}): pid tid | on-CPU µs (user + sys, ticks) | run-queue wait µs | switches vol / invol")
    for r in rows:
        if r["run_us"] < (1.0 if requests else 1e4):
            continue
        print(f"  {r['pid']:>7d} {r['tid']:>7d}{' main' if r['main'] else '     '} | {r['run_us']:8.1f} "
              f"({r['user_us']:7.1f} + {r['sys_us']:7.1f}) | {r['runqueue_wait_us']:7.1f} | "
              f"{r['voluntary']:6.2f} / {r['involuntary']:5.2f}")


def tables(folder: Path) -> str:
    """The tables a stack-profile call printed, again, from its threads_<label>.json and the layers records
    stack_layers_<model>_<label>.json beside them (requests: Tulip's batches, one request each at one client)."""
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        for path in sorted(folder.glob("threads_*.json")):
            label = path.stem[len("threads_"):]
            records = json.loads(next(folder.glob(f"stack_layers_*_{label}.json")).read_text())["records"]
            r = next(r for r in records if not r.get("error"))
            n = int((r.get("server") or {}).get("batches") or 0) or None
            print(f"-- {label}: p50 {r['p50_ms']:.3f} ms, p99 {r['p99_ms']:.3f} ms, {n} requests")
            print_rows(json.loads(path.read_text()), label, n)
    return out.getvalue()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("snap")
    s.add_argument("pids", nargs="+", type=int)
    d = sub.add_parser("diff")
    d.add_argument("before", type=Path)
    d.add_argument("after", type=Path)
    d.add_argument("--requests", type=int, default=None)
    d.add_argument("--label", default="")
    d.add_argument("--json", type=Path, default=None)
    t = sub.add_parser("tables")
    t.add_argument("folder", type=Path)
    args = p.parse_args(argv)
    if args.cmd == "tables":
        print(tables(args.folder), end="")
        return
    if args.cmd == "snap":
        json.dump(snap(args.pids), sys.stdout)
        return
    rows = diff(json.loads(args.before.read_text()), json.loads(args.after.read_text()), args.requests)
    print_rows(rows, args.label, args.requests)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
