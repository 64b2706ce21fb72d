"""`ivy up`'s supervised child process: output relayed with a prefix, a short tail kept, SIGTERM on our death.

A Child runs in its own session (a terminal's Ctrl-C reaches only `ivy up`, which stops the children in
order) and, on Linux, gets SIGTERM when `ivy up` dies by any means (_parent_death_signal). One that outlives
its drain is SIGKILLed with its whole process group (what it started itself, as the gateway's workers).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections import deque


class Child:
    """A supervised child process whose merged output is relayed with a prefix and kept as a short tail."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        self.name = name
        self.tail: deque[str] = deque(maxlen=60)
        self.proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True,
                                     preexec_fn=_parent_death_signal())
        self._pump = threading.Thread(target=self._relay, daemon=True, name=f"relay-{name}")
        self._pump.start()

    def _relay(self) -> None:
        assert self.proc.stdout is not None
        for raw in iter(self.proc.stdout.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\n")
            self.tail.append(line)
            print(f"[{self.name}] {line}", file=sys.stderr, flush=True)

    def exited(self) -> int | None:
        return self.proc.poll()

    def failure(self, when: str) -> str:
        self._pump.join(timeout=2)
        lines = "\n".join(f"  {line}" for line in self.tail) or "  (no output)"
        return f"ivy up: {self.name} exited with code {self.proc.returncode} {when}; its last output:\n{lines}"

    def stop(self, timeout: float) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._kill_group()
                self.proc.wait()
        self._pump.join(timeout=2)

    def _kill_group(self) -> None:
        """SIGKILL the child and every process of its group (the gateway's uvicorn workers, a Tulip's compile
        workers): its own session made it the group's leader, and the leader is not yet reaped, so the group
        is still this child's."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            self.proc.kill()


def _parent_death_signal(sig: int = signal.SIGTERM):
    """A preexec_fn that makes the child get `sig` (SIGTERM) when `ivy up` dies, even by SIGKILL or the OOM killer
    (Linux; None elsewhere). The children run in their own session (a terminal's Ctrl-C reaches only
    `ivy up`, which stops them in order), so without it a killed `ivy up` would leave them holding the
    ports. libc's prctl is resolved here, in the parent: between fork and exec the child only calls it
    (no imports, no dlopen while the relay threads of earlier children may hold locks)."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()
    PR_SET_PDEATHSIG = 1

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:  # ivy up died before prctl took effect
            os._exit(1)

    return preexec


class Restarts:
    """When `ivy up` starts again a Tulip that failed while serving (a non-zero exit: its GPU lost, a crash): after
    1 s, then 2, 4 ... (at most MAX_BACKOFF_S), at most `most` times in a row; one that served SERVED_RESET_S
    since it was last started counts afresh (crashes weeks apart are not a crash loop). Past `most` it is given up
    (left down: the others serve on). Each Tulip's state: `due[k]` when it starts again (None: running), `gone`."""

    MAX_BACKOFF_S = 60.0
    SERVED_RESET_S = 600.0

    def __init__(self, tulips: int, most: int, now: float) -> None:
        self.most = most
        self.count = [0] * tulips
        self.started = [now] * tulips
        self.due: list[float | None] = [None] * tulips
        self.gone: set[int] = set()

    def failed(self, k: int, now: float) -> float | None:
        """Tulip k was found exited: the delay before it starts again, or None when it is given up."""
        if now - self.started[k] >= self.SERVED_RESET_S:
            self.count[k] = 0
        if self.count[k] >= self.most:
            self.gone.add(k)
            return None
        self.count[k] += 1
        delay = min(self.MAX_BACKOFF_S, 2.0 ** (self.count[k] - 1))
        self.due[k] = now + delay
        return delay

    def started_again(self, k: int, now: float) -> None:
        self.due[k] = None
        self.started[k] = now
