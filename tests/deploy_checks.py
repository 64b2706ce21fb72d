"""Readers for the deploy files (Dockerfiles, docker-compose.yml, deploy/k8s/*.yaml) and the checks that keep
them in step with the real CLIs: argv parsed by the real argparse parsers, IVY_* / TULIP_* variables taken
from the config dataclasses (rose.flags.env_name) and built into real configs, ports, probes and volumes
compared with what those configs say. Each check raises AssertionError naming the file and the field."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import io
import json
import os
import re
import shlex
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ivy.cli import build_parser as ivy_parser
from ivy.config import ENV_PREFIX as IVY_PREFIX
from ivy.config import IvyConfig
from rose.cli import build_parser as rose_parser
from rose.flags import config_from_args, env_name
from tulip.cli import HEALTH_ENV_PREFIX, HealthCheckConfig
from tulip.cli import build_parser as tulip_parser
from tulip.config import ENV_PREFIX as TULIP_PREFIX
from tulip.config import TulipConfig

ROOT = Path(__file__).resolve().parents[1]
COMPOSE_FILE = ROOT / "docker-compose.yml"
K8S_DIR = ROOT / "deploy" / "k8s"
SERVICE_PREFIXES = ("IVY_", "TULIP_", "ROSE_")


def config_env_names(cls: type, prefix: str) -> set[str]:
    return {env_name(prefix, f.name) for f in dataclasses.fields(cls) if f.init}


def kernel_cache_env() -> str:
    from rose.kernel_cache import CACHE_ENV

    return CACHE_ENV


def allowed_env(kind: str) -> set[str]:
    """The service-prefixed variables a container of `kind` reads (ivy: the gateway; tulip: the replica,
    its `tulip health` check and ROSE's kernel cache)."""
    if kind == "ivy":
        return config_env_names(IvyConfig, IVY_PREFIX)
    return (config_env_names(TulipConfig, TULIP_PREFIX) | config_env_names(HealthCheckConfig, HEALTH_ENV_PREFIX)
            | {kernel_cache_env()})


def check_env(kind: str, env: dict[str, str], where: str) -> Any:
    """Every IVY_/TULIP_/ROSE_ variable is one the container reads; the config they make is valid."""
    unknown = sorted(k for k in env if k.startswith(SERVICE_PREFIXES) and k not in allowed_env(kind))
    assert not unknown, f"{where}: {unknown} are not {kind} config fields (see `{kind} serve --help`)"
    cls, prefix = (IvyConfig, IVY_PREFIX) if kind == "ivy" else (TulipConfig, TULIP_PREFIX)
    try:
        return config_from_args(cls, {}, prefix, environ=env)
    except (SystemExit, ValueError) as exc:
        raise AssertionError(f"{where}: invalid {kind} configuration: {exc}") from None


def parse_cli(argv: list[str], where: str) -> tuple[str, argparse.Namespace]:
    """(program, parsed args) by the program's real parser; unknown programs, subcommands or flags fail."""
    parsers = {"ivy": ivy_parser, "tulip": tulip_parser, "rose": rose_parser}
    assert argv and argv[0] in parsers, f"{where}: {argv} does not run ivy, tulip or rose"
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            return argv[0], parsers[argv[0]]().parse_args(argv[1:])
    except SystemExit:
        reason = errors.getvalue().strip().splitlines()[-1:] or ["?"]
        raise AssertionError(f"{where}: `{' '.join(argv)}` is rejected by the real parser: {reason[0]}") from None


# ---- Dockerfiles ----------------------------------------------------------------------------------------


@dataclass
class Dockerfile:
    path: Path
    args: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    expose: set[int] = field(default_factory=set)
    entrypoint: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)
    healthcheck: list[str] = field(default_factory=list)
    healthcheck_options: dict[str, str] = field(default_factory=dict)  # --timeout=3s -> {"timeout": "3s"}
    copies: list[str] = field(default_factory=list)
    runs: list[str] = field(default_factory=list)
    user: str = ""


