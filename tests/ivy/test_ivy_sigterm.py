"""RELIABILITY 20 for the gateway: on SIGTERM readiness flips first, requests are still served for the
drain delay, then the server stops accepting, finishes what is in flight and exits."""

from __future__ import annotations

import json
import signal
import threading
import time
import urllib.error
import urllib.request

import pytest

from fake_tulip import FakeTulip, wait_until
from ivy_testkit import ivy_server

pytestmark = pytest.mark.slow


def _post(port: int, text: str, timeout: float = 30) -> int | str:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/embeddings", data=json.dumps({"input": [text]}).encode(),
                                 headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status
    except urllib.error.HTTPError as exc:  # the status and the body, for the assertion message
        return f"{exc.code} {exc.read()[:200]!r}"


def _accepting(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
            return True
    except OSError:
        return False


def _ready(port: int) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=5) as r:
            return r.status, json.loads(r.read())["status"]
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())["status"]


@pytest.mark.parametrize("workers", ["1", "2"])  # 2: uvicorn's supervisor passes SIGTERM on to each worker
def test_sigterm_flips_readiness_serves_through_the_delay_then_finishes_in_flight_work(workers: str) -> None:
    gate = threading.Event()
    with FakeTulip(gate=gate) as fake, ivy_server(IVY_REPLICAS=fake.address, IVY_DRAIN_DELAY_S="4",
                                                  IVY_WORKERS=workers) as (port, proc):
        held: dict = {}
        first = threading.Thread(target=lambda: held.update(status=_post(port, "in flight at SIGTERM")))
        first.start()
        wait_until(lambda: fake.waiting == 1)
        proc.send_signal(signal.SIGTERM)
        wait_until(lambda: _ready(port) == (503, "draining"), timeout=3)  # flips first (2 workers: ~0.5 s)
        during = {}
        second = threading.Thread(target=lambda: during.update(status=_post(port, "sent during the delay")))
        second.start()  # load balancers may still route here for a moment: served, not dropped
        wait_until(lambda: fake.waiting == 2)
        assert _ready(port) == (503, "draining")  # still answering during the delay
        started = time.monotonic()
        # Past the delay it stops accepting. With 2 workers each one's delay starts when the supervisor passes
        # SIGTERM on, so one probe may meet the worker that stopped while the other still serves: wait until
        # several probes in a row are refused.
        wait_until(lambda: not any(_accepting(port) for _ in range(5)), timeout=10)
        assert time.monotonic() - started > 0.5  # ... not before the delay (4 s after SIGTERM)
        # Not served: refused (1 worker), or left in the listening socket that uvicorn's supervisor still
        # holds (2 workers) until the workers exit, then reset.
        with pytest.raises(OSError):
            _post(port, "after the delay", timeout=2)
        gate.set()  # in-flight work completes
        first.join(timeout=20)
        second.join(timeout=20)
        assert held.get("status") == 200 and during.get("status") == 200, (held, during)
        proc.wait(timeout=20)  # exits on its own once in-flight work is done
        assert proc.returncode in (0, -signal.SIGTERM)
    assert sum(c.seqs for c in fake.calls) == 2  # accepted = succeeded
