"""`ivy serve` / `ivy up`: flags and env vars, GPU discovery, several workers, and a failing child."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from ivy_testkit import model_copy, stop_process
from fake_tulip import FakeTulip
from ivy import up, up_tulips
from ivy.config import IvyConfig
from rose.flags import config_from_args, env_name


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _help(*args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "ivy", *args, "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return " ".join(out.stdout.split())


def test_help_documents_every_flag_with_its_env_var() -> None:
    serve, stack = _help("serve"), _help("up")
    for f in dataclasses.fields(IvyConfig):
        assert f"--{f.name.replace('_', '-')}" in serve and env_name("IVY", f.name) in serve
        if f.name not in ("replicas", "replicas_dns"):  # `ivy up` sets the gateway's replicas itself
            assert env_name("IVY", f.name) in stack
    for f in dataclasses.fields(up.UpConfig):
        assert f"--{f.name.replace('_', '-')}" in stack and env_name("IVY_UP", f.name) in stack


def test_word_cache_help_gives_its_measured_memory() -> None:
    """Review: the help said ~12 MB / at most ~32 MB; measured, 65 536 words of 3-10 characters hold 8.2 MB and
    of 100 characters with 8 ids 16.0 MB, as README says (~8 MB, at most ~16 MB)."""
    text = next(f for f in dataclasses.fields(IvyConfig) if f.name == "tokenizer_cache_words").metadata["help"]
    assert "~8 MB per worker" in text and "at most ~16 MB" in text and "12 MB" not in text and "32 MB" not in text


def test_config_from_env_and_flags() -> None:
    env = {"IVY_PORT": "9001", "IVY_REPLICAS": "10.0.0.1:50051, 10.0.0.2:50051", "IVY_TRUNCATE": "true",
           "IVY_CORS_ORIGINS": "https://a.example"}
    config = config_from_args(IvyConfig, {"port": "9002"}, "IVY", environ=env)
    assert config.port == 9002 and config.truncate is True
    assert config.replicas == ("10.0.0.1:50051", "10.0.0.2:50051") and config.cors_origins == ("https://a.example",)
    with pytest.raises(SystemExit):
        IvyConfig(replicas=())
    assert IvyConfig(max_concurrent_requests=10, workers=4).per_worker_concurrency() == 3


def test_workers_auto_is_one_per_four_usable_cpus(tmp_path, monkeypatch) -> None:
    from ivy import config as ivy_config
    from rose import host_cpus

    assert [ivy_config.auto_workers(c) for c in (1, 2, 4, 7, 8, 16, 32, 64)] == [1, 1, 1, 1, 2, 4, 8, 8]
    monkeypatch.setattr(ivy_config, "usable_cpus", lambda: 16)
    assert IvyConfig().workers == 4 and IvyConfig(workers=0).workers == 4, "0 = auto, resolved at once"
    assert IvyConfig(workers=3).workers == 3
    with pytest.raises(SystemExit, match="--workers"):
        IvyConfig(workers=-1)
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "cpu.max").write_text("max 100000\n")
    assert host_cpus.cgroup_cpu_quota(str(v2)) is None, "no limit"
    (v2 / "cpu.max").write_text("250000 100000\n")
    assert host_cpus.cgroup_cpu_quota(str(v2)) == 3, "2.5 CPUs rounds up"
    v1 = tmp_path / "v1"
    (v1 / "cpu").mkdir(parents=True)
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("400000\n")
    (v1 / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert host_cpus.cgroup_cpu_quota(str(v1)) == 4
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    assert host_cpus.cgroup_cpu_quota(str(v1)) is None
    assert host_cpus.cgroup_cpu_quota(str(tmp_path / "none")) is None


def test_bare_bool_flag_means_true_and_up_refuses_replicas() -> None:
    from ivy.cli import build_parser

    parser = build_parser()
    for argv, expected in ((["serve", "--truncate"], True), (["serve", "--truncate", "false"], False),
                           (["serve"], False)):
        assert config_from_args(IvyConfig, parser.parse_args(argv), "IVY", environ={}).truncate is expected
    with pytest.raises(SystemExit):
        parser.parse_args(["up", "--replicas", "10.0.0.1:50051"])


def test_visible_gpus(monkeypatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert up.visible_gpus("all") == ["0", "1"]
    assert up.visible_gpus("none") == [None]
    assert up.visible_gpus("2,3") == ["2", "3"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert up.visible_gpus("all") == [None]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    monkeypatch.setattr(up_tulips.shutil, "which", lambda name: None)  # where visible_gpus looks for nvidia-smi
    assert up.visible_gpus("all") == [None]


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except OSError:
        return 0, b""


@pytest.mark.slow
def test_serve_with_two_workers_and_aggregated_metrics() -> None:
    port = free_port()
    with FakeTulip() as fake:
        env = {**os.environ, "IVY_REPLICAS": fake.address, "IVY_PORT": str(port), "IVY_WORKERS": "2"}
        env.pop("PROMETHEUS_MULTIPROC_DIR", None)
        proc = subprocess.Popen([sys.executable, "-m", "ivy", "serve"], env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE)
        try:
            base = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 60
            while _get(f"{base}/ready")[0] != 200:
                assert proc.poll() is None, proc.stderr.read().decode()
                assert time.monotonic() < deadline, "ivy serve never became ready"
                time.sleep(0.2)
            body = json.dumps({"input": ["hello", "world"]}).encode()
            for _ in range(6):
                request = urllib.request.Request(f"{base}/v1/embeddings", data=body,
                                                 headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(request, timeout=10) as r:
                    assert r.status == 200 and len(json.loads(r.read())["data"]) == 2
            status, text = _get(f"{base}/metrics")
            assert status == 200
            line = next(l for l in text.decode().splitlines()
                        if l.startswith('ivy_requests_total{route="/v1/embeddings",status="200"}'))
            assert float(line.split()[-1]) == 6.0  # summed over both workers
        finally:
            stop_process(proc)


@pytest.mark.slow
def test_up_exits_nonzero_with_the_failing_childs_output(tmp_path) -> None:
    broken = model_copy(tmp_path, "no-weights")  # tokenizer present, safetensors missing: Tulip cannot load
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    out = subprocess.run([sys.executable, "-m", "ivy", "up", "--model", str(broken), "--port", str(free_port()),
                          "--tulip-port", str(free_port()), "--tulip-metrics-port", "0", "--startup-timeout-s", "240"],
                         env=env, capture_output=True, text=True, timeout=280)
    assert out.returncode != 0
    assert "exited with code" in out.stderr and "tulip" in out.stderr
    assert "Ivy is ready" not in out.stdout


def test_connection_and_docs_flags_are_checked_at_start() -> None:
    import pytest

    from ivy.config import IvyConfig

    for bad in ({"docs": "sometimes"}, {"keep_alive_timeout_s": 0}, {"header_read_timeout_s": -1},
                {"max_connections": -1}):
        with pytest.raises(SystemExit):
            IvyConfig(**bad)


def test_up_shares_the_cores_among_its_tulips_kernel_compile_workers():
    from ivy.up import kernel_compile_env

    assert kernel_compile_env(1, cpus=16, environ={}) == {}  # one Tulip: rose.kernel_ahead's own default
    assert kernel_compile_env(2, cpus=16, environ={}) == {"ROSE_KERNEL_COMPILE_WORKERS": "7"}
    assert kernel_compile_env(4, cpus=16, environ={}) == {"ROSE_KERNEL_COMPILE_WORKERS": "3"}
    assert kernel_compile_env(8, cpus=128, environ={}) == {"ROSE_KERNEL_COMPILE_WORKERS": "8"}
    assert kernel_compile_env(32, cpus=16, environ={}) == {"ROSE_KERNEL_COMPILE_WORKERS": "1"}
    assert kernel_compile_env(4, cpus=16, environ={"ROSE_KERNEL_COMPILE_WORKERS": "2"}) == {}  # the user's


_POOL_PROBE = """
import os, sys
from ivy.config import IvyConfig
from ivy.gateway import Gateway
before = len(os.listdir("/proc/self/task"))
Gateway(IvyConfig(tokenizer_threads=int(sys.argv[1])))
print(len(os.listdir("/proc/self/task")) - before)
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads through /proc")
def test_tokenizers_pool_is_sized_like_the_workers_tokenizer_threads(monkeypatch) -> None:
    """`tokenizers`' rayon pool would start one thread per host core; a worker sizes it to its own tokenizer
    threads (RAYON_NUM_THREADS) unless the operator set the variable."""
    from ivy import config as ivy_config

    monkeypatch.setattr(ivy_config, "usable_cpus", lambda: 3)
    assert IvyConfig().tokenizer_thread_count() == 3 and IvyConfig(tokenizer_threads=5).tokenizer_thread_count() == 5
    monkeypatch.setattr(ivy_config, "usable_cpus", lambda: 64)
    assert IvyConfig().tokenizer_thread_count() == 8, "at most 8 unless set"

    def started(threads: int, **env: str) -> int:
        clean = {k: v for k, v in os.environ.items() if k != "RAYON_NUM_THREADS"}
        out = subprocess.run([sys.executable, "-c", _POOL_PROBE, str(threads)], env={**clean, **env},
                             capture_output=True, text=True, timeout=120, check=True)
        return int(out.stdout.split()[-1])

    one, six = started(1), started(6)
    assert six - one == 5, f"threads started by a worker: {one} with 1 tokenizer thread, {six} with 6"
    assert started(6, RAYON_NUM_THREADS="1") == one, "the operator's RAYON_NUM_THREADS wins"


