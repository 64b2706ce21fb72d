"""`ivy up` restarts a Tulip that failed while serving (RELIABILITY 62): the new process gets the batch counter of
its replica's slot, which the warm-cores controller still reads, so the controller sees that GPU's batches again.

run_stack runs with its children recorded, not started: a recorded Tulip given TULIP_ACTIVITY_FILE makes its
counter as a GPU Tulip does at load (protos/heartbeat.py), and the loops are none (no core is spun).
"""

from __future__ import annotations

import os
import signal
import types

import pytest
from ivy_testkit import free_port

from ivy import up, up_warm_cores
from ivy.config import IvyConfig
from protos.exit_status import DEVICE_LOST_EXIT
from protos.heartbeat import Heartbeat


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch):
    for name in ("TULIP_PORT", "TULIP_METRICS_PORT", "TULIP_FRAMED_PORT", "TULIP_ACTIVITY_FILE",
                 "CUDA_VISIBLE_DEVICES", "TULIP_HOST", "TULIP_METRICS_HOST"):
        monkeypatch.delenv(name, raising=False)
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    signal.signal(signal.SIGHUP, signal.SIG_DFL)  # run_stack keeps an ignored SIGHUP ignored
    yield
    for sig, handler in saved.items():  # run_stack installs its own
        signal.signal(sig, handler)


class RecordedTulip:
    """A Tulip as `ivy up` starts it, not started: its argv and environment kept, its counter made from
    TULIP_ACTIVITY_FILE as a GPU Tulip makes it (None when it cannot be: the replica serves without one)."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        self.name, self.argv, self.env = name, list(argv), dict(env)
        self.code: int | None = None
        self.proc = types.SimpleNamespace(send_signal=lambda sig: None)
        self.counter: Heartbeat | None = None
        if env.get("TULIP_ACTIVITY_FILE"):
            try:
                self.counter = Heartbeat(env["TULIP_ACTIVITY_FILE"])
            except OSError:  # as tulip.server._heartbeat: no counter, the replica serves on
                pass

    def exited(self) -> int | None:
        return self.code

    def failure(self, when: str) -> str:
        return f"ivy up: {self.name} exited with code {self.code} {when}"

    def stop(self, timeout: float) -> None:
        pass


def test_a_restarted_tulip_gets_the_counter_the_warm_cores_controller_reads(monkeypatch) -> None:
    """Once ready, the Tulip loses its GPU (exit 3) and `ivy up` starts it again: the new process is given the same
    TULIP_ACTIVITY_FILE, and the batches it launches move a counter the controller reads (before, it got none and the
    controller watched the dead process's counter for good, so that GPU's work never kept a core warm)."""
    started: list[RecordedTulip] = []
    controllers = []

    def child(name: str, argv: list[str], env: dict[str, str]) -> RecordedTulip:
        recorded = RecordedTulip(name, argv, env)
        if name.startswith("tulip:"):
            started.append(recorded)
            if len(started) == 2:  # the restart: the stack has done what this test watches
                os.kill(os.getpid(), signal.SIGTERM)
        return recorded

    def start_controller(*args):
        controllers.append(real_start(*args))
        return controllers[-1]

    def ready_then_lose_the_gpu(*_args) -> None:
        started[0].code = DEVICE_LOST_EXIT

    real_start = up_warm_cores.start
    for name, fake in (("Child", child), ("_taken_port", lambda *a: ""), ("_port_free", lambda *a: True),
                       ("_tulip_serving", lambda address: True), ("_ivy_ready", lambda url: (True, "")),
                       ("_print_banner", ready_then_lose_the_gpu)):
        monkeypatch.setattr(up, name, fake)
    monkeypatch.setattr(up_warm_cores, "allowed", lambda mode, gpus: True)
    monkeypatch.setattr(up_warm_cores, "start_loops", list)  # no loop: no core spun by a test
    monkeypatch.setattr(up_warm_cores, "start", start_controller)
    monkeypatch.setattr(up.Restarts, "MAX_BACKOFF_S", 0.0)  # started again at the next poll

    config = up.UpConfig(gpus="0", tulip_port=free_port(), tulip_metrics_port=0, warm_cores="on")
    assert up.run_stack(IvyConfig(port=free_port(), workers=1), config) == 0

    first, restarted = started
    assert first.env["TULIP_ACTIVITY_FILE"] and first.counter is not None
    assert restarted.env.get("TULIP_ACTIVITY_FILE") == first.env["TULIP_ACTIVITY_FILE"]
    assert restarted.counter is not None, "the restarted Tulip could not make its counter"
    (controller,) = controllers
    seen = [read() for read in controller.readers]
    restarted.counter.beat()  # the new process launches a batch
    assert [read() for read in controller.readers] != seen, "the controller does not see the restarted Tulip"


def test_an_error_while_serving_stops_the_children_and_removes_the_counters(monkeypatch) -> None:
    """An unexpected error in `ivy up`'s serving loop (here a restart whose process cannot be started) stops the
    children and removes the counters' folder before it propagates (before, both were left behind)."""
    started: list[RecordedTulip] = []
    stopped: list[str] = []

    def child(name: str, argv: list[str], env: dict[str, str]) -> RecordedTulip:
        if name.startswith("tulip:") and started:
            raise OSError("cannot start the Tulip again")
        recorded = RecordedTulip(name, argv, env)
        recorded.stop = lambda timeout, name=name: stopped.append(name)
        if name.startswith("tulip:"):
            started.append(recorded)
        return recorded

    def ready_then_lose_the_gpu(*_args) -> None:
        started[0].code = DEVICE_LOST_EXIT

    for name, fake in (("Child", child), ("_taken_port", lambda *a: ""), ("_port_free", lambda *a: True),
                       ("_tulip_serving", lambda address: True), ("_ivy_ready", lambda url: (True, "")),
                       ("_print_banner", ready_then_lose_the_gpu)):
        monkeypatch.setattr(up, name, fake)
    monkeypatch.setattr(up_warm_cores, "allowed", lambda mode, gpus: True)
    monkeypatch.setattr(up_warm_cores, "start_loops", list)
    monkeypatch.setattr(up.Restarts, "MAX_BACKOFF_S", 0.0)

    config = up.UpConfig(gpus="0", tulip_port=free_port(), tulip_metrics_port=0, warm_cores="on")
    with pytest.raises(OSError, match="cannot start the Tulip again"):
        up.run_stack(IvyConfig(port=free_port(), workers=1), config)
    folder = os.path.dirname(started[0].env["TULIP_ACTIVITY_FILE"])
    assert not os.path.exists(folder), "the counters' folder was left behind"
    assert "ivy" in stopped and any(name.startswith("tulip:") for name in stopped)


