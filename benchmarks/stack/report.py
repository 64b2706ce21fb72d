"""From timed samples to records, the run's environment, the JSON file and the PNG plots.

A record's rates use one wall-clock window over all of its samples (first send to last answer, across
every client process), so rps and tokens/s are what the server delivered, not a sum of per-client
rates. Cost per million: the GPU-hour price times the GPU count, spread over the measured rate; it
is meaningful for the saturating suites (throughput, high concurrency), a ceiling for the others.
"""

from __future__ import annotations

import json
import os
import platform
import re
import socket
import subprocess
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from benchmarks.stack.client import TIMING_KEYS, Sample, StackError

REPO = Path(__file__).resolve().parents[2]
RECORD_KEYS = ("suite", "param", "p50_ms", "p95_ms", "p99_ms", "rps", "tokens_per_s")


@dataclass(frozen=True)
class CostBasis:
    gpu_hour_price: float
    gpus: int

    @property
    def usd_per_s(self) -> float:
        return self.gpu_hour_price * self.gpus / 3600.0

    def per_million(self, rate_per_s: float) -> float | None:
        return None if rate_per_s <= 0 or self.gpu_hour_price <= 0 else self.usd_per_s / rate_per_s * 1e6


def summarize(suite: str, param: int, samples: Sequence[Sample], cost: CostBasis | None = None,
              **extra: Any) -> dict[str, Any]:
    """One record: latency percentiles over the successful requests, rates over the whole window."""
    ok = [s for s in samples if s.ok]
    if not ok:
        raise StackError(f"{suite} {param}: all {len(samples)} requests failed")
    latency_ms = np.array([s.latency_s for s in ok]) * 1e3
    window = max(s.start_s + s.latency_s for s in samples) - min(s.start_s for s in samples)
    window = max(window, 1e-9)
    tokens = sum(s.tokens for s in ok)
    items = sum(s.items for s in ok)
    from_usage = sum(s.tokens_from_usage for s in ok)
    p50, p95, p99 = (float(v) for v in np.percentile(latency_ms, [50, 95, 99]))
    record: dict[str, Any] = {
        "suite": suite, "param": param, "p50_ms": p50, "p95_ms": p95, "p99_ms": p99,
        "rps": len(ok) / window, "tokens_per_s": tokens / window,
        "embeddings_per_s": items / window, "mean_ms": float(latency_ms.mean()),
        "min_ms": float(latency_ms.min()), "max_ms": float(latency_ms.max()),
        "requests": len(ok), "errors": len(samples) - len(ok), "window_s": window,
        "tokens_per_request": tokens / len(ok), "items_per_request": items / len(ok),
        "tokens_source": "usage" if from_usage == len(ok) else "client" if from_usage == 0 else "mixed",
    }
    record.update(steady_and_cold(ok))
    timing = server_timing(ok)
    if timing:
        record["server_timing_p50_ms"] = timing
    cpu = [s.client_cpu_s for s in ok if s.client_cpu_s is not None]
    if cpu:  # the benchmark client's own work per request (request encoding, response parsing and decoding; its
        # calling thread's CPU only: what grpc's own C-core threads spend for the Tulip-direct layer is not in it)
        record["client_cpu_p50_ms"] = float(np.median(cpu)) * 1e3
    if cost is not None:
        record["cost_per_million_embeddings_usd"] = cost.per_million(record["embeddings_per_s"])
        record["cost_per_million_tokens_usd"] = cost.per_million(record["tokens_per_s"])
    record.update(extra)
    return record


def steady_and_cold(ok: Sequence[Sample]) -> dict[str, Any]:
    """The steady state apart from the cold hits (requests the server marked X-Cold-Start: a CUDA-graph
    layout met without its graph: its eager first run or its capture): their count and latencies, and the
    percentiles of the others. p50/p95/p99 above stay over every request."""
    cold = np.array([s.latency_s for s in ok if s.cold]) * 1e3
    warm = np.array([s.latency_s for s in ok if not s.cold]) * 1e3
    out: dict[str, Any] = {"cold_requests": int(cold.size)}
    if cold.size:
        out.update(cold_p50_ms=float(np.percentile(cold, 50)), cold_max_ms=float(cold.max()))
    if warm.size:
        w50, w99 = (float(v) for v in np.percentile(warm, [50, 99]))
        out.update(steady_p50_ms=w50, steady_p99_ms=w99)
    return out


def server_timing(ok: Sequence[Sample]) -> dict[str, float]:
    """The medians of the server's own account over the requests that sent one (client.TIMING_KEYS: Ivy's
    whole time and its tokenizing, Tulip's queue, inference and whole), each over the requests that had it;
    beside the client's p50 they split a request's time into its layers."""
    rows = np.array([s.timing for s in ok if s.timing is not None], dtype=np.float64)
    if not rows.size:
        return {}
    out = {}
    for key, column in zip(TIMING_KEYS, rows.T):
        column = column[~np.isnan(column)]
        if column.size:
            out[key] = float(np.median(column))
    return out


