"""A client that disconnects mid-request: Ivy cancels the request's gRPC calls, so the replica drops the work."""

from __future__ import annotations

import json
import socket
import threading

import pytest

from fake_tulip import FakeTulip, wait_until
from ivy_testkit import ivy_process

pytestmark = pytest.mark.slow


def test_disconnect_cancels_the_replica_call() -> None:
    """RELIABILITY 16 on Ivy's side: a client gone mid-request cancels its call on the replica."""
    gate = threading.Event()
    with FakeTulip(gate=gate) as fake, ivy_process(IVY_REPLICAS=fake.address) as port:
        body = json.dumps({"input": ["held at the replica"]}).encode()
        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall(b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        wait_until(lambda: fake.waiting == 1)
        sock.close()
        wait_until(lambda: fake.waiting == 0)  # the Embed call was cancelled, not left to run
        gate.set()
        assert fake.calls == []