def test_counter_folders_of_killed_runs_are_removed_at_the_next_start(tmp_path, monkeypatch):
    """A SIGKILLed `ivy up` never runs its `finally`: its counters' folder stays, its owner lock dropped with it. The
    next start removes this user's folders whose lock nobody holds, and leaves a live run's (locked), a folder being
    made or of an older run (no lock file), a link, and what is not a counters' folder."""
    import fcntl
    import tempfile

    prefix = up_warm_cores.COUNTERS_PREFIX
    stale, live, bare, other = (tmp_path / name for name in (f"{prefix}123-abc", f"{prefix}456-def",
                                                             f"{prefix}789-ghi", "something-else"))
    for folder in (stale, live, bare, other):
        folder.mkdir()
        (folder / "tulip0.count").write_bytes(b"\0" * 8)
    for folder in (stale, live, other):
        (folder / up_warm_cores.OWNER_LOCK).write_text("")
    (tmp_path / f"{prefix}999-link").symlink_to(stale)
    with open(live / up_warm_cores.OWNER_LOCK) as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # a live `ivy up`, in any pid namespace
        assert up_warm_cores.remove_stale(str(tmp_path)) == [str(stale)]
    assert not stale.exists() and live.exists() and bare.exists() and other.exists()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    made = up_warm_cores.counters_dir()  # removes the stale first: `live`, its lock now let go
    assert os.path.basename(made).startswith(f"{prefix}{os.getpid()}-") and os.path.isdir(made)
    assert not live.exists() and bare.exists()
    assert up_warm_cores.remove_stale(str(tmp_path)) == []  # this run's own folder is locked: it stays
    up_warm_cores.remove_counters(made)
    assert not os.path.exists(made) and made not in up_warm_cores._owned
