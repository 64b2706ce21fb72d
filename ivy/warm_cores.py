"""Cores kept out of idle while the stack serves: one lowest-priority loop per core (`ivy up --warm-cores`).

On a host whose idle cores halt (a virtual machine's vCPUs, a bare-metal core in a deep C-state), every thread
the stack wakes, an event loop on a socket or the completer's hand-off, first waits for its core to come back
and then runs cold: on the lent H200 host (a microVM) one 128-token request through Ivy and Tulip spent ~0.5
ms of its ~2.9 ms on that (benchmarks/NOTES.md, "Cores kept out of idle"). A loop that runs only when nothing
else wants the core (SCHED_IDLE, pinned to it) keeps the core busy without taking time from anything else: a
woken thread preempts it at once. Linux only.

- The loop yields the core on every turn: a thread that only yields (a `tokenizers` worker between tasks calls
  sched_yield while it waits for work) does not wake and so does not preempt it, and a loop that kept the core
  could hold that thread until the next scheduler tick (the text path's p99 at 2.2-2.4 x its p50 in the one
  layers run of a `pass` loop; NOTES, "The layers at 9ffbd3f").
- It spins only while the stack serves: given the Tulip processes to watch, it reads their CPU time every
  CHECK_S and spins while they used at least ACTIVE_TICKS clock ticks (10 ms each) in the last WINDOW_S, and
  HOLD_S after; otherwise it sleeps. An idle stack's loops cost ~nothing (an idle Tulip uses ~1 ms a second);
  the first requests after a quiet spell meet cold cores until the loops notice (within ~CHECK_S of enough
  work). Without a process to watch it spins for good.

Each spinning loop shows as a busy core, and under a cgroup CPU limit that use would count against the quota
and throttle the real threads, so `ivy up` starts none under one (ivy/up.py decides when to start them).

    python -m ivy.warm_cores CPU [--watch PID,PID] [--hold-s 1.0]   # one loop, pinned to CPU
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import deque

CHECK_S = 0.05  # how often a loop reads the watched processes' CPU time
WINDOW_S = 1.0  # the span their use is summed over
ACTIVE_TICKS = 2  # ticks (of 10 ms) used in the window that count as serving: >= ~10 ms a second
HOLD_S = 1.0  # how long a loop keeps spinning after the stack last served


def affinity_cpus() -> list[int]:
    """The CPUs this process may run on (its affinity), sorted: the cores to keep warm. Not
    rose.host_cpus.usable_cpus, a count lowered to a CPU quota (under which no core should be kept warm)."""
    return sorted(os.sched_getaffinity(0))


def supported() -> bool:
    return hasattr(os, "sched_setscheduler") and hasattr(os, "SCHED_IDLE") and hasattr(os, "sched_setaffinity")


def in_virtual_machine(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """The CPU reports a hypervisor (x86's `hypervisor` flag): an idle vCPU exits to the host, whose wake-up is
    what the loops save (measured on such a host only)."""
    try:
        with open(cpuinfo) as f:
            return any(line.startswith("flags") and " hypervisor" in line for line in f)
    except OSError:
        return False


def cpu_ticks(pids: tuple[int, ...]) -> int:
    """User + system clock ticks used so far by these processes (all their threads); a process gone counts 0."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime: the 14th and 15th fields of the line
    return total


class Activity:
    """Whether the watched processes serve: fed (time, their ticks) every CHECK_S, `busy` is True while they
    used ACTIVE_TICKS or more in the last WINDOW_S, and for HOLD_S after."""

    def __init__(self, hold_s: float = HOLD_S, window_s: float = WINDOW_S, active_ticks: int = ACTIVE_TICKS) -> None:
        self.hold_s, self.window_s, self.active_ticks = hold_s, window_s, active_ticks
        self._seen: deque[tuple[float, int]] = deque()
        self._busy_until = float("-inf")

    def update(self, now: float, ticks: int) -> bool:
        seen = self._seen
        seen.append((now, ticks))
        while len(seen) > 1 and seen[1][0] <= now - self.window_s:  # keep one reading at or before the window
            seen.popleft()
        if ticks - seen[0][1] >= self.active_ticks:
            self._busy_until = now + self.hold_s
        return now < self._busy_until


def spin(cpu: int, watch: tuple[int, ...] = (), hold_s: float = HOLD_S) -> int:
    """Pin to `cpu`, drop to SCHED_IDLE, then loop until killed: for good without `watch`, else while the
    watched processes serve. Where either setting is refused (a seccomp profile, a CPU outside the cgroup's
    set) it says so and returns 1: a loop at normal priority would take the core."""
    try:
        os.sched_setaffinity(0, {cpu})
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except OSError as exc:
        print(f"ivy.warm_cores: core {cpu} not kept warm: {exc}", file=sys.stderr, flush=True)
        return 1
    if not watch:
        while True:  # each turn hands the core to any runnable thread, one that merely yielded it included
            os.sched_yield()
    activity = Activity(hold_s)
    clock, yield_core = time.monotonic, os.sched_yield
    while True:
        now = clock()
        if activity.update(now, cpu_ticks(watch)):
            check_at = now + CHECK_S
            while clock() < check_at:
                yield_core()
        else:
            time.sleep(CHECK_S)  # the core may halt: nothing is served


def argv(cpu: int, watch: tuple[int, ...] = (), hold_s: float = HOLD_S) -> list[str]:
    """The command line of one loop (what `ivy up` starts per core)."""
    out = [sys.executable, "-m", "ivy.warm_cores", str(cpu)]
    if watch:
        out += ["--watch", ",".join(map(str, watch)), "--hold-s", f"{hold_s:g}"]
    return out


def main(args: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ivy.warm_cores", description=__doc__.split("\n")[0])
    parser.add_argument("cpu", type=int, help="the core to keep warm")
    parser.add_argument("--watch", default="", help="comma-separated PIDs: spin only while they serve")
    parser.add_argument("--hold-s", type=float, default=HOLD_S, help="seconds to keep spinning after they served")
    ns = parser.parse_args(args)
    try:
        watch = tuple(int(p) for p in ns.watch.split(",") if p.strip())
    except ValueError:
        parser.error(f"--watch takes comma-separated PIDs, not {ns.watch!r}")
    return spin(ns.cpu, watch, ns.hold_s)


if __name__ == "__main__":
    sys.exit(main())
