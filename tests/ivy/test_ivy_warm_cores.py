"""`ivy up --warm-cores`: one lowest-priority loop per usable core, pinned, running while the Tulips launch batches
and stopped otherwise, gone with the stack; `auto` (the default) starts them only for GPU Tulips in a virtual
machine without a CPU limit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ivy import up, up_warm_cores, warm_cores

pytestmark = pytest.mark.skipif(not warm_cores.supported(), reason="needs Linux's SCHED_IDLE")


def _policy_and_cpus(pid: int, timeout: float = 20.0) -> tuple[int, set[int]]:
    """The loop's scheduling class and CPUs once it has set them (it starts as its parent's)."""
    deadline = time.monotonic() + timeout
    while True:
        policy, cpus = os.sched_getscheduler(pid), os.sched_getaffinity(pid)
        if policy == os.SCHED_IDLE or time.monotonic() > deadline:
            return policy, cpus
        time.sleep(0.05)


def _state(pid: int) -> str:
    """The process's state letter ("T" stopped, "Z" a zombie), "" once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return ""


def _wait_state(pid: int, stopped: bool, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while (_state(pid) == "T") != stopped:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _autogroups() -> bool:
    try:
        with open("/proc/sys/kernel/sched_autogroup_enabled") as f:
            return f.read().strip() == "1" and os.path.exists("/proc/self/autogroup")
    except OSError:
        return False


def test_a_loop_runs_at_sched_idle_pinned_to_its_core_in_the_lowest_autogroup() -> None:
    cpu = warm_cores.affinity_cpus()[-1]
    proc = subprocess.Popen(warm_cores.argv(cpu), start_new_session=True)  # its own session, as `ivy up` starts it
    try:
        assert _policy_and_cpus(proc.pid) == (os.SCHED_IDLE, {cpu})
        if _autogroups():  # sessions share the CPU first: SCHED_IDLE alone would rank the loop in its own only
            deadline = time.monotonic() + 10
            group = Path(f"/proc/{proc.pid}/autogroup")
            while not group.read_text().rstrip().endswith("nice 19"):
                assert time.monotonic() < deadline, group.read_text()
                time.sleep(0.02)
        assert proc.poll() is None  # it keeps looping
    finally:
        proc.kill()
        proc.wait()


def test_the_controller_runs_the_loops_while_a_counter_moves_and_stops_them_after_the_hold() -> None:
    counts = {"a": 5, "b": None}  # b: a counter not readable (yet)
    loop = subprocess.Popen(warm_cores.argv(warm_cores.affinity_cpus()[-1]))
    try:
        c = warm_cores.Controller([loop], [lambda: counts["a"], lambda: counts["b"]], hold_s=1.0)
        assert c.tick(0.0)  # the first reading counts as activity (the replicas' warm-up)
        assert c.tick(0.9) and _state(loop.pid) != "T"
        assert not c.tick(1.05)  # nothing moved for the hold: stopped
        assert _wait_state(loop.pid, stopped=True)
        assert not c.tick(5.0) and c.switches == 1  # no signal while nothing changes
        counts["b"] = 0  # counter b became readable: that is a move too
        assert c.tick(5.1) and _wait_state(loop.pid, stopped=False)
        assert not c.tick(6.2) and _wait_state(loop.pid, stopped=True)
        counts["a"] = 6
        assert c.tick(6.3) and _wait_state(loop.pid, stopped=False)
        assert c.switches == 4
    finally:
        loop.kill()  # a stopped loop dies of SIGKILL too
        loop.wait()


def test_a_hold_of_zero_runs_the_loops_from_a_tick_that_saw_a_batch_to_the_next() -> None:
    count = [0]
    c = warm_cores.Controller([], [lambda: count[0]], hold_s=0.0)
    assert c.tick(0.0)
    assert not c.tick(0.1)
    count[0] = 1
    assert c.tick(0.2) and not c.tick(0.3)


def test_the_controller_signals_no_loop_that_exited(monkeypatch) -> None:
    """Its pid may belong to another process by now."""

    class Exited:
        pid = 12345

        def poll(self) -> int:
            return 0

    monkeypatch.setattr(os, "kill", lambda *a: pytest.fail(f"signalled {a}"))
    c = warm_cores.Controller([Exited()], [lambda: 1], hold_s=0.0)
    c.tick(0.0)
    assert not c.tick(0.1) and c.switches == 1


def test_the_autogroup_weight_is_written_where_there_is_one(tmp_path) -> None:
    group = tmp_path / "autogroup"
    group.write_text("/autogroup-7 nice 0\n")
    assert warm_cores.lowest_autogroup(str(group)) and group.read_text() == "19"
    assert not warm_cores.lowest_autogroup(str(tmp_path / "none" / "autogroup"))  # no autogroups: SCHED_IDLE alone


def test_ivy_up_opens_the_counters_the_tulips_made(tmp_path) -> None:
    from protos.heartbeat import Heartbeat

    made, missing = str(tmp_path / "tulip0.count"), str(tmp_path / "tulip1.count")  # tulip1: on the CPU
    beat = Heartbeat(made)
    readers = up_warm_cores.open_counters([made, missing])
    assert len(readers) == 1 and readers[0]() == 0
    beat.beat()
    assert readers[0]() == 1


def test_ivy_up_starts_one_loop_per_usable_core(monkeypatch) -> None:
    cpus = warm_cores.affinity_cpus()[:2]
    monkeypatch.setattr(warm_cores, "affinity_cpus", lambda: cpus)
    procs = up_warm_cores.start_loops()
    try:
        assert len(procs) == len(cpus)
        assert sorted(_policy_and_cpus(p.pid) for p in procs) == sorted((os.SCHED_IDLE, {c}) for c in cpus)
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
    ("on", False, True, None, False),  # not even on demand beside a CPU Tulip: its cores run the model
    ("on", True, True, 4, False),  # never under a CPU limit
])
def test_when_the_loops_start(monkeypatch, mode, gpus, vm, quota, started) -> None:
    monkeypatch.setattr(up_warm_cores, "cgroup_cpu_quota", lambda: quota)
    monkeypatch.setattr(warm_cores, "in_virtual_machine", lambda: vm)
    assert up_warm_cores.allowed(mode, gpus) is started


