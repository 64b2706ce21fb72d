"""deploy/grafana/ivy-tulip-rose.json only queries metrics the services really export (a renamed metric
would leave a panel silently empty)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client import CollectorRegistry

DASHBOARD = Path(__file__).resolve().parents[1] / "deploy" / "grafana" / "ivy-tulip-rose.json"
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",), "summary": ("_sum", "_count")}


def _sample_names(registry) -> set[str]:
    names = set()
    for family in registry.collect():
        for suffix in SUFFIXES.get(family.type, ("",)):
            names.add(family.name + suffix)
    return names


def exported() -> set[str]:
    from prometheus_client import REGISTRY

    import ivy.metrics  # noqa: F401 - registers the gateway's metrics
    from tulip.metrics import TulipMetrics

    tulip = TulipMetrics(CollectorRegistry())
    stats = {"pinned_bytes_in_use": 0, "pinned_bytes_cap": 1, "graphs_captured": 2, "graph_capture_seconds": 0.1,
             "step_seconds_last": 0.001, "runs": {("t128", "replay"): 3}}  # the keys ROSE's Engine.stats() has
    tulip.bind_state(queue_depth=lambda: (0, 0), inflight=lambda: 0, ready=lambda: True, engine_stats=lambda: stats,
                     device_busy=lambda: 0.0)  # as TulipServer binds it
    return _sample_names(REGISTRY) | _sample_names(tulip.registry)


def test_every_dashboard_query_names_an_exported_metric() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {m for e in exprs for m in re.findall(r"\b(?:ivy|tulip|rose)_[a-z_]+", e)}
    assert len(used) >= 15
    missing = used - exported()
    assert not missing, f"the dashboard queries metrics nobody exports: {sorted(missing)}"


def test_rose_stats_keys_the_dashboard_relies_on_exist() -> None:
    import inspect

    from rose.engine import Engine

    source = inspect.getsource(Engine.stats)
    for key in ("pinned_bytes_in_use", "graphs_captured", '"runs"'):
        assert key in source
