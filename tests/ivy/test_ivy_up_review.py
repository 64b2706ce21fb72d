"""`ivy up`, found in review: what each Tulip is given (TULIP_FRAMED_PORT honoured, `--gpus none` a CPU Tulip for
sure), one exit code for a stop asked by a signal in either phase, and a bad TULIP_*_PORT refused in one line.

Most tests run run_stack with its children recorded, not started (argv and environment as each would get them);
one starts the real stack on the bundled model to see the framed port really closed.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import types

import pytest
from ivy_testkit import free_port, stop_process

from ivy import up
from ivy.config import IvyConfig

PORT_VARIABLES = ("TULIP_PORT", "TULIP_METRICS_PORT", "TULIP_FRAMED_PORT", "TULIP_DEVICE", "CUDA_VISIBLE_DEVICES",
                  "TULIP_HOST", "TULIP_METRICS_HOST")


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch):
    for name in PORT_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    yield
    for sig, handler in saved.items():  # run_stack installs its own
        signal.signal(sig, handler)


def _recorded_stack(monkeypatch, up_config: up.UpConfig, *, sig: int = signal.SIGTERM, phase: str = "ready",
                    config: IvyConfig | None = None) -> tuple[int, dict[str, tuple[list[str], dict[str, str]]]]:
    """run_stack with every child recorded, not started: (its exit code, name -> (argv, env)); `sig` is sent to
    this process during start-up (phase "startup": no Tulip ever serves) or once the stack is ready."""
    children: dict[str, tuple[list[str], dict[str, str]]] = {}

    class Recorded:
        def __init__(self, name: str, argv: list[str], env: dict[str, str]) -> None:
            children[name] = (list(argv), dict(env))
            self.name, self.proc = name, types.SimpleNamespace(send_signal=lambda s: None)

        def exited(self) -> None:
            return None

        def stop(self, timeout: float) -> None:
            pass

    def signal_then(result):
        def send(*_args):
            os.kill(os.getpid(), sig)  # run_stack's own handler: the stop flag
            return result
        return send

    serving = signal_then(False) if phase == "startup" else (lambda address: True)
    for name, fake in (("Child", Recorded), ("_taken_port", lambda *a: ""), ("_port_free", lambda *a: True),
                       ("_tulip_serving", serving), ("_ivy_ready", lambda url: (True, "")),
                       ("_print_banner", signal_then(None))):
        monkeypatch.setattr(up, name, fake)
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    # SIGHUP as a terminal leaves it: run_stack keeps an ignored SIGHUP ignored (started under nohup, as a CI
    # runner may start this test process), and a stop by SIGHUP is then never asked for
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    try:
        code = up.run_stack(config or IvyConfig(port=free_port(), workers=1), up_config)
    finally:
        for s, handler in saved.items():  # run_stack's handlers do not outlive it in the test process
            signal.signal(s, handler)
    return code, children


def _tulips(children):
    return [children[name] for name in sorted(children) if name.startswith("tulip:")]


def _flag(argv: list[str], name: str) -> str | None:
    """The value of `--name VALUE` or `--name=VALUE` in argv (the last one wins, as argparse's), None if absent."""
    value = None
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(name + "="):
            value = arg.split("=", 1)[1]
    return value


def _two_tulips(tulip_port: int) -> up.UpConfig:
    return up.UpConfig(gpus="0,1", tulip_port=tulip_port, tulip_metrics_port=0, warm_cores="off")


# 1. TULIP_FRAMED_PORT: README says `ivy up` honours both services' variables, and 0 turns the stream off.

def test_tulip_framed_port_0_turns_the_framed_stream_off_for_every_tulip(monkeypatch) -> None:
    monkeypatch.setenv("TULIP_FRAMED_PORT", "0")
    code, children = _recorded_stack(monkeypatch, _two_tulips(free_port()))
    assert code == 0
    assert [_flag(argv, "--framed-port") for argv, _ in _tulips(children)] == ["0", "0"]


def test_a_fixed_tulip_framed_port_is_the_first_tulips_and_replica_k_gets_it_plus_k(monkeypatch) -> None:
    """Like --tulip-port and TULIP_METRICS_PORT: one port cannot serve several Tulips, so the variable names the
    first one's, and each Tulip is given its own explicitly (Tulip then refuses to start without it)."""
    framed = 40000 + free_port() % 20000
    monkeypatch.setenv("TULIP_FRAMED_PORT", str(framed))
    code, children = _recorded_stack(monkeypatch, _two_tulips(free_port() % 20000 + 1024))
    assert code == 0
    assert [_flag(argv, "--framed-port") for argv, _ in _tulips(children)] == [str(framed), str(framed + 1)]


def test_a_fixed_framed_port_on_another_tulips_port_costs_that_tulip_its_framed_stream(monkeypatch, caplog) -> None:
    tulip_port = free_port() % 20000 + 1024
    monkeypatch.setenv("TULIP_FRAMED_PORT", str(tulip_port + 1))  # replica 0's framed port = replica 1's gRPC port
    with caplog.at_level("WARNING", logger="ivy.up"):
        code, children = _recorded_stack(monkeypatch, _two_tulips(tulip_port))
    assert code == 0
    assert [_flag(argv, "--framed-port") for argv, _ in _tulips(children)] == ["0", str(tulip_port + 2)]
    assert f"port {tulip_port + 1} is taken" in caplog.text


@pytest.mark.parametrize("value", ["", "-1"])
def test_without_tulip_framed_port_each_tulip_binds_its_grpc_port_plus_200_itself(monkeypatch, value) -> None:
    if value:
        monkeypatch.setenv("TULIP_FRAMED_PORT", value)
    code, children = _recorded_stack(monkeypatch, _two_tulips(free_port() % 20000 + 1024))
    assert code == 0
    assert [_flag(argv, "--framed-port") for argv, _ in _tulips(children)] == ["-1", "-1"]


def test_framed_false_keeps_every_tulip_off_whatever_tulip_framed_port_says(monkeypatch) -> None:
    monkeypatch.setenv("TULIP_FRAMED_PORT", "45000")
    config = IvyConfig(port=free_port(), workers=1, framed=False)
    code, children = _recorded_stack(monkeypatch, _two_tulips(free_port() % 20000 + 1024), config=config)
    assert code == 0
    assert [_flag(argv, "--framed-port") for argv, _ in _tulips(children)] == ["0", "0"]


@pytest.mark.slow
def test_tulip_framed_port_0_leaves_the_real_stacks_framed_port_closed(tmp_path) -> None:
    """The review's repro: `TULIP_FRAMED_PORT=0 ivy up` still listened on the Tulip's port + 200."""
    port, tulip_port = free_port(), free_port()
    env = {**os.environ, "TULIP_FRAMED_PORT": "0"}
    for name in ("CUDA_VISIBLE_DEVICES", "TULIP_PORT", "TULIP_METRICS_PORT"):
        env.pop(name, None)
    proc = subprocess.Popen([sys.executable, "-m", "ivy", "up", "--port", str(port), "--tulip-port", str(tulip_port),
                             "--tulip-metrics-port", "0", "--gpus", "none", "--workers", "1"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # the banner's first line once ready; EOF if it exited
            if "Ivy is ready at" in line:
                break
        assert proc.poll() is None, f"ivy up exited with {proc.returncode} before ready"
        with socket.socket() as probe:
            assert probe.connect_ex(("127.0.0.1", tulip_port + 200)) != 0, "the framed port listens"
    finally:
        stop_process(proc, timeout=90)


def test_a_bad_tulip_framed_port_is_refused_in_one_line(monkeypatch) -> None:
    monkeypatch.setenv("TULIP_FRAMED_PORT", "abc")
    with pytest.raises(SystemExit) as exc:
        _recorded_stack(monkeypatch, _two_tulips(free_port()))
    assert "TULIP_FRAMED_PORT" in str(exc.value) and "\n" not in str(exc.value)


# 2. --gpus none: one CPU Tulip, whatever the parent's CUDA_VISIBLE_DEVICES and TULIP_DEVICE say.

@pytest.mark.parametrize("gpus", ["none", "cpu", " None "])
def test_gpus_none_gives_one_tulip_on_the_cpu_with_no_gpu_visible(monkeypatch, gpus) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setenv("TULIP_DEVICE", "cuda")
    code, children = _recorded_stack(monkeypatch, up.UpConfig(gpus=gpus, tulip_port=free_port(),
                                                              tulip_metrics_port=0, warm_cores="off"))
    assert code == 0
    [(argv, env)] = _tulips(children)
    assert _flag(argv, "--device") == "cpu"  # the flag wins over TULIP_DEVICE
    assert env["CUDA_VISIBLE_DEVICES"] == ""  # torch sees no GPU at all: nothing of the process lands on one


def test_listed_gpus_give_each_tulip_its_device_and_no_cpu_flag(monkeypatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2")
    code, children = _recorded_stack(monkeypatch, _two_tulips(free_port() % 20000 + 1024))
    assert code == 0
    tulips = _tulips(children)
    assert [env["CUDA_VISIBLE_DEVICES"] for _, env in tulips] == ["0", "1"]
    assert [_flag(argv, "--device") for argv, _ in tulips] == [None, None]


# 3. One exit code for a stop asked by a signal, before and after ready.

@pytest.mark.parametrize("phase", ["startup", "ready"])
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_stop_asked_by_any_signal_exits_0_in_either_phase(monkeypatch, phase, sig) -> None:
    """SIGTERM during start-up exited 130 (SIGINT's code), SIGINT once ready 0. The rule is `tulip serve`'s,
    and the gateway's: a stop asked for, carried out, is exit 0, whichever signal and whether ready or not."""
    code, children = _recorded_stack(monkeypatch, up.UpConfig(gpus="none", tulip_port=free_port(),
                                                              tulip_metrics_port=0, warm_cores="off"),
                                     sig=sig, phase=phase)
    assert code == 0
    assert len(children) == 2


# 4. A bad TULIP_PORT / TULIP_METRICS_PORT: one line naming the variable, not a ValueError's traceback.

@pytest.mark.parametrize("name,value", [("TULIP_PORT", "abc"), ("TULIP_PORT", "0"), ("TULIP_PORT", "70000"),
                                        ("TULIP_PORT", "-5"), ("TULIP_METRICS_PORT", "abc"),
                                        ("TULIP_METRICS_PORT", "70000"), ("TULIP_FRAMED_PORT", "-2"),
                                        ("TULIP_FRAMED_PORT", "65536")])
def test_a_bad_port_variable_is_refused_naming_it_before_anything_starts(monkeypatch, name, value) -> None:
    monkeypatch.setenv(name, value)

    def started(name, argv, env):
        raise AssertionError(f"{name} was started")

    monkeypatch.setattr(up, "Child", started)
    with pytest.raises(SystemExit) as exc:
        up.run_stack(IvyConfig(port=free_port(), workers=1), up.UpConfig(gpus="none", warm_cores="off"))
    message = str(exc.value)
    assert name in message and repr(value) in message and "\n" not in message, message


def test_a_port_variable_a_flag_replaces_is_not_read(monkeypatch) -> None:
    """--tulip-port / --tulip-metrics-port win over the variables, as everywhere: a bad one they replace is moot."""
    monkeypatch.setenv("TULIP_PORT", "abc")
    monkeypatch.setenv("TULIP_METRICS_PORT", "abc")
    code, _ = _recorded_stack(monkeypatch, up.UpConfig(gpus="none", tulip_port=free_port(), tulip_metrics_port=0,
                                                       warm_cores="off"))
    assert code == 0


def test_ivy_up_with_tulip_port_abc_says_so_in_one_line() -> None:
    """The review's repro, through the command: exit non-zero with one line, no traceback, nothing started."""
    env = {**os.environ, "TULIP_PORT": "abc"}
    out = subprocess.run([sys.executable, "-m", "ivy", "up", "--port", str(free_port())], check=False, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "Traceback" not in out.stderr and "[tulip:" not in out.stderr, out.stderr
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "TULIP_PORT" in lines[0] and "'abc'" in lines[0], out.stderr


def test_a_fixed_framed_port_past_65535_is_none_for_that_tulip_and_said(monkeypatch, caplog) -> None:
    monkeypatch.setenv("TULIP_FRAMED_PORT", "65535")
    with caplog.at_level("WARNING", logger="ivy.up"):
        code, children = _recorded_stack(monkeypatch, _two_tulips(free_port() % 20000 + 1024))
    assert code == 0
    assert [_flag(argv, "--framed-port") for argv, _ in _tulips(children)] == ["65535", "0"]
    assert "past 65535" in caplog.text


def _banner(monkeypatch, capsys, environ: dict[str, str], **config) -> str:
    for name in ("IVY_API_KEY", "IVY_API_KEY_LANES", "TULIP_MODEL"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    up._print_banner("http://127.0.0.1:8080", IvyConfig(workers=1, **config), ["127.0.0.1:50051"], [])
    return capsys.readouterr().out


def test_the_banner_curl_names_the_key_as_it_came_and_never_prints_it(monkeypatch, capsys) -> None:
    """Review: a key given as --api-key printed `$IVY_API_KEY` (in no variable of the user's shell: pasting got 401),
    and keys of --api-key-lanes alone printed no Authorization header at all (401 too)."""
    flag = _banner(monkeypatch, capsys, {}, api_key="s3cret-flag")
    assert '-H "Authorization: Bearer <your --api-key>"' in flag and "$IVY_API_KEY" not in flag, flag
    env = _banner(monkeypatch, capsys, {"IVY_API_KEY": "s3cret-env"}, api_key="s3cret-env")
    assert '-H "Authorization: Bearer $IVY_API_KEY"' in env, env
    lanes = _banner(monkeypatch, capsys, {}, api_key_lanes=("k1-s3cret=bulk", "k2-s3cret=interactive"))
    assert '-H "Authorization: Bearer <a key of --api-key-lanes>"' in lanes, lanes
    both = _banner(monkeypatch, capsys, {}, api_key="s3cret-main", api_key_lanes=("k1-s3cret=bulk",))
    assert '-H "Authorization: Bearer <your --api-key>"' in both, both
    for out in (flag, env, lanes, both):
        assert "s3cret" not in out and out.count("Authorization") == 1, out
    assert "Authorization" not in _banner(monkeypatch, capsys, {})