def test_tokenizer_bpe_whole_chars_reaches_the_gateways_tokenizer() -> None:
    from ivy.gateway import Gateway

    with pytest.raises(SystemExit, match="--tokenizer-bpe-whole-chars"):
        IvyConfig(tokenizer_bpe_whole_chars=-1)
    env = {"IVY_REPLICAS": "127.0.0.1:1", "IVY_TOKENIZER_BPE_WHOLE_CHARS": "0"}

    async def main() -> None:  # a gateway is built inside its worker's event loop
        gateways = (Gateway(config_from_args(IvyConfig, {}, "IVY", environ=env)),
                    Gateway(IvyConfig(replicas=("127.0.0.1:1",))))
        try:
            assert [g.tokenizer.bpe_whole_chars for g in gateways] == [0, 32768]
        finally:
            for g in gateways:
                g.encoder.close()

    asyncio.run(main())


def test_tokenizer_cache_words_reaches_the_gateways_tokenizer() -> None:
    from ivy.gateway import Gateway

    with pytest.raises(SystemExit, match="--tokenizer-cache-words"):
        IvyConfig(tokenizer_cache_words=-1)
    with pytest.raises(SystemExit, match="--tokenizer-cache-call-chars"):
        IvyConfig(tokenizer_cache_call_chars=-1)
    env = {"IVY_REPLICAS": "127.0.0.1:1", "IVY_TOKENIZER_CACHE_WORDS": "0", "IVY_TOKENIZER_CACHE_CALL_CHARS": "77"}

    async def main() -> None:  # a gateway is built inside its worker's event loop
        off = Gateway(config_from_args(IvyConfig, {}, "IVY", environ=env))
        on = Gateway(IvyConfig(replicas=("127.0.0.1:1",), tokenizer_cache_words=5))
        try:
            assert off.tokenizer._ascii.words is None and off.tokenizer.cache_call_chars == 77
            assert on.tokenizer.cache_call_chars == 32768
            assert on.tokenizer._ascii.words is not None and on.tokenizer._ascii.words.capacity == 5
        finally:
            for g in (off, on):
                g.encoder.close()

    asyncio.run(main())


