"""`tulip health`, what the Tulip image's HEALTHCHECK and docker-compose run: exit 0 only when the replica
answers SERVING; 1 while it loads, after it drains, for an unknown service, and at once when nothing listens."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tulip_testkit import (
    FAKE_FACTORY,
    FakeEngine,
    ServerThread,
    make_config,
    wait_until,
)

from tulip.cli import default_health_address, main
from tulip.server import SERVICE_NAME

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def health(capsys, *flags: str) -> tuple[int, str]:
    code = main(["health", *flags])
    out = capsys.readouterr()
    lines = (out.out + out.err).strip().splitlines()
    assert len(lines) == 1, lines  # one line, whatever the outcome
    return code, lines[0]


def test_serving_replica_exits_0(capsys) -> None:
    with ServerThread(make_config(), FakeEngine()) as s:
        code, line = health(capsys, "--address", s.address)
        assert (code, line) == (0, f"tulip health: {s.address} (server): SERVING")
        code, line = health(capsys, "--address", s.address, "--service", SERVICE_NAME)
        assert code == 0 and line.endswith(f"{SERVICE_NAME}: SERVING")


def test_loading_then_ready_then_drained(capsys) -> None:
    s = ServerThread(make_config(), FakeEngine(), load=False)  # listening, model not loaded yet
    try:
        code, line = health(capsys, "--address", s.address)
        assert code == 1 and line.endswith("NOT_SERVING"), line
        s.run(s.server.load())
        assert health(capsys, "--address", s.address)[0] == 0
        s.run(s.server.drain())
        code, line = health(capsys, "--address", s.address)
        assert code == 1 and ("NOT_SERVING" in line or "UNAVAILABLE" in line), line
    finally:
        s.close()


def test_unknown_service_exits_1(capsys) -> None:
    with ServerThread(make_config(), FakeEngine()) as s:
        code, line = health(capsys, "--address", s.address, "--service", "no.such.Service")
        assert code == 1 and "NOT_FOUND" in line, line


def test_closed_port_exits_1_without_waiting_for_the_timeout(capsys) -> None:
    address = f"127.0.0.1:{free_port()}"
    start = time.monotonic()
    code, line = health(capsys, "--address", address, "--timeout-s", "60")
    # Connection refused is answered at once; a check that waited for its 60 s timeout would be useless
    # inside a 3 s Docker HEALTHCHECK (the bound is a hang guard, far from the expected ~0.1 s).
    assert time.monotonic() - start < 20
    assert code == 1 and f"{address} (server): UNAVAILABLE" in line, line


def test_bad_timeout_is_a_usage_error(capsys) -> None:
    assert main(["health", "--timeout-s", "0"]) == 2
    assert "timeout_s must be positive" in capsys.readouterr().err


def test_default_address_follows_the_replicas_environment() -> None:
    assert default_health_address({}) == "127.0.0.1:50051"
    assert default_health_address({"TULIP_PORT": "", "TULIP_HOST": ""}) == "127.0.0.1:50051"  # empty = unset
    assert default_health_address({"TULIP_PORT": "6000", "TULIP_HOST": "0.0.0.0"}) == "127.0.0.1:6000"
    assert default_health_address({"TULIP_PORT": "6000", "TULIP_HOST": "::"}) == "127.0.0.1:6000"
    assert default_health_address({"TULIP_HOST": "10.1.2.3"}) == "10.1.2.3:50051"
    assert default_health_address({"TULIP_HOST": "::1", "TULIP_PORT": "7"}) == "[::1]:7"


@pytest.mark.slow
def test_console_check_against_a_real_tulip_process_configured_by_env() -> None:
    """As in the image: `tulip serve` and a flagless `tulip health` share TULIP_PORT and nothing else."""
    env = {**os.environ, "TULIP_PORT": str(free_port()), "TULIP_HOST": "127.0.0.1"}
    env.pop("TULIP_HEALTH_ADDRESS", None)
    server = subprocess.Popen(
        [sys.executable, "-m", "tulip", "serve", "--device", "cpu", "--engine-factory", FAKE_FACTORY],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def check() -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "tulip", "health"], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=30, check=False)

    try:
        last: list[subprocess.CompletedProcess] = []
        wait_until(lambda: server.poll() is not None or bool(last.append(check()) or last[-1].returncode == 0),
                   timeout=60, what="tulip health to report SERVING")
        assert server.poll() is None, f"tulip serve exited with {server.returncode}"
        assert last[-1].stdout.strip() == f"tulip health: 127.0.0.1:{env['TULIP_PORT']} (server): SERVING"
        server.send_signal(signal.SIGTERM)
        assert server.wait(30) == 0
        gone = check()
        assert gone.returncode == 1 and "UNAVAILABLE" in gone.stderr, gone
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(10)
