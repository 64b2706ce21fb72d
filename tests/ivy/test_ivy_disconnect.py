"""A client that disconnects mid-request: Ivy cancels the request's gRPC calls, so the replica drops the work."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from fake_tulip import FakeTulip, wait_until

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def test_disconnect_cancels_the_replica_call() -> None:
    gate = threading.Event()
    port = _free_port()
    with FakeTulip(gate=gate) as fake:
        env = {**os.environ, "IVY_REPLICAS": fake.address, "IVY_PORT": str(port)}
        proc = subprocess.Popen([sys.executable, "-m", "ivy", "serve"], env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 60
            while not _ready(f"http://127.0.0.1:{port}/ready"):
                assert proc.poll() is None and time.monotonic() < deadline
                time.sleep(0.1)
            body = json.dumps({"input": ["held at the replica"]}).encode()
            sock = socket.create_connection(("127.0.0.1", port))
            sock.sendall(b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            wait_until(lambda: fake.waiting == 1)
            sock.close()
            wait_until(lambda: fake.waiting == 0)  # the Embed call was cancelled, not left to run
            gate.set()
            assert fake.calls == []
        finally:
            proc.terminate()
            proc.wait(timeout=30)
