"""The rules deploy/k8s keeps beyond agreeing with the CLIs (deploy_rules.check_k8s): validity against the
Kubernetes and CRD schemas, hardened pods, the model volume's one writer, disruption budgets, the network
policy, autoscaling on Tulip's queue, scraping, and alerts on metrics the services export. Each check raises
AssertionError naming the object and the field."""

from __future__ import annotations

import json
import re
from pathlib import Path

from deploy_checks import ROOT, check_env, containers_of, k8s_env, pod_specs

CRD_SCHEMAS = Path(__file__).with_name("deploy_crd_schemas.json")
RUNBOOK = ROOT / "deploy" / "RUNBOOK.md"
K8S_VERSIONS = ("1.29.0", "latest")  # grpc probes need 1.24, StatefulSet PVC retention 1.27 (beta, on)


# ---- schemas ------------------------------------------------------------------------------------------------


def _strict(schema):
    """A CRD schema as the API server's strict field validation reads it: no field it does not declare."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) for k, v in schema.items()}
    if "properties" in out and "additionalProperties" not in out and \
            not out.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    return out


def check_schemas(objects: dict) -> None:
    """Core kinds against Kubernetes' own schemas (kubernetes-validate, strict: unknown fields fail), custom
    resources against the CRDs' schemas in deploy_crd_schemas.json, made strict the same way."""
    import jsonschema
    import kubernetes_validate

    crds = json.loads(CRD_SCHEMAS.read_text())
    versions = [kubernetes_validate.latest_version() if v == "latest" else v for v in K8S_VERSIONS]
    for (kind, name), obj in objects.items():
        key = f"{obj['apiVersion']} {kind}"
        if key in crds:
            errors = sorted(jsonschema.Draft7Validator(_strict(crds[key]["schema"])).iter_errors(obj), key=str)
            assert not errors, f"k8s {kind}/{name}: {errors[0].message} at {list(errors[0].absolute_path)}"
            continue
        for version in versions:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                raise AssertionError(f"k8s {kind}/{name} (Kubernetes {version}): {exc.message} at "
                                     f"{list(exc.path)}") from None
            except kubernetes_validate.SchemaNotFoundError:
                raise AssertionError(f"k8s {kind}/{name}: no schema for {key} (a CRD? add it to "
                                     f"{CRD_SCHEMAS.name})") from None


# ---- pods ---------------------------------------------------------------------------------------------------


def check_hardening(objects: dict, files: dict) -> None:
    """Every pod runs as the images' non-root user; every container keeps no capability, cannot escalate and
    has a read-only root filesystem (what must be written goes to a volume)."""
    for where, pod in pod_specs(objects).items():
        ctx = pod.get("securityContext", {})
        assert ctx.get("runAsNonRoot") is True, f"k8s {where}: runAsNonRoot"
        assert pod.get("automountServiceAccountToken") is False, \
            f"k8s {where}: automountServiceAccountToken must be false (no container talks to the API server)"
        images = {c["image"].rsplit("/", 1)[-1].split(":")[0] for c in pod["containers"]}
        for kind in images & set(files):
            uid = int(files[kind].user.split(":")[0])
            assert ctx.get("runAsUser") == uid, f"k8s {where}: runAsUser {ctx.get('runAsUser')} != the image's {uid}"
        for c in containers_of(pod):
            sc = c.get("securityContext", {})
            assert sc.get("allowPrivilegeEscalation") is False, f"k8s {where} {c['name']}: allowPrivilegeEscalation"
            assert "ALL" in sc.get("capabilities", {}).get("drop", []), f"k8s {where} {c['name']}: drop ALL"
            assert sc.get("readOnlyRootFilesystem") is True, f"k8s {where} {c['name']}: readOnlyRootFilesystem"
            assert c.get("resources", {}).get("requests"), f"k8s {where} {c['name']}: no resource requests"


