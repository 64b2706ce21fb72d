"""`python -m tulip serve` as a real process (on the fake engine): SIGTERM under load loses nothing
accepted, start-up failures exit non-zero with the reason, and --help documents every flag's env var."""

import dataclasses
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tulip_testkit import (
    FAKE_ENGINE_PATH,
    FAKE_FACTORY,
    decode_response,
    encode_request,
    marked_sequence,
    solo_embedding,
    wait_until,
)

from protos import embed_pb2_grpc
from tulip.config import TulipConfig
from tulip.server import CLIENT_CHANNEL_OPTIONS

REPO = Path(__file__).resolve().parents[2]


class TulipProcess:
    def __init__(self, *flags: str, env: dict | None = None, base: tuple = ("--device", "cpu")) -> None:
        cmd = [sys.executable, "-m", "tulip", "serve", "--port", "0", *base, *flags]
        self.proc = subprocess.Popen(cmd, cwd=REPO, env={**os.environ, **(env or {})}, stderr=subprocess.PIPE,
                                     stdout=subprocess.DEVNULL, text=True)
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.lines.append(line)

    def log(self) -> str:
        return "".join(self.lines)

    def wait_for_line(self, pattern: str, timeout: float = 60) -> re.Match:
        found: list = []
        wait_until(lambda: self.proc.poll() is not None or bool(found.extend(
            m for m in (re.search(pattern, line) for line in list(self.lines)) if m) or found),
            timeout=timeout, what=pattern)
        if not found:
            raise AssertionError(f"tulip exited ({self.proc.returncode}) before {pattern!r}:\n{self.log()}")
        return found[0]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.mark.slow
def test_sigterm_under_load_answers_everything_accepted() -> None:
    server = TulipProcess("--engine-factory", FAKE_FACTORY, "--max-batch-tokens", "64", "--max-batch-seqs", "3",
                          "--shutdown-timeout-s", "30", env={"FAKE_ENGINE_STEP_SECONDS": "0.01"})
    try:
        port = int(server.wait_for_line(r"tulip listening on 127\.0\.0\.1:(\d+)").group(1))
        server.wait_for_line(r"tulip ready")
        channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=CLIENT_CHANNEL_OPTIONS)
        stub = embed_pb2_grpc.EmbedderStub(channel)
        health = health_pb2_grpc.HealthStub(channel)
        requests = [encode_request([marked_sequence(1 + i % 900, 20)]) for i in range(300)]
        futures = [stub.Embed.future(r, timeout=60) for r in requests]
        wait_until(lambda: sum(f.done() for f in futures) >= 10, what="load under way")
        server.proc.send_signal(signal.SIGTERM)
        done_before = sum(f.done() for f in futures)
        in_progress = int(server.wait_for_line(r"draining: (\d+) calls in progress").group(1))
        try:
            status = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5).status
            assert status == health_pb2.HealthCheckResponse.NOT_SERVING
        except grpc.RpcError as exc:  # already gone: also not serving
            assert exc.code() == grpc.StatusCode.UNAVAILABLE
        late = [stub.Embed.future(r, timeout=30) for r in requests[:20]]  # after SIGTERM: refused
        # Every call is answered exactly or refused at the door with Tulip's own "shutting down" status (a
        # call the server had not taken in before SIGTERM); an accepted call dropped by the drain would show
        # any other status (CANCELLED, a transport error), which fails here.
        answered = refused = 0
        for req, fut in zip(requests, futures):
            try:
                np.testing.assert_array_equal(decode_response(fut.result()), solo_embedding(req))
                answered += 1
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.UNAVAILABLE and "shutting down" in (exc.details() or ""), exc
                refused += 1
        assert in_progress > 0 and answered >= in_progress and answered + refused == 300
        assert answered >= done_before  # nothing answered before SIGTERM is counted twice or lost
        for fut in late:
            with pytest.raises(grpc.RpcError) as late_error:  # refused at the door (or the port already closed)
                fut.result()
            details = (late_error.value.details() or "").lower()
            assert late_error.value.code() == grpc.StatusCode.UNAVAILABLE, late_error.value
            assert "shutting down" in details or "connect" in details, late_error.value
        assert server.proc.wait(30) == 0
        channel.close()
    finally:
        server.kill()
    assert "tulip stopped" in server.log()


@pytest.mark.slow
def test_a_lost_device_answers_unavailable_then_exits_3() -> None:
    """RELIABILITY 62: once a batch leaves the device unable to run work, `tulip serve` drains and exits 3 for the
    orchestrator to restart it (a new CUDA context), rather than serve errors with its health SERVING."""
    server = TulipProcess("--engine-factory", f"{FAKE_ENGINE_PATH}:breaking_factory")
    try:
        port = int(server.wait_for_line(r"tulip listening on 127\.0\.0\.1:(\d+)").group(1))
        server.wait_for_line(r"tulip ready")
        channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=CLIENT_CHANNEL_OPTIONS)
        stub = embed_pb2_grpc.EmbedderStub(channel)
        request = encode_request([marked_sequence(5, 8)])
        np.testing.assert_array_equal(decode_response(stub.Embed(request, timeout=30)), solo_embedding(request))
        with pytest.raises(grpc.RpcError) as err:
            stub.Embed(encode_request([marked_sequence(999, 8)]), timeout=30)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE and "no longer runs work" in err.value.details()
        from protos.exit_status import DEVICE_LOST_EXIT

        assert server.proc.wait(30) == DEVICE_LOST_EXIT == 3
        channel.close()
    finally:
        server.kill()
    wait_until(lambda: "exiting with status 3: the device was lost" in server.log(), timeout=10, what="the log")


