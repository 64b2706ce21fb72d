"""The deploy files agree with the CLIs: commands parse with the real parsers, every IVY_*/TULIP_* variable is a
config field and builds a valid config, ports match exposed ports, health checks and probes, Ivy waits for a
healthy Tulip and names it in IVY_REPLICAS, Tulip has a GPU and the model volume (rules in deploy_rules.py).
Each rule is also run on broken copies (the *_BREAKAGES below) to show it fails when the files drift."""

from __future__ import annotations

import copy
import http.server
import os
import subprocess
import threading
from pathlib import Path

import pytest
from deploy_checks import ROOT, dockerfiles, load_compose, load_k8s, parse_dockerfile
from deploy_rules import check_compose, check_dockerfile, check_k8s

HOST_ENVS = {"bundled model": {}, "MODEL_DIR set": {"MODEL_DIR": "/srv/models/bge-small", "MODEL_NAME": "bge-small"}}


@pytest.mark.parametrize("kind", ["ivy", "tulip"])
def test_dockerfile_matches_cli(kind: str) -> None:
    check_dockerfile(kind, dockerfiles()[kind])


@pytest.mark.parametrize("host", HOST_ENVS.values(), ids=HOST_ENVS.keys())
def test_compose_matches_cli(host: dict) -> None:
    check_compose(load_compose(host), dockerfiles(), host)


def test_k8s_matches_cli() -> None:
    check_k8s(load_k8s(), dockerfiles())


def test_ivy_image_healthcheck_asks_ready_on_ivy_port() -> None:
    """Run the Ivy image's HEALTHCHECK command against a stand-in /ready: 200 passes, 503 fails."""
    status = {"/ready": 200}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(status.get(self.path, 404))
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    argv = dockerfiles()["ivy"].healthcheck
    env = {**os.environ, "IVY_PORT": str(server.server_address[1])}
    try:
        assert subprocess.run(argv, env=env, capture_output=True, timeout=30, check=False).returncode == 0
        status["/ready"] = 503
        assert subprocess.run(argv, env=env, capture_output=True, timeout=30, check=False).returncode != 0
    finally:
        server.shutdown()


# ---- the checks fail on broken copies ------------------------------------------------------------------

MODEL_SET = HOST_ENVS["MODEL_DIR set"]


def _env(where: dict, **values: str) -> None:
    where["environment"].update(values)


COMPOSE_BREAKAGES = {
    "tulip port differs from its healthcheck": lambda c: _env(c["services"]["tulip"], TULIP_PORT="50052"),
    "unknown IVY_ variable": lambda c: _env(c["services"]["ivy"], IVY_REPLICA="tulip:50051"),
    "invalid TULIP_ value": lambda c: _env(c["services"]["tulip"], TULIP_MAX_BATCH_SEQS="0"),
    "ivy starts before tulip is healthy": lambda c: c["services"]["ivy"]["depends_on"]["tulip"].update(
        condition="service_started"),
    "tulip without a GPU": lambda c: c["services"]["tulip"].pop("deploy"),
    "no such subcommand": lambda c: c["services"]["tulip"].update(command=["server"]),
    "healthcheck is not tulip health": lambda c: c["services"]["tulip"]["healthcheck"].update(
        test=["CMD", "tulip", "healthz"]),
    "healthcheck on another port": lambda c: c["services"]["tulip"]["healthcheck"].update(
        test=["CMD", "tulip", "health", "--address", "127.0.0.1:50052"]),
    "ivy healthcheck on /health": lambda c: c["services"]["ivy"]["healthcheck"].update(
        test=[t.replace("/ready", "/health") for t in c["services"]["ivy"]["healthcheck"]["test"]]),
    "IVY_REPLICAS names no service": lambda c: _env(c["services"]["ivy"], IVY_REPLICAS="tulip-0:50051"),
    "metrics bound to loopback": lambda c: _env(c["services"]["tulip"], TULIP_METRICS_HOST="127.0.0.1"),
    "TULIP_MODEL not the mounted folder": lambda c: _env(c["services"]["tulip"], TULIP_MODEL="/models/other"),
    "ivy tokenizes another model": lambda c: _env(c["services"]["ivy"], IVY_MODEL=""),
    "kernels into another cache": lambda c: c["services"]["kernels"].update(
        command=["build-kernels", "/models/model", "--cache-dir", "/tmp/k"]),
}


@pytest.mark.parametrize("breakage", COMPOSE_BREAKAGES.values(), ids=COMPOSE_BREAKAGES.keys())
def test_compose_check_catches(breakage) -> None:
    compose = load_compose(MODEL_SET)
    check_compose(copy.deepcopy(compose), dockerfiles(), MODEL_SET)
    breakage(compose)
    with pytest.raises(AssertionError):
        check_compose(compose, dockerfiles(), MODEL_SET)