def _spread_over_nodes(pod: dict, labels: dict) -> bool:
    """A topology spread over nodes, or a pod anti-affinity on the node, among the pods of these labels."""
    spreads = [c for c in pod.get("topologySpreadConstraints", []) if c["topologyKey"] == "kubernetes.io/hostname"
               and c.get("maxSkew") == 1 and _selects(c.get("labelSelector", {}), labels)]
    anti = pod.get("affinity", {}).get("podAntiAffinity", {})
    terms = [*anti.get("requiredDuringSchedulingIgnoredDuringExecution", []),
             *(t["podAffinityTerm"] for t in anti.get("preferredDuringSchedulingIgnoredDuringExecution", []))]
    return bool(spreads) or any(t["topologyKey"] == "kubernetes.io/hostname"
                                and _selects(t.get("labelSelector", {}), labels) for t in terms)


def check_scheduling(objects: dict) -> None:
    """Where the pods land: each service's replicas spread over nodes (a PodDisruptionBudget guards only
    voluntary evictions: two gateways on one node go down together when it fails), and Tulip tolerates the
    taint GPU nodes commonly carry (nvidia.com/gpu), or it never schedules on them."""
    for kind, name in (("Deployment", "ivy"), ("StatefulSet", "tulip")):
        template = objects[(kind, name)]["spec"]["template"]
        assert _spread_over_nodes(template["spec"], template["metadata"]["labels"]), \
            f"k8s {kind}/{name}: no topologySpreadConstraints (maxSkew 1) or pod anti-affinity over " \
            "kubernetes.io/hostname selecting its own pods"
    pod = objects[("StatefulSet", "tulip")]["spec"]["template"]["spec"]
    assert any(t.get("key") == "nvidia.com/gpu" and t.get("operator") == "Exists"
               and t.get("effect") in (None, "NoSchedule") for t in pod.get("tolerations", [])), \
        "k8s StatefulSet/tulip: no toleration of the nvidia.com/gpu taint GPU nodes carry"


def _claim_mounts(pod: dict, claim: str) -> list[tuple[dict, dict]]:
    """(container, mount) of every container mounting the claim."""
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    return [(c, m) for c in containers_of(pod) for m in c.get("volumeMounts", [])
            if volumes.get(m["name"], {}).get("persistentVolumeClaim", {}).get("claimName") == claim]


def check_model_volume(objects: dict) -> None:
    """One Job writes the model claim; the services mount it read-only and wait for the Job's marker."""
    (claim,) = [name for (kind, name) in objects if kind == "PersistentVolumeClaim"]
    modes = objects[("PersistentVolumeClaim", claim)]["spec"]["accessModes"]
    writers = []
    for where, pod in pod_specs(objects).items():
        for container, mount in _claim_mounts(pod, claim):
            if not mount.get("readOnly"):
                writers.append((where, container))
            elif not where.startswith("Job/"):
                volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
                assert volume["persistentVolumeClaim"].get("readOnly"), f"k8s {where}: claim {claim} not read-only"
    assert [w for w, _ in writers if not w.startswith("Job/")] == [], f"k8s: {[w for w, _ in writers]} write the model"
    assert len(writers) == 1, f"k8s: one Job fills the model volume, found {[w for w, _ in writers]}"
    [(job, writer)] = writers
    assert "ReadWriteMany" in modes, f"k8s claim {claim}: {job} writes it while pods on other nodes read it"
    marker = re.search(r"touch (\S+)", " ".join(writer.get("args", [])))
    assert marker, f"k8s {job}: writes no completion marker last"
    for where, pod in pod_specs(objects).items():
        if where != job:
            waits = [c for c in pod.get("initContainers", []) if marker[1] in " ".join(c.get("command", []))]
            assert waits, f"k8s {where}: no init container waits for {marker[1]}"


