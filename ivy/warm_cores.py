"""Cores kept out of idle while the stack serves: one lowest-priority loop per core (`ivy up --warm-cores`).

On a host whose idle cores halt (a virtual machine's vCPUs, a bare-metal core in a deep C-state), every thread
the stack wakes, an event loop on a socket or the completer's hand-off, first waits for its core to come back
and then runs cold: on the lent H200 host (a microVM) one 128-token request through Ivy and Tulip spent ~0.5
ms of its ~2.9 ms on that (benchmarks/NOTES.md, "Cores kept out of idle"). A loop that runs only when nothing
else wants the core (SCHED_IDLE, pinned to it) keeps the core busy without taking time from anything else: a
woken thread preempts it at once. Only inside its own cgroup, though: SCHED_IDLE ranks a task below its cgroup's
other tasks, while busy processes in other cgroups (other services or containers on the host) still share the
CPU with the loops' cgroup as a whole, so the loops are for hosts whose cores serve the stack alone. The kernel's
autogroups (one per session, where on) would do the same to the stack's own sessions: each loop lowers its
group to nice 19 (`lowest_autogroup`; without it, loops beside a CPU-bound Tulip made its requests ~9 x slower on
this project's 2-core VM). Linux only.

- The loop yields the core on every turn: a thread that only yields (a `tokenizers` worker between tasks calls
  sched_yield while it waits for work) does not wake and so does not preempt it, and a loop that kept the core
  could hold that thread until the next scheduler tick (the text path's p99 at 2.2-2.4 x its p50 in the one
  layers run of a `pass` loop; NOTES, "The layers at 9ffbd3f").
- It runs only while the stack serves: `ivy up` gives each Tulip a batch counter (TULIP_ACTIVITY_FILE,
  protos/heartbeat.py; a Tulip makes it only on a GPU) and its Controller, polled every POLL_S, sends the loops
  SIGCONT while any counter moved in the last HOLD_S and SIGSTOP after, so an idle stack's loops take no CPU
  (each is still a Python process of ~11 MB) and its cores may halt. The loop
  itself stays the plain one measured: no clock, no file read, no check between its turns. The first requests
  after a quiet spell meet cold cores until the next poll.

Each spinning loop shows as a busy core, and under a cgroup CPU limit that use would count against the quota
and throttle the real threads, so `ivy up` starts none under one (ivy/up_warm_cores.py decides when to start them).

    python -m ivy.warm_cores CPU     # one loop, pinned to CPU (what `ivy up` starts per core)
"""

from __future__ import annotations

import os
import signal
import sys

POLL_S = 0.1  # how often `ivy up` reads its Tulips' batch counters
HOLD_S = 1.0  # how long the loops keep running after a Tulip last launched a batch


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


class Controller:
    """The loops run while any Tulip's batch counter moved in the last `hold_s`, and are stopped otherwise:
    `tick(now)` every POLL_S reads the counters (`readers`: callables returning a count, None while unreadable)
    and sends SIGCONT or SIGSTOP when that changes. The loops start running; the first tick counts as activity
    (the Tulips' warm-up), so they stop `hold_s` after it."""

    def __init__(self, loops: list, readers: list, hold_s: float = HOLD_S) -> None:
        self.loops, self.readers, self.hold_s = loops, readers, hold_s
        self._last: list[int | None] | None = None
        self._busy_until = float("-inf")
        self.running = True
        self.switches = 0  # SIGSTOP / SIGCONT rounds sent

    def tick(self, now: float) -> bool:
        counts = [read() for read in self.readers]
        if counts != self._last:
            self._busy_until = now + self.hold_s
            self._last = counts
        want = now <= self._busy_until  # a hold of 0 runs them from one tick that saw a batch to the next
        if want != self.running:
            self.running = want
            self.switches += 1
            for loop in self.loops:
                if loop.poll() is None:  # a loop that exited: its pid may be another process's by now
                    try:
                        os.kill(loop.pid, signal.SIGCONT if want else signal.SIGSTOP)
                    except ProcessLookupError:
                        pass
        return want


def lowest_autogroup(path: str = "/proc/self/autogroup") -> bool:
    """Give this process's autogroup the lowest weight (nice 19). With the kernel's autogroups on (the default
    of many distributions and of the H200 guest), CPU time is shared between sessions first and SCHED_IDLE ranks
    a task only inside its own: a loop in its own session would get a fair share of its core against the
    session of a Tulip or an Ivy worker. At nice 19 its group weighs 15 against their 1024. False where there
    are no autogroups (a cgroup with the cpu controller, or the feature off): SCHED_IDLE suffices there."""
    try:
        with open(path, "w") as f:
            f.write("19")
        return True
    except OSError:
        return False


def spin(cpu: int) -> int:
    """Pin to `cpu`, drop to SCHED_IDLE, then loop until killed. Where either is refused (a seccomp profile, a
    CPU outside the cgroup's set) it says so and returns 1: a loop at normal priority would take the core."""
    try:
        os.sched_setaffinity(0, {cpu})
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except OSError as exc:
        print(f"ivy.warm_cores: core {cpu} not kept warm: {exc}", file=sys.stderr, flush=True)
        return 1
    lowest_autogroup()
    while True:  # each turn hands the core to any runnable thread, one that merely yielded it included
        os.sched_yield()


def argv(cpu: int) -> list[str]:
    return [sys.executable, "-m", "ivy.warm_cores", str(cpu)]


if __name__ == "__main__":
    if len(sys.argv) != 2 or not sys.argv[1].isdigit():
        raise SystemExit("usage: python -m ivy.warm_cores CPU")
    sys.exit(spin(int(sys.argv[1])))
