"""Cores kept out of idle for the stack: one busy loop per core at the lowest scheduling class (`ivy up --warm-cores`).

On a host whose idle cores halt (a microVM's vCPUs, a bare-metal core in a deep C-state), every thread the
stack wakes, an event loop on a socket or the completer's hand-off, first waits for its core to come back
and then runs cold: on the lent H200 host one 128-token request through Ivy and Tulip spent ~0.5 ms of its
~2.9 ms on that (benchmarks/NOTES.md, "Cores kept out of idle"). A loop that runs only when nothing else
wants the core (SCHED_IDLE, pinned to it) keeps the core busy without taking time from anything else: a
woken thread preempts it at once. Linux only. The loop yields the core on every turn: a thread that only
yields (a `tokenizers` worker between tasks calls sched_yield while it waits for work) does not wake and so
does not preempt it, and a loop that kept the core could hold that thread until the next scheduler tick. A
plain `pass` loop, in its one whole layers run, left the text path's p99 at 2.2-2.4 x its p50 (the only path
whose requests wake those workers; NOTES, "The layers at 9ffbd3f").

The cost: each loop shows as a full core of CPU use, and under a cgroup CPU limit (a Kubernetes pod with a
CPU limit) that use would count against the quota and throttle the real threads, so `ivy up` starts no loop
under one: for hosts whose cores serve the stack alone. Off by default.

    python -m ivy.warm_cores CPU     # the loop itself, pinned to CPU (what `ivy up` starts per core)
"""

from __future__ import annotations

import os
import sys


def affinity_cpus() -> list[int]:
    """The CPUs this process may run on (its affinity), sorted: the cores to keep warm. Not
    rose.host_cpus.usable_cpus, a count lowered to a CPU quota (under which no core should be kept warm)."""
    return sorted(os.sched_getaffinity(0))


def supported() -> bool:
    return hasattr(os, "sched_setscheduler") and hasattr(os, "SCHED_IDLE") and hasattr(os, "sched_setaffinity")


def spin(cpu: int) -> int:
    """Pin to `cpu`, drop to SCHED_IDLE, then loop until killed. Where either is refused (a seccomp profile, a
    CPU outside the cgroup's set) it says so and returns 1: a loop at normal priority would take the core."""
    try:
        os.sched_setaffinity(0, {cpu})
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except OSError as exc:
        print(f"ivy.warm_cores: core {cpu} not kept warm: {exc}", file=sys.stderr, flush=True)
        return 1
    while True:  # each turn hands the core to any runnable thread, one that merely yielded it included
        os.sched_yield()


def argv(cpu: int) -> list[str]:
    return [sys.executable, "-m", "ivy.warm_cores", str(cpu)]


if __name__ == "__main__":
    if len(sys.argv) != 2 or not sys.argv[1].isdigit():
        raise SystemExit("usage: python -m ivy.warm_cores CPU")
    sys.exit(spin(int(sys.argv[1])))