def _instructions(text: str):
    joined, pending = [], ""
    for line in text.splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        joined.append(pending + line)
        pending = ""
    for line in joined:
        word, _, rest = line.strip().partition(" ")
        yield word.upper(), rest.strip()


def _exec_form(text: str, where: str) -> list[str]:
    assert text.startswith("["), f"{where}: use the exec (JSON) form, got {text!r}"
    return json.loads(text)


def parse_dockerfile(path: Path) -> Dockerfile:
    out = Dockerfile(path)
    for word, rest in _instructions(path.read_text()):
        where = f"{path.name} {word}"
        if word == "ARG":
            name, _, default = rest.partition("=")
            out.args[name] = default
        elif word == "ENV":
            parts = shlex.split(rest)
            pairs = [p.partition("=") for p in parts] if "=" in parts[0] else [(parts[0], "=", " ".join(parts[1:]))]
            out.env.update({k: v for k, _, v in pairs})
        elif word == "EXPOSE":
            out.expose |= {int(p.split("/")[0]) for p in rest.split()}
        elif word == "ENTRYPOINT":
            out.entrypoint = _exec_form(rest, where)
        elif word == "CMD":
            out.cmd = _exec_form(rest, where)
        elif word == "HEALTHCHECK":
            options, command = rest.split(" CMD ", 1)
            out.healthcheck = _exec_form(command.strip(), where)
            out.healthcheck_options = dict(o.lstrip("-").partition("=")[::2] for o in options.split())
        elif word == "COPY":
            out.copies += shlex.split(rest)[:-1]
        elif word == "RUN":
            out.runs.append(rest)
        elif word == "USER":
            out.user = rest
    return out


def dockerfiles() -> dict[str, Dockerfile]:
    return {kind: parse_dockerfile(ROOT / "deploy" / f"Dockerfile.{kind}") for kind in ("ivy", "tulip")}