@pytest.mark.slow
def test_failed_model_load_exits_non_zero_with_the_reason() -> None:
    server = TulipProcess("--engine-factory", f"{FAKE_ENGINE_PATH}:broken_factory", "--model", "/nowhere")
    try:
        assert server.proc.wait(60) == 1
    finally:
        server.kill()
    wait_until(lambda: "no weights in /nowhere" in server.log(), timeout=10, what="error in the log")


@pytest.mark.slow
def test_port_in_use_exits_2() -> None:
    first = TulipProcess("--engine-factory", FAKE_FACTORY)
    try:
        port = first.wait_for_line(r"listening on 127\.0\.0\.1:(\d+)").group(1)
        clash = subprocess.run([sys.executable, "-m", "tulip", "serve", "--port", port, "--device", "cpu",
                                "--engine-factory", FAKE_FACTORY], cwd=REPO, capture_output=True, text=True,
                               timeout=60, check=False)
        assert clash.returncode == 2, clash.stderr
        assert "cannot listen" in clash.stderr
    finally:
        first.kill()


def test_help_documents_every_flag_and_env_var() -> None:
    out = subprocess.run([sys.executable, "-m", "tulip", "serve", "--help"], cwd=REPO, capture_output=True,
                         text=True, timeout=60, env={**os.environ, "COLUMNS": "200"}, check=False)
    assert out.returncode == 0, out.stderr
    for f in dataclasses.fields(TulipConfig):
        assert "--" + f.name.replace("_", "-") in out.stdout
        assert f"TULIP_{f.name.upper()}" in out.stdout


def test_env_vars_configure_and_flags_win() -> None:
    from rose.flags import config_from_args
    from tulip.cli import build_parser

    args = build_parser().parse_args(["serve", "--max-batch-tokens", "1024"])
    config = config_from_args(TulipConfig, args, "TULIP",
                              environ={"TULIP_MAX_BATCH_TOKENS": "2048", "TULIP_PORT": "6000"})
    assert config.max_batch_tokens == 1024 and config.port == 6000
    with pytest.raises(ValueError, match="max_queue_tokens"):
        TulipConfig(max_batch_tokens=4096, max_queue_tokens=1024)
    with pytest.raises(ValueError, match="warmup_full_batch"):
        TulipConfig(warmup_full_batch="maybe")


@pytest.mark.parametrize(("field", "value"), [
    ("shutdown_timeout_s", float("nan")),  # the drain gave up at once: accepted work was not waited for
    ("idle_capture_ms", float("inf")),  # the launcher thread died on its first idle wait: nothing was answered
    ("watchdog_factor", float("nan")),  # the watchdog never tripped
    ("pack_ahead_ms", float("nan")),
    ("interactive_recent_ms", float("nan")),
    ("keepalive_time_s", 0.0),  # gRPC then pings every connection every millisecond
    ("keepalive_time_s", -1.0),
    ("keepalive_timeout_s", 0.0),  # every ping not answered at once closed its connection
    ("min_client_ping_interval_s", -1.0),
    ("max_message_mb", 2048),  # past gRPC's 32-bit limits: the start failed as "cannot listen on host:port"
    ("keepalive_time_s", 3e6),  # milliseconds past a C int: the start failed with OverflowError, the same way
    ("keepalive_timeout_s", 3e6),
    ("min_client_ping_interval_s", 3e6),
])
def test_a_value_that_makes_no_sense_is_refused_naming_its_flag(field, value) -> None:
    with pytest.raises(ValueError, match=field):
        TulipConfig(**{field: value})


def test_budget_and_full_batch_probe_follow_the_device() -> None:
    auto = TulipConfig()
    assert auto.batch_tokens_for("cuda:0") == 8192 and auto.batch_tokens_for("cpu") == 2048
    assert auto.probe_full_batch_on("cuda") and not auto.probe_full_batch_on("cpu")
    fixed = TulipConfig(max_batch_tokens=512, warmup_full_batch="true")
    assert fixed.batch_tokens_for("cuda") == 512 and fixed.probe_full_batch_on("cpu")


def test_event_loop_choice() -> None:
    import asyncio

    from tulip.cli import run_loop

    async def loop_module() -> str:
        return type(asyncio.get_running_loop()).__module__

    assert run_loop(loop_module(), "asyncio").startswith("asyncio")
    assert run_loop(loop_module(), "auto").startswith("uvloop")  # uvloop comes with uvicorn[standard]
    with pytest.raises(ValueError, match="event_loop"):
        TulipConfig(event_loop="trio")