def failed_record(suite: str, param: int | None, error: str, **extra: Any) -> dict[str, Any]:
    """A step that failed: its error, null numbers, and the same extra fields a measured record has."""
    return {"suite": suite, "param": param, **{key: None for key in RECORD_KEYS[2:]},
            "requests": 0, "errors": None, "error": error, **extra}


def measured(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records with numbers (not failed steps)."""
    return [r for r in records if not r.get("error") and r.get("p50_ms") is not None]


def _run(cmd: Sequence[str], cwd: Path | None = None) -> str | None:
    try:
        out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=20, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def gpu_env() -> dict[str, Any]:
    """GPU name, driver and CUDA version from nvidia-smi, torch's view when torch is installed."""
    env: dict[str, Any] = {}
    query = _run(["nvidia-smi", "--query-gpu=index,name,driver_version,memory.total", "--format=csv,noheader"])
    if query:
        fields = ("index", "name", "driver", "memory")
        env["gpus"] = [dict(zip(fields, (p.strip() for p in line.split(",")), strict=False))
                       for line in query.splitlines()]
        header = _run(["nvidia-smi"]) or ""
        match = re.search(r"CUDA Version:\s*([\d.]+)", header)
        env["cuda_driver_version"] = match.group(1) if match else None
    try:
        import torch
    except ImportError:
        env["torch"] = None
    else:
        env["torch"] = torch.__version__
        env["torch_cuda"] = torch.version.cuda
        if torch.cuda.is_available():
            env["torch_device"] = torch.cuda.get_device_name(0)
            env["cudnn"] = torch.backends.cudnn.version()
    return env


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def collect_env(config: dict[str, Any], argv: Sequence[str], server: dict[str, Any],
                inputs: dict[str, Any]) -> dict[str, Any]:
    """Where and how the numbers were taken: host, versions, git, the full config and the inputs."""
    status = _run(["git", "status", "--porcelain"], cwd=REPO)
    return {
        "timestamp": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "python": sys.version.split()[0],
        "git_commit": _run(["git", "rev-parse", "HEAD"], cwd=REPO),
        "git_dirty": bool(status) if status is not None else None,
        "packages": {n: _version(n) for n in ("numpy", "tokenizers", "orjson", "ivy-tulip-rose")},
        **gpu_env(),
        "config": config,
        "argv": list(argv),
        "server": server,
        "inputs": inputs,
        "note": "the env describes the client machine; run the client on the stack's host for GPU facts",
    }


def result_stem(model: str, label: str | None = None) -> str:
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", model).strip("_") or "model"
    return f"stack_{safe}" + (f"_{re.sub(r'[^A-Za-z0-9._-]+', '_', label)}" if label else "")


def write_result(out_dir: Path, stem: str, env: dict[str, Any], records: list[dict[str, Any]]) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{stem}.json"
    path.write_text(json.dumps({"env": env, "records": records}, indent=2, default=str) + "\n")
    return path


def write_plots(out_dir: Path, stem: str, records: list[dict[str, Any]], title: str) -> list[Path]:
    """Latency vs concurrency and the saturation curve (throughput vs offered concurrency)."""
    records = measured(records)
    rows = sorted((r for r in records if r["suite"] == "concurrency"), key=lambda r: r["param"])
    if not rows:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    clients = [r["param"] for r in rows]
    paths = []

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for key, style in (("p50_ms", "o-"), ("p95_ms", "s--"), ("p99_ms", "^:")):
        ax.plot(clients, [r[key] for r in rows], style, label=key.split("_")[0])
    ax.set(xscale="log", xlabel="concurrent clients (one document per request)", ylabel="latency (ms)",
           title=f"{title}: latency vs concurrency")
    ax.set_ylim(bottom=0)
    ax.set_xticks(clients, [str(c) for c in clients])
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.grid(True, alpha=0.3)
    ax.legend()
    paths.append(out_dir / f"{stem}_latency_vs_concurrency.png")
    fig.tight_layout()
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    ax.plot(clients, [r["rps"] for r in rows], "o-", color="tab:blue", label="requests/s")
    ax.set(xscale="log", xlabel="offered concurrency (clients)", ylabel="requests/s (one document each)",
           title=f"{title}: saturation curve")
    ax.set_xticks(clients, [str(c) for c in clients])
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    batched = [r for r in records if r["suite"] == "throughput"]
    if batched:  # the batched suite's embeddings/s: how far single-document traffic is from it
        b = batched[0]
        ax.axhline(b["embeddings_per_s"], color="tab:green", linestyle=":",
                   label=f"throughput suite, embeddings/s ({b.get('clients', '?')} procs x {b['param']} docs)")
    right = ax.twinx()
    right.plot(clients, [r["tokens_per_s"] for r in rows], "s--", color="tab:orange", label="tokens/s")
    right.set_ylabel("tokens/s")
    ax.set_ylim(bottom=0)
    right.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    more_handles, more_labels = right.get_legend_handles_labels()
    ax.legend(handles + more_handles, labels + more_labels, loc="lower right", fontsize="small")
    paths.append(out_dir / f"{stem}_saturation.png")
    fig.tight_layout()
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)
    return paths
