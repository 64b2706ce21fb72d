"""`ivy up --warm-cores`: one lowest-priority busy loop per usable core, pinned, gone with the stack."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from ivy import up, warm_cores

pytestmark = pytest.mark.skipif(not warm_cores.supported(), reason="needs Linux's SCHED_IDLE")


def _policy_and_cpus(pid: int, timeout: float = 20.0) -> tuple[int, set[int]]:
    """The loop's scheduling class and CPUs once it has set them (it starts as its parent's)."""
    deadline = time.monotonic() + timeout
    while True:
        policy, cpus = os.sched_getscheduler(pid), os.sched_getaffinity(pid)
        if policy == os.SCHED_IDLE or time.monotonic() > deadline:
            return policy, cpus
        time.sleep(0.05)


def test_a_loop_runs_at_sched_idle_pinned_to_its_core() -> None:
    cpu = warm_cores.affinity_cpus()[-1]
    proc = subprocess.Popen(warm_cores.argv(cpu))
    try:
        assert _policy_and_cpus(proc.pid) == (os.SCHED_IDLE, {cpu})
        assert proc.poll() is None  # it keeps looping
    finally:
        proc.kill()
        proc.wait()


def test_ivy_up_starts_one_loop_per_usable_core(monkeypatch) -> None:
    cpus = warm_cores.affinity_cpus()[:2]
    monkeypatch.setattr(warm_cores, "affinity_cpus", lambda: cpus)
    monkeypatch.setattr(up, "cgroup_cpu_quota", lambda: None)  # whatever CPU limit the test host has
    procs = up._start_spinners()
    try:
        assert len(procs) == len(cpus)
        assert sorted(_policy_and_cpus(p.pid) for p in procs) == sorted((os.SCHED_IDLE, {c}) for c in cpus)
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_no_loop_starts_under_a_cpu_quota(monkeypatch, caplog) -> None:
    """Under a cgroup CPU limit the loops' busy time would count against it and throttle the stack itself."""
    monkeypatch.setattr(up, "cgroup_cpu_quota", lambda: 4)
    monkeypatch.setattr(up.subprocess, "Popen", lambda *a, **k: pytest.fail("a loop was started"))
    with caplog.at_level("WARNING", logger=up.log.name):
        assert up._start_spinners() == []
    assert "CPU quota of 4 CPUs" in caplog.text


def test_the_flag_is_off_by_default_and_an_env_var() -> None:
    out = subprocess.run([sys.executable, "-m", "ivy", "up", "--help"], capture_output=True, text=True, check=True,
                         env={**os.environ, "COLUMNS": "200"}).stdout
    assert "--warm-cores" in out and "IVY_UP_WARM_CORES" in out
    assert up.UpConfig().warm_cores is False


def test_a_bad_cpu_argument_is_refused() -> None:
    result = subprocess.run([sys.executable, "-m", "ivy.warm_cores", "x"], check=False, capture_output=True,
                            text=True)
    assert result.returncode != 0 and "usage" in result.stderr


def test_a_loop_refused_its_class_never_spins(monkeypatch, capsys) -> None:
    def refuse(*_):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "sched_setaffinity", lambda *_: None)
    monkeypatch.setattr(os, "sched_setscheduler", refuse)
    assert warm_cores.spin(0) == 1  # returns instead of looping at normal priority
    assert "core 0 not kept warm" in capsys.readouterr().err
