"""Helpers for the end-to-end tests: real `ivy up` / `ivy serve` / `tulip serve` processes on free loopback ports."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import deque

STARTUP_TIMEOUT_S = 300


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_status(url: str, timeout: float = 5.0) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


def _sighup_default() -> None:
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


class Proc:
    """A child process whose stdout and stderr are collected (last lines kept) by background threads."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None) -> None:
        self.argv = argv
        self.out: deque[str] = deque(maxlen=200)
        self.err: deque[str] = deque(maxlen=200)
        # SIGHUP at its default, as under a terminal: a test run under nohup would hand its ignore down and
        # `ivy up` (rightly) keeps running when it gets one.
        self.proc = subprocess.Popen(argv, env={**os.environ, **(env or {})}, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                                     preexec_fn=_sighup_default)
        for stream, sink in ((self.proc.stdout, self.out), (self.proc.stderr, self.err)):
            threading.Thread(target=self._drain, args=(stream, sink), daemon=True).start()

    @staticmethod
    def _drain(stream, sink) -> None:
        for line in stream:
            sink.append(line.rstrip("\n"))

    def output(self) -> str:
        return "\n".join(["--- stdout", *self.out, "--- stderr", *self.err])

    def wait_for(self, predicate, what: str, timeout: float = STARTUP_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if self.proc.poll() is not None:
                raise AssertionError(f"{what}: process exited with {self.proc.returncode}\n{self.output()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: not reached in {timeout} s\n{self.output()}")
            time.sleep(0.2)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def ivy(*args: str, env: dict[str, str] | None = None) -> Proc:
    return Proc([sys.executable, "-m", "ivy", *args], env)


def ivy_up(*args: str, env: dict[str, str] | None = None, attempts: int = 3) -> tuple[Proc, int]:
    """`ivy up` on free ports, once it says it is ready; (process, HTTP port). Started again on new ports
    when a port free_port() picked was taken before the server bound it (it closes its probe first, and
    another process may take the port in between: a bind error, not a failure of the stack)."""
    for attempt in range(attempts):
        port = free_port()
        proc = ivy("up", "--port", str(port), "--tulip-port", str(free_port()), "--tulip-metrics-port",
                   str(free_port()), *args, env=env)
        try:
            proc.wait_for(lambda: any("Ivy is ready at" in line for line in proc.out), "ivy up ready")
            return proc, port
        except AssertionError:
            output = proc.output().lower()
            proc.stop()
            lost_a_port = "address already in use" in output or "failed to bind" in output
            if not lost_a_port or attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


def tulip(port: int, env: dict[str, str] | None = None) -> Proc:
    return Proc([sys.executable, "-m", "tulip", "serve", "--port", str(port)], env)


def metric_values(text: str, name: str) -> dict[str, float]:
    """{label string: value} for one metric family in Prometheus text format."""
    out = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            labels, value = line[len(name):].rsplit(" ", 1)
            out[labels] = float(value)
    return out
