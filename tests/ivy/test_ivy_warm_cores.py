"""`ivy up --warm-cores`: one lowest-priority loop per usable core, pinned, spinning while the Tulips work, gone
with the stack; `auto` (the default) starts them only for GPU Tulips in a virtual machine without a CPU limit."""

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


def _cpu_s(pid: int) -> float:
    return warm_cores.cpu_ticks((pid,)) / os.sysconf("SC_CLK_TCK")


def test_a_loop_runs_at_sched_idle_pinned_to_its_core() -> None:
    cpu = warm_cores.affinity_cpus()[-1]
    proc = subprocess.Popen(warm_cores.argv(cpu))
    try:
        assert _policy_and_cpus(proc.pid) == (os.SCHED_IDLE, {cpu})
        assert proc.poll() is None  # it keeps looping
    finally:
        proc.kill()
        proc.wait()


def test_activity_counts_serving_not_an_idle_trickle() -> None:
    """Ticks fed every 50 ms: an idle Tulip's tick every few seconds never counts; 2 ticks within the 1 s window
    do, and the loop keeps spinning for the hold after them, then stops."""
    idle = warm_cores.Activity(hold_s=1.0)
    busy_seen = [idle.update(k * 0.05, k // 60) for k in range(600)]  # one tick every 3 s for 30 s
    assert not any(busy_seen)

    a = warm_cores.Activity(hold_s=1.0)
    assert not a.update(0.0, 100) and not a.update(0.05, 101)  # one tick: not yet
    assert a.update(0.10, 102)  # two within the window: serving
    assert a.update(1.00, 102)  # the window (back to t = 0) still holds both ticks: held until 2.0
    assert a.update(1.05, 102) and a.update(1.95, 102)  # no growth in the window since, but within the hold
    assert not a.update(2.05, 102)  # the hold has passed: the loop sleeps
    assert a.update(2.10, 104)  # serving again


def test_activity_window_forgets_old_ticks() -> None:
    """Ticks spread thinner than ACTIVE_TICKS a window never count, however long they go on."""
    a = warm_cores.Activity(hold_s=0.0, window_s=1.0, active_ticks=2)
    assert not any(a.update(k * 0.05, k // 30) for k in range(400))  # one tick every 1.5 s


def test_cpu_ticks_follow_a_process_and_skip_one_gone() -> None:
    before = warm_cores.cpu_ticks((os.getpid(),))
    end = time.process_time() + 0.1
    while time.process_time() < end:
        pass
    assert warm_cores.cpu_ticks((os.getpid(),)) >= before + 5  # 100 ms of CPU is 10 ticks (at 100 Hz)
    assert warm_cores.cpu_ticks((2**22 + 7,)) == 0  # no such process


def test_a_watching_loop_sleeps_while_the_watched_process_idles_and_spins_while_it_works() -> None:
    cpus = warm_cores.affinity_cpus()
    if len(cpus) < 2:
        pytest.skip("needs two cores: the watched process on one, the loop on another")
    watched = subprocess.Popen([sys.executable, "-c", "import sys, time\n"
                                "for line in sys.stdin:\n"
                                "    end = time.monotonic() + float(line)\n"
                                "    while time.monotonic() < end: pass\n"], stdin=subprocess.PIPE, text=True)
    os.sched_setaffinity(watched.pid, {cpus[0]})
    loop = subprocess.Popen(warm_cores.argv(cpus[-1], (watched.pid,), hold_s=0.2))
    try:
        _policy_and_cpus(loop.pid)
        time.sleep(0.5)
        start = _cpu_s(loop.pid)
        time.sleep(1.5)
        idle = _cpu_s(loop.pid) - start
        assert idle < 0.1, f"the loop used {idle:.2f} s of CPU in 1.5 s while nothing was served"
        watched.stdin.write("2.5\n")
        watched.stdin.flush()
        time.sleep(0.5)  # the loop notices within its window
        start = _cpu_s(loop.pid)
        time.sleep(1.5)
        busy = _cpu_s(loop.pid) - start
        assert busy > 0.3, f"the loop used only {busy:.2f} s of CPU in 1.5 s while the watched process worked"
    finally:
        for p in (loop, watched):
            p.kill()
            p.wait()


def test_ivy_up_starts_one_watching_loop_per_usable_core(monkeypatch) -> None:
    cpus = warm_cores.affinity_cpus()[:2]
    monkeypatch.setattr(warm_cores, "affinity_cpus", lambda: cpus)
    monkeypatch.setattr(up, "cgroup_cpu_quota", lambda: None)  # whatever CPU limit the test host has
    procs = up._start_spinners("on", True, (os.getpid(),), 1.0)
    try:
        assert len(procs) == len(cpus)
        assert sorted(_policy_and_cpus(p.pid) for p in procs) == sorted((os.SCHED_IDLE, {c}) for c in cpus)
        assert all(p.args[-4:] == ["--watch", str(os.getpid()), "--hold-s", "1"] for p in procs)
    finally:
        for p in procs:
            p.kill()
            p.wait()


@pytest.mark.parametrize(("mode", "gpus", "vm", "quota", "started"), [
    ("auto", True, True, None, True),
    ("auto", False, True, None, False),  # CPU Tulips: their cores run the model
    ("auto", True, False, None, False),  # bare metal: not measured there (`on` keeps them)
    ("auto", True, True, 8, False),
    ("on", True, False, None, True),
    ("on", False, True, None, False),  # not even on demand beside a CPU Tulip (5-10 x slower requests)
    ("on", True, True, 4, False),  # never under a CPU limit
])
def test_when_the_loops_start(monkeypatch, mode, gpus, vm, quota, started) -> None:
    monkeypatch.setattr(up, "cgroup_cpu_quota", lambda: quota)
    monkeypatch.setattr(warm_cores, "in_virtual_machine", lambda: vm)
    monkeypatch.setattr(warm_cores, "affinity_cpus", lambda: [0])
    launched = []
    monkeypatch.setattr(up.subprocess, "Popen", lambda argv, **_: launched.append(argv) or argv)
    assert bool(up._start_spinners(mode, gpus, (1,), 1.0)) is started
    assert len(launched) == started


def test_no_loop_starts_under_a_cpu_quota(monkeypatch, caplog) -> None:
    """Under a cgroup CPU limit the loops' busy time would count against it and throttle the stack itself."""
    monkeypatch.setattr(up, "cgroup_cpu_quota", lambda: 4)
    monkeypatch.setattr(up.subprocess, "Popen", lambda *a, **k: pytest.fail("a loop was started"))
    with caplog.at_level("WARNING", logger=up.log.name):
        assert up._start_spinners("on", True, (1,), 1.0) == []
    assert "CPU quota of 4 CPUs" in caplog.text


def test_the_hypervisor_flag_is_read_from_cpuinfo(tmp_path) -> None:
    vm, metal = tmp_path / "vm", tmp_path / "metal"
    vm.write_text("processor\t: 0\nflags\t\t: fpu vme sse2 hypervisor lahf_lm\n")
    metal.write_text("processor\t: 0\nflags\t\t: fpu vme sse2 lahf_lm\n")
    assert warm_cores.in_virtual_machine(str(vm)) and not warm_cores.in_virtual_machine(str(metal))
    assert not warm_cores.in_virtual_machine(str(tmp_path / "missing"))


def test_the_flag_is_auto_by_default_alone_on_and_an_env_var() -> None:
    out = subprocess.run([sys.executable, "-m", "ivy", "up", "--help"], capture_output=True, text=True, check=True,
                         env={**os.environ, "COLUMNS": "200"}).stdout
    assert "--warm-cores" in out and "IVY_UP_WARM_CORES" in out and "IVY_UP_WARM_CORES_HOLD_S" in out
    assert up.UpConfig().warm_cores == "auto"
    from rose.flags import config_from_args

    assert config_from_args(up.UpConfig, {"warm_cores": "on"}, up.UP_ENV_PREFIX).warm_cores == "on"
    assert config_from_args(up.UpConfig, {}, up.UP_ENV_PREFIX, {"IVY_UP_WARM_CORES": "false"}).warm_cores == "off"
    assert up.UpConfig(warm_cores="True").warm_cores == "on"
    with pytest.raises(ValueError, match="auto, on or off"):
        up.UpConfig(warm_cores="sometimes")


def test_the_flag_alone_means_on() -> None:
    import argparse

    from rose.flags import add_config_arguments, config_from_args

    parser = argparse.ArgumentParser()
    add_config_arguments(parser, up.UpConfig, up.UP_ENV_PREFIX)
    assert config_from_args(up.UpConfig, parser.parse_args(["--warm-cores"]), up.UP_ENV_PREFIX, {}).warm_cores == "on"
    assert config_from_args(up.UpConfig, parser.parse_args(["--warm-cores", "off"]), up.UP_ENV_PREFIX,
                            {}).warm_cores == "off"


def test_a_bad_cpu_argument_is_refused() -> None:
    for bad in (["x"], ["0", "--watch", "1,y"]):
        result = subprocess.run([sys.executable, "-m", "ivy.warm_cores", *bad], check=False, capture_output=True,
                                text=True)
        assert result.returncode != 0 and "usage" in result.stderr


def test_a_loop_refused_its_class_never_spins(monkeypatch, capsys) -> None:
    def refuse(*_):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "sched_setaffinity", lambda *_: None)
    monkeypatch.setattr(os, "sched_setscheduler", refuse)
    assert warm_cores.spin(0) == 1  # returns instead of looping at normal priority
    assert "core 0 not kept warm" in capsys.readouterr().err