def test_compose_check_catches_a_model_variable_that_ignores_model_dir() -> None:
    text = (ROOT / "docker-compose.yml").read_text()
    assert "TULIP_MODEL: ${MODEL_DIR:+/models/model}" in text
    broken = load_compose(MODEL_SET, text.replace("TULIP_MODEL: ${MODEL_DIR:+/models/model}",
                                                  "TULIP_MODEL: ${TULIP_MODEL:-}"))
    with pytest.raises(AssertionError, match="TULIP_MODEL"):
        check_compose(broken, dockerfiles(), MODEL_SET)


def _k8s_container(objects: dict, kind: str) -> dict:
    workload = objects[("StatefulSet" if kind == "tulip" else "Deployment", kind)]
    return workload["spec"]["template"]["spec"]["containers"][0]


def _k8s_env(objects: dict, kind: str, name: str, value: str) -> None:
    env = _k8s_container(objects, kind)["env"]
    env[:] = [e for e in env if e["name"] != name] + [{"name": name, "value": value}]


K8S_BREAKAGES = {
    "tulip readiness on another port": lambda o: _k8s_container(o, "tulip")["readinessProbe"].update(
        grpc={"port": 50052}),
    "ivy readiness on /health": lambda o: _k8s_container(o, "ivy")["readinessProbe"]["httpGet"].update(
        path="/health"),
    "more tulips than IVY_REPLICAS": lambda o: o[("StatefulSet", "tulip")]["spec"].update(replicas=3),
    "unknown TULIP_ variable": lambda o: _k8s_env(o, "tulip", "TULIP_MODEL_DIR", "/models/model"),
    "unknown flag": lambda o: _k8s_container(o, "tulip").update(args=["serve", "--no-such-flag", "1"]),
    "ivy tokenizes another folder": lambda o: _k8s_env(o, "ivy", "IVY_MODEL", "/models/other"),
    "metrics bound to loopback": lambda o: _k8s_env(o, "tulip", "TULIP_METRICS_HOST", "127.0.0.1"),
    "grpc port differs from TULIP_PORT": lambda o: _k8s_env(o, "tulip", "TULIP_PORT", "50052"),
    "no GPU": lambda o: _k8s_container(o, "tulip")["resources"]["limits"].pop("nvidia.com/gpu"),
    "service targets no port": lambda o: o[("Service", "tulip")]["spec"]["ports"][0].update(targetPort="rpc"),
}


@pytest.mark.parametrize("breakage", K8S_BREAKAGES.values(), ids=K8S_BREAKAGES.keys())
def test_k8s_check_catches(breakage) -> None:
    objects = load_k8s()
    check_k8s(copy.deepcopy(objects), dockerfiles())
    breakage(objects)
    with pytest.raises(AssertionError):
        check_k8s(objects, dockerfiles())


DOCKERFILE_BREAKAGES = {
    "tulip grpc port not exposed": ("tulip", "EXPOSE 50051 9400", "EXPOSE 9400"),
    "tulip healthcheck not a subcommand": ("tulip", 'CMD ["tulip", "health"]', 'CMD ["tulip", "healthz"]'),
    "tulip metrics on loopback": ("tulip", "TULIP_METRICS_HOST=0.0.0.0", "TULIP_METRICS_HOST=127.0.0.1"),
    "tulip unknown variable": ("tulip", "TULIP_PORT=50051", "TULIP_PORT=50051 TULIP_GRPC_PORT=50051"),
    "ivy no such command": ("ivy", 'CMD ["serve"]', 'CMD ["server"]'),
    "ivy port not exposed": ("ivy", "IVY_PORT=8080", "IVY_PORT=8081"),
    "ivy without protos": ("ivy", "COPY protos protos\n", ""),
}


@pytest.mark.parametrize("breakage", DOCKERFILE_BREAKAGES.values(), ids=DOCKERFILE_BREAKAGES.keys())
def test_dockerfile_check_catches(breakage, tmp_path: Path) -> None:
    kind, old, new = breakage
    text = (ROOT / "deploy" / f"Dockerfile.{kind}").read_text()
    assert old in text, f"breakage {old!r} no longer applies to Dockerfile.{kind}"
    broken = tmp_path / f"Dockerfile.{kind}"
    broken.write_text(text.replace(old, new))
    with pytest.raises(AssertionError):
        check_dockerfile(kind, parse_dockerfile(broken))
