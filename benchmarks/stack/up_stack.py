"""`ivy up` as a benchmark's child process: started with its own environment and flags, ready when the gateway's
/ready answers 200, stopped with SIGTERM (the gateway first, then the Tulips drain; ivy up's own order).

For benchmarks that compare stack configurations in one run (lanes on and off: benchmarks/stack/lanes.py)
or drive a stack with a tool of their own (`ivy index`: benchmarks/stack/index.py). The child's output goes
to a log file; when the stack fails to start, its tail is in the raised error. The child gets SIGTERM
when the benchmark dies, even by SIGKILL (Linux), so a killed benchmark never leaves a stack on the ports.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from benchmarks.stack.config import _f

from ivy.http_connection import Connection, HTTPError
from ivy.up_process import _parent_death_signal  # ivy up's own: its children get SIGTERM when it dies


REPO = Path(__file__).resolve().parents[2]


class StackFailed(RuntimeError):
    """`ivy up` exited or did not become ready in time."""


class Terminated(Exception):
    """SIGTERM reached the benchmark (a `timeout` around it): the stack is stopped and the file written."""


def raise_on_sigterm() -> None:
    """SIGTERM raises Terminated in the main thread, so `finally` stops the stack instead of orphaning it."""
    def handler(signum, frame):  # noqa: ANN001
        raise Terminated("SIGTERM: stopped before the end")

    signal.signal(signal.SIGTERM, handler)


@dataclass(frozen=True)
class UpStackFields:
    """The `ivy up` flags of a benchmark that starts its own stacks (its config dataclass derives from this)."""

    port: int = _f(8080, "the gateway's port (ivy up --port)")
    tulip_port: int = _f(50051, "the first Tulip's port (ivy up --tulip-port)")
    metrics_port: int = _f(0, "the first Tulip's metrics port; 0 = tulip_port + 100")
    up_flags: str = _f("", "more `ivy up` flags, one shell-quoted string (e.g. \"--gpus 0\")")
    startup_timeout_s: float = _f(300.0, "most seconds a stack may take to become ready")


class UpStack:
    @classmethod
    def of(cls, model_dir: str, log_path: Path, config: UpStackFields,
           env: dict[str, str] | None = None) -> UpStack:
        """The stack a benchmark's config asks for."""
        return cls(model_dir, log_path, port=config.port, tulip_port=config.tulip_port,
                   metrics_port=config.metrics_port or None, env=env, flags=shlex.split(config.up_flags),
                   startup_timeout_s=config.startup_timeout_s)

    def __init__(self, model_dir: str, log_path: Path, *, port: int = 8080, tulip_port: int = 50051,
                 metrics_port: int | None = None, env: dict[str, str] | None = None, flags: Sequence[str] = (),
                 startup_timeout_s: float = 300.0) -> None:
        self.model_dir, self.log_path, self.port, self.tulip_port = model_dir, log_path, port, tulip_port
        self.metrics_port = tulip_port + 100 if metrics_port is None else metrics_port
        self.env = dict(env or {})
        self.flags = list(flags)
        self.startup_timeout_s = startup_timeout_s
        self.url = f"http://127.0.0.1:{port}"
        self.metrics_url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        self.ready_s: float | None = None
        self._proc: subprocess.Popen | None = None

    @property
    def pid(self) -> int | None:
        """`ivy up`'s process id while it runs (the root of the stack's process tree)."""
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def argv(self) -> list[str]:
        model = ["--model", self.model_dir] if self.model_dir else []
        return [sys.executable, "-m", "ivy", "up", *model, "--port", str(self.port), "--tulip-port",
                str(self.tulip_port), "--tulip-metrics-port", str(self.metrics_port), *self.flags]

    def start(self) -> "UpStack":
        path = [str(REPO), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(path), **self.env}
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(self.argv(), env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, preexec_fn=_parent_death_signal())
        probe = Connection(self.url, timeout_s=2)
        try:
            while time.monotonic() - started < self.startup_timeout_s:
                if self._proc.poll() is not None:
                    raise StackFailed(f"ivy up exited with {self._proc.returncode}:\n{self.tail()}")
                try:
                    if probe.get("/ready").status_code == 200:
                        self.ready_s = round(time.monotonic() - started, 2)
                        return self
                except HTTPError:
                    pass
                time.sleep(0.25)
        finally:
            probe.close()
        self.stop()
        raise StackFailed(f"ivy up was not ready within {self.startup_timeout_s:g} s:\n{self.tail()}")

    def stop(self, timeout_s: float = 60.0) -> int | None:
        """SIGTERM and wait (SIGKILL past `timeout_s`); the exit code, None when it was not running."""
        proc, self._proc = self._proc, None
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        return proc.returncode

    def tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(text[-lines:])

    def __enter__(self) -> "UpStack":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
