"""`ivy up`'s side of `--warm-cores`: whether this host gets the loops, and once the Tulips are ready, the loops
and their Controller (the loop itself and the Controller are ivy/warm_cores.py's: each loop imports only that)."""

from __future__ import annotations

import logging
import signal
import subprocess
import sys

from ivy import warm_cores
from ivy.up_process import _parent_death_signal
from protos.heartbeat import CountReader
from rose.host_cpus import cgroup_cpu_quota

log = logging.getLogger("ivy.up")


def allowed(mode: str, gpus: bool) -> bool:
    """Whether `--warm-cores` `mode` (auto | on) starts loops here: Linux's SCHED_IDLE, GPU Tulips, no cgroup CPU
    limit, and for auto a virtual machine; each refusal logged (a warning when the flag asked for them)."""
    level = logging.WARNING if mode == "on" else logging.INFO
    if not warm_cores.supported():
        log.log(level, "--warm-cores needs Linux's SCHED_IDLE; no core is kept warm")
        return False
    if not gpus:  # the cores are the model's: nothing there waits on a device
        log.log(level if mode == "on" else logging.DEBUG,  # auto on a CPU machine: nothing worth a line
                "--warm-cores: no Tulip has a GPU (its cores run the model); no core is kept warm")
        return False
    quota = cgroup_cpu_quota()
    if quota is not None:  # the loops' busy time counts against it and would throttle the stack's own threads
        log.log(level, "--warm-cores: this stack runs under a CPU quota of %d CPUs (a cgroup limit), which busy "
                "loops would spend; no core is kept warm", quota)
        return False
    if mode == "auto" and not warm_cores.in_virtual_machine():
        log.info("--warm-cores auto: not a virtual machine; no core is kept warm (--warm-cores on to keep them)")
        return False
    return True


def start(counters: list[str], mode: str, hold_s: float) -> warm_cores.Controller | None:
    """Once the Tulips are ready: the loops and their Controller over the counters the Tulips made (a Tulip makes
    its own only on a GPU); None, logged, when there is none."""
    readers = open_counters(counters)
    if not readers:
        log.log(logging.WARNING if mode == "on" else logging.INFO,
                "--warm-cores: no Tulip runs on a GPU (TULIP_DEVICE?); no core is kept warm")
        return None
    return warm_cores.Controller(start_loops(), readers, hold_s)


def open_counters(paths: list[str]) -> list:
    """Readers of the counters that exist once the Tulips are ready: a Tulip makes its own only on a GPU."""
    readers = []
    for path in paths:
        try:
            readers.append(CountReader(path).read)
        except OSError:
            continue
    return readers


def start_loops() -> list[subprocess.Popen]:
    """One warm_cores loop per usable core, in its own session, SIGKILLed should `ivy up` die (a stopped loop
    would hold a SIGTERM until continued)."""
    cpus = warm_cores.affinity_cpus()
    procs = [subprocess.Popen(warm_cores.argv(cpu), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              start_new_session=True,
                              preexec_fn=_parent_death_signal(signal.SIGKILL))  # noqa: PLW1509
             for cpu in cpus]
    print(f"ivy up: cores {cpus[0]}-{cpus[-1]} kept out of idle while the Tulips work ({len(cpus)} "
          f"lowest-priority loops; --warm-cores off to stop them)", file=sys.stderr, flush=True)
    return procs
