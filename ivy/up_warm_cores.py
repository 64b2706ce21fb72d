"""`ivy up`'s side of `--warm-cores`: whether this host gets the loops, and once the Tulips are ready, the loops
and their Controller (the loop itself and the Controller are ivy/warm_cores.py's: each loop imports only that)."""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

from ivy import warm_cores
from ivy.up_process import _parent_death_signal
from protos.heartbeat import CountReader
from rose.host_cpus import cgroup_cpu_quota

log = logging.getLogger("ivy.up")
COUNTERS_PREFIX = "ivy-up-warm-"  # + the owning `ivy up`'s pid + "-" + mkdtemp's letters, in the temp folder
OWNER_LOCK = "owner.lock"  # in each counters' folder: flocked by its `ivy up` for as long as it lives
_owned: dict[str, object] = {}  # this process's counters' folders -> their open, locked owner files


def counters_dir() -> str:
    """A fresh folder for the replica slots' batch counters, its owner lock held by this process until
    remove_counters (or its death: the kernel drops a dead process's flocks); stale folders removed first."""
    remove_stale()
    path = tempfile.mkdtemp(prefix=f"{COUNTERS_PREFIX}{os.getpid()}-")
    lock = open(os.path.join(path, OWNER_LOCK + ".new"), "w")  # noqa: SIM115 - held open while the stack lives
    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.rename(lock.name, os.path.join(path, OWNER_LOCK))  # seen by remove_stale only once locked
    _owned[path] = lock
    return path


def remove_counters(path: str) -> None:
    """The stack stops: its counters' folder removed, its owner lock let go."""
    shutil.rmtree(path, ignore_errors=True)
    lock = _owned.pop(path, None)
    if lock is not None:
        lock.close()


def remove_stale(root: str | None = None) -> list[str]:
    """Remove the counters' folders an `ivy up` left when it was SIGKILLed (its `finally` never ran): this user's
    folders whose owner lock no process holds (whatever pid namespace it ran in). A folder without the lock file
    (being made, or an older run's) stays, as do another user's, links and what is not a folder. Returns what was
    removed."""
    removed = []
    for path in Path(root or tempfile.gettempdir()).glob(f"{COUNTERS_PREFIX}*"):
        try:
            info = path.lstat()
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or not _unowned(path / OWNER_LOCK):
                continue
        except OSError:
            continue
        shutil.rmtree(path, ignore_errors=True)
        if not path.exists():
            removed.append(str(path))
    if removed:
        log.info("removed %d warm-cores counter folder(s) of stopped `ivy up` runs", len(removed))
    return removed


def _unowned(lock_path: Path) -> bool:
    """Whether no process holds `lock_path`'s flock (False when the file is not there)."""
    with open(lock_path) as lock:  # FileNotFoundError: an OSError, the caller's "stays"
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(lock, fcntl.LOCK_UN)
        return True


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