def dockerignore() -> list[str]:
    path = ROOT / ".dockerignore"
    lines = path.read_text().splitlines() if path.is_file() else []
    return [ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")]


# ---- docker-compose.yml -------------------------------------------------------------------------------------

_VARIABLE = re.compile(r"\$\{(?P<name>[A-Za-z_]\w*)(?:(?P<op>:?[-+?])(?P<arg>[^${}]*))?\}")


def interpolate(value: Any, env: dict[str, str]) -> Any:
    """Compose's ${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR:+alt}, ${VAR+alt} and $$ over a loaded file."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def one(m: re.Match) -> str:
        raw, op, arg = env.get(m["name"]), m["op"], m["arg"] or ""
        if op is None:
            return raw or ""
        present = bool(raw) if op.startswith(":") else raw is not None
        if op.endswith("-"):
            return raw if present else arg  # type: ignore[return-value]
        if op.endswith("+"):
            return arg if present else ""
        assert present, f"docker-compose.yml: {m['name']} is required: {arg}"
        return raw  # type: ignore[return-value]

    text = _VARIABLE.sub(one, value.replace("$$", "\0"))
    assert "${" not in text, f"docker-compose.yml: interpolation Compose does not support in {value!r}"
    return text.replace("\0", "$")


def load_compose(env: dict[str, str], text: str | None = None) -> dict:
    return interpolate(yaml.safe_load(COMPOSE_FILE.read_text() if text is None else text), env)


def compose_env(service: dict) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.partition("=")[::2] for item in env)
    return {k: "" if v is None else str(v) for k, v in env.items()}


def container_port(spec: Any) -> int:
    return int(str(spec.get("target") if isinstance(spec, dict) else spec).rsplit(":", 1)[-1].split("/")[0])


def split_volume(spec: str) -> tuple[str, str, str]:
    source, target, *mode = spec.split(":")
    return source, target, mode[0] if mode else "rw"


# ---- deploy/k8s -------------------------------------------------------------------------------------------


CLUSTER_SCOPED = {"Namespace"}


def load_k8s() -> dict[tuple[str, str], dict]:
    """(kind, name) -> object, over the files kustomization.yaml lists (every file must be listed), with
    kustomization's namespace set on each namespaced object as kustomize does."""
    kustomization = yaml.safe_load((K8S_DIR / "kustomization.yaml").read_text())
    files = sorted(p.name for p in K8S_DIR.glob("*.yaml") if p.name != "kustomization.yaml")
    assert sorted(kustomization["resources"]) == files, f"kustomization.yaml lists {kustomization['resources']}"
    objects = {}
    for name in files:
        for doc in yaml.safe_load_all((K8S_DIR / name).read_text()):
            if doc:
                if doc["kind"] not in CLUSTER_SCOPED and kustomization.get("namespace"):
                    doc["metadata"]["namespace"] = kustomization["namespace"]
                key = (doc["kind"], doc["metadata"]["name"])
                assert key not in objects, f"deploy/k8s: {key} is defined twice"
                objects[key] = doc
    return objects


def render_k8s() -> dict[tuple[str, str], dict]:
    """What `kubectl kustomize deploy/k8s` renders, by (kind, name)."""
    out = subprocess.run(["kubectl", "kustomize", str(K8S_DIR)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, f"kubectl kustomize deploy/k8s failed: {out.stderr.strip()}"
    return {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(out.stdout) if d}


def pod_specs(objects: dict) -> dict[str, dict]:
    """The pod template of every workload (Deployment, StatefulSet, Job), by "Kind/name"."""
    return {f"{kind}/{name}": o["spec"]["template"]["spec"] for (kind, name), o in objects.items()
            if kind in ("Deployment", "StatefulSet", "Job")}


def containers_of(pod: dict) -> list[dict]:
    return [*pod.get("initContainers", []), *pod["containers"]]


# ---- images -------------------------------------------------------------------------------------------------

BUILD_SCRIPT = ROOT / "deploy" / "build-images.sh"


def build_commands(env: dict[str, str] | None = None) -> list[list[str]]:
    """The docker commands deploy/build-images.sh runs (its --dry-run), as argv lists."""
    clean = {k: v for k, v in os.environ.items() if k not in ("REGISTRY", "TAG", "FLASHINFER")}
    out = subprocess.run(["bash", str(BUILD_SCRIPT), "--dry-run"], capture_output=True, text=True, timeout=60,
                         env={**clean, **(env or {})})
    assert out.returncode == 0, f"build-images.sh --dry-run failed: {out.stderr.strip()}"
    return [shlex.split(line) for line in out.stdout.splitlines() if line.strip()]


def built_images(commands: list[list[str]]) -> dict[str, tuple[str, dict[str, str]]]:
    """{Dockerfile name: (tag, build args)} of the script's `docker build` commands."""
    out = {}
    for argv in commands:
        if argv[:2] != ["docker", "build"]:
            continue
        options = {}
        args: dict[str, str] = {}
        for flag, value in zip(argv[2:], argv[3:], strict=False):
            if flag == "--build-arg":
                args.update([value.split("=", 1)])
            elif flag in ("-f", "-t"):
                options[flag] = value
        out[Path(options["-f"]).name] = (options["-t"], args)
    return out


def constraints_module():
    """deploy/constraints.py (the images' lock: its dependency walk and reader)."""
    spec = importlib.util.spec_from_file_location("deploy_constraints", ROOT / "deploy" / "constraints.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def k8s_env(container: dict) -> dict[str, str]:
    return {e["name"]: str(e["value"]) for e in container.get("env", [])}


def probe_port(probe: dict, container: dict) -> int:
    """The container port a probe reaches (a named port resolved through the container's ports)."""
    action = probe.get("grpc") or probe.get("httpGet") or probe.get("tcpSocket")
    port = action["port"]
    if isinstance(port, str):
        named = {p.get("name"): p["containerPort"] for p in container.get("ports", [])}
        assert port in named, f"probe port {port!r} is not a named port of {container['name']}"
        return named[port]
    return port