def check_persistent_caches(objects: dict) -> None:
    """What a Tulip pod learns at its first start and reads at the next lives on its own persistent volume (a
    volumeClaimTemplate), not in the tmp volume a restart empties: the graph manifest, Triton's cache of
    ROSE's kernels (TRITON_CACHE_DIR; a cold cache cost the 0.6B ~5-15 s of its start to ready) and the kernel
    manifest (left at auto it goes under $HOME, the tmp volume, as the model's folder is read-only: a start after
    an upgrade then compiles its kernels one by one, ~42 s to ready against ~18)."""
    tulip = objects[("StatefulSet", "tulip")]["spec"]
    claims = {t["metadata"]["name"] for t in tulip.get("volumeClaimTemplates", [])}
    (container,) = [c for c in tulip["template"]["spec"]["containers"] if c["name"] == "tulip"]
    persistent = [m["mountPath"] for m in container.get("volumeMounts", []) if m["name"] in claims
                  and not m.get("readOnly")]
    env = {e["name"]: e.get("value", "") for e in container.get("env", [])}
    for name in ("TULIP_GRAPH_MANIFEST", "TRITON_CACHE_DIR", "TULIP_KERNEL_MANIFEST"):
        path = env.get(name, "")
        assert any(path == m or path.startswith(m.rstrip("/") + "/") for m in persistent), (
            f"k8s StatefulSet/tulip: {name}={path or '(unset)'} is not on a persistent volume {persistent}")


# ---- traffic ------------------------------------------------------------------------------------------------


def _selects(selector: dict, labels: dict) -> bool:
    match = selector.get("matchLabels", {})
    return bool(match) and all(labels.get(k) == v for k, v in match.items())


def _pod_labels(objects: dict, kind: str, name: str) -> dict:
    return objects[(kind, name)]["spec"]["template"]["metadata"]["labels"]


def check_disruption_budgets(objects: dict) -> None:
    for kind, name in (("StatefulSet", "tulip"), ("Deployment", "ivy")):
        labels = _pod_labels(objects, kind, name)
        budgets = [o for (k, _), o in objects.items() if k == "PodDisruptionBudget"
                   and _selects(o["spec"]["selector"], labels)]
        assert len(budgets) == 1, f"k8s: {kind}/{name} needs one PodDisruptionBudget, has {len(budgets)}"
        spec = budgets[0]["spec"]
        assert "maxUnavailable" in spec or "minAvailable" in spec, f"k8s PDB {budgets[0]['metadata']['name']}"


def check_network_policy(objects: dict) -> None:
    """Ingress to Tulip: its gRPC and framed ports from Ivy's pods only, its metrics port from Prometheus only."""
    tulip_labels = _pod_labels(objects, "StatefulSet", "tulip")
    ivy_labels = _pod_labels(objects, "Deployment", "ivy")
    policies = [o for (k, _), o in objects.items() if k == "NetworkPolicy"
                and _selects(o["spec"]["podSelector"], tulip_labels)]
    assert len(policies) == 1, f"k8s: one NetworkPolicy must select Tulip's pods, found {len(policies)}"
    spec = policies[0]["spec"]
    assert "Ingress" in spec.get("policyTypes", []), "k8s NetworkPolicy: policyTypes must include Ingress"
    by_port: dict[str, list[dict]] = {}
    for rule in spec.get("ingress", []):
        assert rule.get("from") and rule.get("ports"), f"k8s NetworkPolicy: a rule open to all: {rule}"
        for port in rule["ports"]:
            by_port.setdefault(port["port"], []).extend(rule["from"])
    assert set(by_port) == {"grpc", "framed", "metrics"}, f"k8s NetworkPolicy: opens {sorted(map(str, by_port))}"
    for name in ("grpc", "framed"):
        assert all(set(peer) == {"podSelector"} and _selects(peer["podSelector"], ivy_labels)
                   for peer in by_port[name]), f"k8s NetworkPolicy: {name} open beyond Ivy: {by_port[name]}"
    assert all(set(peer) <= {"podSelector", "namespaceSelector"} and not _selects(peer.get("podSelector", {}),
               ivy_labels) for peer in by_port["metrics"]), f"k8s NetworkPolicy: metrics: {by_port['metrics']}"


# ---- autoscaling and monitoring -----------------------------------------------------------------------------


def _tulip_config(objects: dict, files: dict):
    (container,) = objects[("StatefulSet", "tulip")]["spec"]["template"]["spec"]["containers"]
    return check_env("tulip", {**files["tulip"].env, **k8s_env(container)}, "k8s tulip")