_NAN, _INF = float("nan"), float("inf")


@pytest.mark.parametrize("name, value", [
    ("request_timeout_s", _NAN), ("request_timeout_s", _INF), ("health_interval_s", _NAN),
    ("replica_timeout_s", _NAN), ("keep_alive_timeout_s", _INF), ("header_read_timeout_s", _NAN),
    ("send_timeout_s", _NAN), ("body_read_timeout_s", 0), ("body_read_timeout_s", _NAN),
    ("drain_delay_s", -1.0), ("drain_delay_s", _INF), ("port", 65536), ("tokenizer_threads", -1),
    ("max_chars_per_input", -1), ("tokenize_inline_chars", -1), ("tokenize_split_chars", -1),
    ("tokenize_piece_chars", 0), ("grpc_max_message_bytes", 2 ** 31)])
def test_meaningless_gateway_values_are_refused_at_start_naming_their_flag(name: str, value) -> None:
    """NaN passes every `< 0` / `<= 0` check (a NaN deadline never passes: no 504 ever), inf hangs the waits it
    becomes (a drain delay of inf: the gateway never stops, `ivy up` waits on it for good), a negative thread
    count or a message limit past gRPC's 32-bit one fail each worker's start-up with a traceback, a negative
    character cap answers every request 422: refused at start, naming the flag, like Tulip's config."""
    with pytest.raises(SystemExit, match=f"--{name.replace('_', '-')}"):
        IvyConfig(**{name: value})
    flag = f"--{name.replace('_', '-')}"
    with pytest.raises(SystemExit, match=flag):  # the same through the environment (float("nan") parses)
        config_from_args(IvyConfig, {}, "IVY", environ={env_name("IVY", name): str(value)})


