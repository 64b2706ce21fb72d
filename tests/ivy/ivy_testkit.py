"""Helpers for Ivy's tests: a gateway app in front of fake Tulip replicas, and model-folder copies."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from starlette.testclient import TestClient

from ivy.app import create_app
from ivy.config import IvyConfig
from rose.spec import bundled_model_dir

MODEL = "sentence-transformers/all-MiniLM-L6-v2"


@contextmanager
def gateway(*fakes, **overrides) -> Iterator[TestClient]:
    """The gateway app in front of `fakes` (anything with an .address; fast health probes), lifespan running."""
    options = dict(replicas=tuple(f.address for f in fakes), health_interval_s=0.1)
    options.update(overrides)
    with TestClient(create_app(IvyConfig(**options)), raise_server_exceptions=False) as client:
        yield client


def model_copy(tmp_path: Path, name: str, *, config: dict | None = None, st_config: dict | None = None) -> Path:
    """A model folder like the bundled one (weights left out) with config.json / prompts overridden."""
    src = bundled_model_dir()
    dst = tmp_path / name
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("model.safetensors", "*.bin", "onnx", "openvino"))
    if config is not None:
        base = json.loads((src / "config.json").read_text())
        base.update(config)
        (dst / "config.json").write_text(json.dumps(base))
    if st_config is not None:
        (dst / "config_sentence_transformers.json").write_text(json.dumps(st_config))
    return dst


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def ivy_process(**env: str) -> Iterator[int]:
    """A real `python -m ivy serve` on a free port with these IVY_* variables, once /ready answers 200;
    yields the port and terminates the process afterwards."""
    with ivy_server(**env) as (port, _):
        yield port


@contextmanager
def ivy_server(_stderr=None, **env: str) -> Iterator[tuple[int, subprocess.Popen]]:
    """As ivy_process, yielding (port, process) for tests that signal the process themselves; its stderr goes
    to `_stderr` (a file) when given."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "ivy", "serve"], env={**os.environ, **env, "IVY_PORT": str(port)},
                            stdout=subprocess.DEVNULL, stderr=_stderr or subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "ivy serve did not become ready"
            time.sleep(0.1)
        yield port, proc
    finally:
        stop_process(proc)


def stop_process(proc: subprocess.Popen, timeout: float = 15) -> None:
    """SIGTERM, then SIGKILL: a test that failed with a request held open must not hang the suite on
    uvicorn's graceful wait, hiding its own error, or leave a stray server behind."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


_TCP_LISTEN = "0A"


def server_sockets(port: int) -> list[tuple[str, int]]:
    """(TCP state, bytes not yet read by the server) of each connection the server on `port` holds (from
    /proc/net/tcp: the server's side of each, listening socket left out): what the server has read, and
    which connections it still has open, seen from outside its process, so a test waits for those states
    instead of sleeping. States: 01 established, 08 close-wait (the client closed, the server not yet)."""
    found = []
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, state, queues = fields[1], fields[3], fields[4]
        if int(local.rsplit(":", 1)[1], 16) == port and state != _TCP_LISTEN:
            found.append((state, int(queues.split(":")[1], 16)))
    return found


def server_has_read_everything(port: int) -> bool:
    """Every byte sent to the server on `port` has been read by its process (no receive queue left)."""
    return all(unread == 0 for _, unread in server_sockets(port))


def server_connections_open(port: int) -> int:
    """Connections the server on `port` has not closed (established or close-wait on its side)."""
    return sum(state in ("01", "08") for state, _ in server_sockets(port))


def event_loop_turned(port: int) -> None:
    """One answer from the server on a new connection: the event loop has run everything that was ready
    before it (requests whose bytes it had read have had their turns)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=30) as r:
        assert r.status == 200