def test_no_loop_starts_under_a_cpu_quota(monkeypatch, caplog) -> None:
    """Under a cgroup CPU limit the loops' busy time would count against it and throttle the stack itself."""
    monkeypatch.setattr(up_warm_cores, "cgroup_cpu_quota", lambda: 4)
    with caplog.at_level("WARNING", logger=up_warm_cores.log.name):
        assert up_warm_cores.allowed("on", True) is False
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
    with pytest.raises(SystemExit, match="auto, on or off"):
        up.UpConfig(warm_cores="sometimes")
    for hold in (-1.0, float("nan")):
        with pytest.raises(SystemExit, match="warm-cores-hold-s"):
            up.UpConfig(warm_cores_hold_s=hold)


def test_the_flag_alone_means_on() -> None:
    import argparse

    from rose.flags import add_config_arguments, config_from_args

    parser = argparse.ArgumentParser()
    add_config_arguments(parser, up.UpConfig, up.UP_ENV_PREFIX)
    assert config_from_args(up.UpConfig, parser.parse_args(["--warm-cores"]), up.UP_ENV_PREFIX, {}).warm_cores == "on"
    assert config_from_args(up.UpConfig, parser.parse_args(["--warm-cores", "off"]), up.UP_ENV_PREFIX,
                            {}).warm_cores == "off"


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


def test_a_stopped_loop_dies_with_ivy_up() -> None:
    """A SIGSTOPped loop would hold a SIGTERM until continued: the loops' parent-death signal is SIGKILL."""
    import selectors

    parent = subprocess.Popen([sys.executable, "-c", (
        "import signal, subprocess, sys, time\n"
        "from ivy import up_process, warm_cores\n"
        "loop = subprocess.Popen(warm_cores.argv(warm_cores.affinity_cpus()[-1]), start_new_session=True,\n"
        "                        preexec_fn=up_process._parent_death_signal(signal.SIGKILL))\n"
        "print(loop.pid, flush=True)\n"
        "time.sleep(60)\n")], stdout=subprocess.PIPE, text=True)
    loop_pid = None
    try:
        ready = selectors.DefaultSelector()  # epoll: select() refuses a descriptor above 1023 (a long test run's)
        ready.register(parent.stdout, selectors.EVENT_READ)
        assert ready.select(30), "the parent never started its loop"
        ready.close()
        loop_pid = int(parent.stdout.readline())
        os.kill(loop_pid, signal.SIGSTOP)
        assert _wait_state(loop_pid, stopped=True)
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 10
        while _state(loop_pid) not in ("", "Z"):
            assert time.monotonic() < deadline, "the stopped loop outlived its parent"
            time.sleep(0.05)
    finally:
        parent.kill()
        parent.wait()
        if loop_pid is not None and _state(loop_pid) not in ("", "Z"):  # still the loop: it never died
            os.kill(loop_pid, signal.SIGKILL)