@pytest.mark.parametrize("name, value", [
    ("startup_timeout_s", _NAN), ("startup_timeout_s", 0.0), ("startup_timeout_s", -5.0), ("tulips_per_gpu", 0),
    ("tulip_port", -1), ("tulip_port", 65536), ("tulip_metrics_port", -2), ("tulip_metrics_port", 70000)])
def test_meaningless_up_values_are_refused_at_start_naming_their_flag(name: str, value) -> None:
    """A NaN start-up timeout never times out (`time.monotonic() > NaN` is never true), 0 or less gives up at
    once; 0 Tulips per GPU was silently read as 1; a port past 65535 was checked as another port (the kernel
    takes it modulo 65536) and failed only once the Tulips had loaded their model."""
    with pytest.raises(SystemExit, match=f"--{name.replace('_', '-')}"):
        up.UpConfig(**{name: value})


@pytest.mark.parametrize("name, value", [("timeout_s", _NAN), ("timeout_s", _INF), ("log_interval_s", _NAN),
                                         ("log_interval_s", -1.0), ("gpu_hour_price", _NAN),
                                         ("gpu_hour_price", -1.0)])
def test_meaningless_index_values_are_refused_at_start_naming_their_flag(name: str, value) -> None:
    """A NaN --timeout-s failed the first request with a socket ValueError's traceback; a NaN price wrote NaN
    (not JSON) into summary.json."""
    from ivy.index.config import IndexConfig

    with pytest.raises(SystemExit, match=f"--{name.replace('_', '-')}"):
        IndexConfig(url="http://127.0.0.1:1", **{name: value})


def test_up_gives_the_gateway_and_tulips_their_whole_drain_before_sigkill(monkeypatch) -> None:
    """On SIGTERM `ivy up` stops the gateway, then the Tulips, each SIGKILLed after a grace period: the gateway's
    must cover its drain delay and its longest request (--request-timeout-s; tests/deploy_rules.py holds the
    manifests to the same), a Tulip's its own TULIP_SHUTDOWN_TIMEOUT_S (the variable reaches it unchanged); a
    shorter one kills accepted requests mid-way. The children are recorded, not started."""
    import signal
    import types

    stops: dict[str, float] = {}

    class Recorded:
        def __init__(self, name: str, argv: list[str], env: dict[str, str]) -> None:
            self.name, self.proc = name, types.SimpleNamespace(send_signal=lambda sig: None)

        def exited(self) -> None:
            return None

        def stop(self, timeout: float) -> None:
            stops[self.name] = timeout

    def ready_then_sigterm(*_args) -> None:
        os.kill(os.getpid(), signal.SIGTERM)  # run_stack's own handler: the stop flag

    for name, fake in (("Child", Recorded), ("_taken_port", lambda *a: ""), ("_port_free", lambda *a: True),
                       ("_tulip_serving", lambda a: True), ("_ivy_ready", lambda url: (True, "")),
                       ("_print_banner", ready_then_sigterm)):
        monkeypatch.setattr(up, name, fake)
    monkeypatch.setenv("TULIP_SHUTDOWN_TIMEOUT_S", "90")
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    config = IvyConfig(port=free_port(), request_timeout_s=45.0, drain_delay_s=5.0, workers=1)
    try:
        assert up.run_stack(config, up.UpConfig(gpus="none", tulip_port=free_port(), tulip_metrics_port=0,
                                                warm_cores="off")) == 0
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    tulips = [t for name, t in stops.items() if name.startswith("tulip:")]
    assert len(tulips) == 1 and tulips[0] > 90, f"a Tulip draining for its 90 s is killed at {tulips[0]} s"
    assert stops["ivy"] > 5.0 + 45.0, f"the gateway is killed at {stops['ivy']} s, within its drain and a request"
