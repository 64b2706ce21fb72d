"""RELIABILITY case 32: gzip bodies stalled mid-stream hold about their compressed size, not their inflated size."""

from __future__ import annotations

import gzip
import json
import socket
from pathlib import Path

import pytest

from fake_tulip import FakeTulip
from fake_tulip import wait_until
from ivy_testkit import event_loop_turned, ivy_server, server_has_read_everything

pytestmark = pytest.mark.slow

SOCKETS = 40


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _settled_rss(port: int, pid: int) -> int:
    """RSS once the server has read every byte sent and its event loop has handled them."""
    wait_until(lambda: server_has_read_everything(port), timeout=30)
    event_loop_turned(port)
    return _rss_bytes(pid)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc")
def test_stalled_gzip_bodies_hold_their_compressed_size() -> None:
    # 1.9 MB of JSON (under the 2 MB cap) that gzips to ~2 KB; all but its last bytes are sent, then it stalls.
    body = gzip.compress(json.dumps({"input": ["a" * 1_900_000]}).encode())
    assert len(body) < 4096
    small = gzip.compress(json.dumps({"input": ["hello"]}).encode())

    def head(size: int) -> bytes:
        return (b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Encoding: gzip\r\nContent-Length: " + str(size).encode() + b"\r\n\r\n")

    with FakeTulip() as fake, ivy_server(IVY_REPLICAS=fake.address, IVY_BODY_READ_TIMEOUT_S="60") as (port, proc):
        warm = socket.create_connection(("127.0.0.1", port))  # one whole request first: lazy imports, buffers
        warm.sendall(head(len(small)) + small)
        warm.settimeout(10)
        assert warm.recv(4096).startswith(b"HTTP/1.1 200")
        warm.close()
        before = _settled_rss(port, proc.pid)
        stalled = []
        for _ in range(SOCKETS):
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(head(len(body)) + body[:-8])
            stalled.append(s)
        grown = _settled_rss(port, proc.pid) - before
        for s in stalled:
            s.close()
    # Inflated as it arrived, each held ~1.9 MB (+76 MB for 40); compressed, ~2 KB each plus the connection.
    assert grown < 16 * 1024 * 1024, f"RSS grew {grown / 2**20:.1f} MiB with {SOCKETS} stalled gzip bodies"
