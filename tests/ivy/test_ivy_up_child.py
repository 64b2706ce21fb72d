"""`ivy up`'s supervised child (ivy/up_process.py): a child that outlives its drain is killed with everything it
started (the gateway's uvicorn workers run in its process group), so no orphan keeps the port or a GPU."""

import os
import signal
import sys
import time

from ivy.up_process import Child

# A child that ignores SIGTERM and starts a grandchild that ignores it too, then prints the grandchild's pid.
_STUBBORN = (
    "import signal, subprocess, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "code = 'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)'\n"
    "worker = subprocess.Popen([sys.executable, '-c', code])\n"
    "print(worker.pid, flush=True)\n"
    "time.sleep(600)\n"
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by its new parent) counts as gone.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_child_past_its_drain_is_killed_with_the_processes_it_started() -> None:
    child = Child("stubborn", [sys.executable, "-c", _STUBBORN], dict(os.environ))
    deadline = time.monotonic() + 30
    while not child.tail and time.monotonic() < deadline:
        time.sleep(0.05)
    worker = int(child.tail[0])
    assert _alive(worker)
    try:
        child.stop(timeout=0.5)
        assert child.exited() == -signal.SIGKILL
        deadline = time.monotonic() + 10
        while _alive(worker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(worker), "the child's own worker outlived it"
    finally:
        if _alive(worker):
            os.kill(worker, signal.SIGKILL)


def test_restarts_back_off_give_up_after_most_and_count_afresh_after_serving() -> None:
    """ivy.up_process.Restarts: a Tulip that fails while serving is started again after 1, 2, 4 s; a fourth failure
    in a row gives it up (left down while others serve); one that served SERVED_RESET_S counts afresh."""
    from ivy.up_process import Restarts

    r = Restarts(2, most=3, now=0.0)
    delays = []
    now = 10.0
    for _ in range(3):
        delays.append(r.failed(0, now))
        assert r.due[0] == now + delays[-1] and r.due[1] is None
        now += delays[-1]
        r.started_again(0, now)
        now += 1  # fails again a second later
    assert delays == [1.0, 2.0, 4.0]
    assert r.failed(0, now) is None and r.gone == {0}  # a crash loop: given up
    assert r.failed(1, 5.0) == 1.0  # the other Tulip's count is its own
    r.started_again(1, 6.0)
    assert r.failed(1, 6.0 + Restarts.SERVED_RESET_S) == 1.0  # served ten minutes: counted afresh