def check_autoscaling(objects: dict, files: dict) -> None:
    """KEDA scales the Tulip StatefulSet on its queued tokens, an HPA the Ivy Deployment; neither workload
    pins `replicas` (each apply would reset what the autoscaler chose)."""
    from tulip.config import GPU_BATCH_TOKENS

    sts, service = objects[("StatefulSet", "tulip")], objects[("Service", "tulip-headless")]
    config = _tulip_config(objects, files)
    (scaled,) = [o for (k, _), o in objects.items() if k == "ScaledObject"]
    target = scaled["spec"]["scaleTargetRef"]
    assert (target.get("kind"), target["name"]) == ("StatefulSet", sts["metadata"]["name"]), f"KEDA: {target}"
    assert scaled["spec"].get("minReplicaCount", 0) >= 1, "KEDA: minReplicaCount 0 leaves no replica"
    (trigger,) = scaled["spec"]["triggers"]
    query = trigger["metadata"]["query"]
    assert trigger["type"] == "prometheus" and "tulip_queue_tokens{" in query, f"KEDA trigger: {trigger}"
    labels = dict(re.findall(r'(\w+)="([^"]*)"', query))
    assert labels == {"namespace": sts["metadata"]["namespace"], "service": service["metadata"]["name"]}, \
        f"KEDA query: {labels} must name Tulip's namespace and Service (another stack's queue would count)"
    threshold = float(trigger["metadata"]["threshold"])
    budget = config.max_batch_tokens or GPU_BATCH_TOKENS
    assert budget <= threshold < config.max_queue_tokens, \
        f"KEDA threshold {threshold}: at least one batch ({budget}) and below the queue's cap (429s)"
    assert "replicas" not in sts["spec"], "k8s tulip: `replicas` set while KEDA scales it"
    (hpa,) = [o for (k, _), o in objects.items() if k == "HorizontalPodAutoscaler"]
    assert hpa["spec"]["scaleTargetRef"]["name"] == "ivy" and hpa["spec"]["minReplicas"] >= 2, "HPA ivy"
    assert "replicas" not in objects[("Deployment", "ivy")]["spec"], "k8s ivy: `replicas` set while an HPA scales it"


def check_service_monitors(objects: dict, files: dict) -> None:
    """Each service is scraped where it serves /metrics: Tulip's metrics port, Ivy's HTTP port."""
    tulip_port = _tulip_config(objects, files).metrics_port
    for service_name, workload, want in (("tulip-headless", ("StatefulSet", "tulip"), tulip_port),
                                         ("ivy", ("Deployment", "ivy"), None)):
        service = objects[("Service", service_name)]
        monitors = [o for (k, _), o in objects.items() if k == "ServiceMonitor"
                    and _selects(o["spec"]["selector"], service["metadata"].get("labels", {}))]
        assert len(monitors) == 1, f"k8s: one ServiceMonitor must select Service {service_name}"
        (container,) = objects[workload]["spec"]["template"]["spec"]["containers"]
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        for endpoint in monitors[0]["spec"]["endpoints"]:
            (svc_port,) = [p for p in service["spec"]["ports"] if p["name"] == endpoint["port"]]
            target = ports.get(svc_port["targetPort"], svc_port["targetPort"])
            assert endpoint.get("path", "/metrics") == "/metrics", f"ServiceMonitor {service_name}: path"
            if want is not None:
                assert target == want, f"ServiceMonitor {service_name}: port {target} is not metrics port {want}"
            else:
                assert target == ports["http"], f"ServiceMonitor {service_name}: port {target}"


ALERTS = {"TulipQueueSaturated", "TulipReplicaDown", "GatewayLatencyP99High", "RoseGraphCaptureFailed", "TulipNotReady",
          "TulipAbsent", "GatewayAbsent"}  # the last two: a stack whose processes never start exports no series
CRASHLOOP_BACKOFF_CAP_S = 300  # kubelet's longest wait before it starts a crashed or killed container again
START_TO_METRICS_S = 60  # a restarted Tulip's process start to a scrape-able /metrics (imports, then bind)


