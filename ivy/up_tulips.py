"""How `ivy up` starts its Tulips: which GPUs (`--gpus`), which ports (TULIP_PORT, TULIP_FRAMED_PORT), and each
one's argv and environment, as pure functions of the configuration and the environment (tests read them without
starting anything); the drain each Tulip gets and the kernel compile workers it may use. ivy.up starts them."""

from __future__ import annotations

import logging
import math
import os
import shutil
import subprocess
import sys

from ivy.config import IvyConfig
from protos.framing import PORT_OFFSET as FRAMED_PORT_OFFSET

log = logging.getLogger("ivy.up")


def cpu_only(spec: str) -> bool:
    """Whether --gpus asks for CPU Tulips (none, cpu): each then gets no GPU at all, not just none assigned."""
    return spec.strip().lower() in ("none", "cpu")


def visible_gpus(spec: str) -> list[str | None]:
    """Device ids for CUDA_VISIBLE_DEVICES, one per Tulip; [None] = a single Tulip, device left alone."""
    spec = spec.strip().lower()
    if cpu_only(spec):
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



def port_variable(name: str, low: int, meaning: str = "", environ=os.environ) -> int | None:
    """The port the variable `name` holds, None when unset or empty (an empty variable counts as unset, as in
    rose.flags); a value that is not a whole number in low..65535 stops `ivy up` with one line naming the
    variable (exit 1, like a bad flag), before anything is started."""
    raw = environ.get(name, "")
    if not raw.strip():
        return None
    try:
        value: int | None = int(raw)
    except ValueError:
        value = None
    if value is None or not low <= value <= 65535:
        raise SystemExit(f"ivy up: {name} must be a port number in {low}..65535{meaning}, not {raw!r}")
    return value


def framed_ports(config: IvyConfig, ports: list[int], fixed: int | None) -> list[int]:
    """Where each Tulip's framed EmbedStream is to listen, 0 = nowhere. None at all with --framed false (the gateway
    would not use it) or TULIP_FRAMED_PORT (`fixed`) 0; with TULIP_FRAMED_PORT N > 0, N for the first Tulip and
    N + k for Tulip k, as --tulip-port and the metrics port number their replicas (one port cannot serve two
    Tulips); unset or -1, each Tulip's gRPC port + 200, Tulip's own default. A port past 65535 is none."""
    if not config.framed or fixed == 0:
        return [0] * len(ports)
    if fixed is None or fixed < 0:
        return [p + FRAMED_PORT_OFFSET if p + FRAMED_PORT_OFFSET < 65536 else 0 for p in ports]
    for k in range(len(ports)):
        if fixed + k > 65535:  # a port the user chose is not dropped unremarked
            log.warning("TULIP_FRAMED_PORT %d + %d is past 65535: Tulip on %d serves no framed stream",
                        fixed, k, ports[k])
    return [fixed + k if fixed + k < 65536 else 0 for k in range(len(ports))]


TULIP_RESTARTS = 3  # `ivy up` starts a Tulip that failed while serving again this many times, then stops the stack


def tulip_child(model: str, config: IvyConfig, port: int, *, metrics_port: int, framed_port: int,
                framed_fixed: bool, device: str | None, cpu: bool, activity_file: str = "",
                compile_env: dict[str, str] | None = None,
                environ=os.environ) -> tuple[str, list[str], dict[str, str]]:
    """One Tulip's (name, argv, environment): `tulip serve` of `model` on `port`, the parent's environment with
    its GPU (`device`, CUDA_VISIBLE_DEVICES) or, `cpu`, none at all and --device cpu; its metrics port (0 = off)
    and framed port, given as a flag, which wins over the variables: 0 = off, a port of TULIP_FRAMED_PORT's
    (`framed_fixed`) as such, else -1."""
    env = dict(environ)
    if cpu:
        # Both: no GPU visible keeps torch, Triton and the kernel compile workers off every GPU, and the flag
        # wins over a TULIP_DEVICE=cuda the environment may carry.
        env["CUDA_VISIBLE_DEVICES"] = ""
    elif device is not None:
        env["CUDA_VISIBLE_DEVICES"] = device
    env.update(compile_env or {})
    if activity_file:  # its launched batches, read by the warm-cores controller (protos/heartbeat.py)
        env["TULIP_ACTIVITY_FILE"] = activity_file
    env.setdefault("TULIP_LOG_FORMAT", config.log_format)  # one format for the whole stack's output
    argv = [sys.executable, "-m", "tulip", "serve", "--model", model, "--port", str(port)]
    if config.served_model_name:
        argv += ["--served-model-name", config.served_model_name]
    if cpu:
        argv += ["--device", "cpu"]
    argv += ["--metrics-port", str(metrics_port)]
    if framed_port and framed_fixed:
        argv.append(f"--framed-port={framed_port}")  # one the user chose: Tulip refuses to start without it
    else:
        # -1: Tulip binds its gRPC port + 200 itself and, should that be taken since the check, serves gRPC only
        argv.append("--framed-port=-1" if framed_port else "--framed-port=0")
    name = f"tulip:{port}" + (" cpu" if cpu else f" gpu {device}" if device is not None else "")
    return name, argv, env


def tulip_drain_s(environ=os.environ) -> float:
    """TULIP_SHUTDOWN_TIMEOUT_S, which reaches the Tulips unchanged: the most their SIGTERM drain takes (0 when
    unset or unreadable: Tulip's own default, or its refusal, is within `ivy up`'s 60 s floor)."""
    try:
        value = float(environ.get("TULIP_SHUTDOWN_TIMEOUT_S") or 0)
    except ValueError:
        return 0.0
    return value if math.isfinite(value) else 0.0


def kernel_compile_env(tulips: int, cpus: int | None = None, environ=os.environ) -> dict[str, str]:
    """The host's cores shared among its Tulips' kernel compile workers (rose/kernel_ahead.py: each Tulip would
    take up to 8 of cpus - 1 at a fresh start): the variable for each Tulip, none for one Tulip or when it is set."""
    from rose.kernel_ahead import WORKERS_ENV, default_workers  # torch-free

    if tulips <= 1 or WORKERS_ENV in environ:
        return {}
    return {WORKERS_ENV: str(default_workers(cpus, tulips))}