def duration_s(text: str) -> float:
    """A Prometheus duration (30s, 10m, 1h30m) in seconds."""
    parts = re.findall(r"(\d+)(ms|s|m|h|d)", str(text))
    assert parts and "".join(n + u for n, u in parts) == str(text), f"not a Prometheus duration: {text!r}"
    return sum(int(n) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}[u] for n, u in parts)


def _check_over_restarts(rule: dict, scrape_interval_s: float, start_period_s: float) -> None:
    """An alert on tulip_ready must outlive the container restarts that come with not being ready: the startup
    probe restarts a Tulip not SERVING in its budget, one that refuses to serve exits, the liveness probe
    restarts a stalled one. Each restart leaves a scrape gap (stale series), and Prometheus drops a pending
    alert whose series is missing at one evaluation, so a plain `tulip_ready == 0` with a `for` longer than
    one attempt never fires. A max_over_time window wider than the longest gap bridges them; its `for` covers
    a normal start (the image's health-check start period), else every starting pod fires."""
    expr, where = rule["expr"], f"alert {rule['alert']}"
    windows = re.findall(r"max_over_time\(\s*tulip_ready(?:\{[^}]*\})?\[(\w+)\]\)", expr)
    assert windows and len(windows) == len(re.findall(r"\btulip_ready\b", expr)), \
        f"{where}: tulip_ready outside max_over_time: each restart's scrape gap resets its `for` ({expr})"
    gap = CRASHLOOP_BACKOFF_CAP_S + START_TO_METRICS_S + 2 * scrape_interval_s
    for window in windows:
        assert duration_s(window) > gap, f"{where}: window {window} <= the longest scrape gap of a restart ({gap} s)"
    assert duration_s(rule.get("for", "0s")) >= start_period_s, \
        f"{where}: `for` {rule.get('for', '0s')} shorter than a start ({start_period_s} s): every new pod fires"


def check_alerts(objects: dict, files: dict, exported: set[str]) -> None:
    """Alerts query only exported metrics in this namespace, the queue cap they divide by is Tulip's, and
    each links a RUNBOOK.md section."""
    namespace = objects[("StatefulSet", "tulip")]["metadata"]["namespace"]
    rules = [r for (k, _), o in objects.items() if k == "PrometheusRule"
             for group in o["spec"]["groups"] for r in group["rules"]]
    names = {r["alert"] for r in rules}
    assert ALERTS <= names, f"PrometheusRule: missing {sorted(ALERTS - names)}"
    anchors = {re.sub(r"[^a-z0-9 -]", "", h.strip().lower()).replace(" ", "-")
               for h in re.findall(r"^#+ (.+)$", RUNBOOK.read_text(), re.M)}
    cap = _tulip_config(objects, files).max_queue_tokens
    (monitor,) = [o for (k, _), o in objects.items() if k == "ServiceMonitor"
                  and _selects(o["spec"]["selector"], objects[("Service", "tulip-headless")]["metadata"]["labels"])]
    interval = max(duration_s(e.get("interval", "30s")) for e in monitor["spec"]["endpoints"])
    start_period = duration_s(files["tulip"].healthcheck_options.get("start-period", "0s"))
    for rule in rules:
        if "tulip_ready" in rule["expr"]:
            _check_over_restarts(rule, interval, start_period)
        expr, where = rule["expr"], f"alert {rule['alert']}"
        used = set(re.findall(r"\b(?:ivy|tulip|rose)_[a-z_]+", expr))
        assert used and used <= exported, f"{where}: queries {sorted(used - exported)}, which nobody exports"
        selectors = re.findall(r"\b(?:ivy|tulip|rose)_[a-z_]+(\{[^}]*\})?", expr)
        assert all(f'namespace="{namespace}"' in s for s in selectors), f"{where}: every selector names {namespace}"
        if "tulip_queue_tokens" in expr and "/" in expr:
            assert f"/ {cap}" in expr, f"{where}: divides by another cap than TULIP_MAX_QUEUE_TOKENS {cap}"
        anchor = rule.get("annotations", {}).get("runbook_url", "").partition("#")[2]
        assert anchor in anchors, f"{where}: runbook_url #{anchor} is no heading of deploy/RUNBOOK.md"
