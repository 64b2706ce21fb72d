"""The layers run's file and plot: OUT/stack_layers_<model>.json = {"env", "records"} (each record the
suites' record plus its `layer`) and OUT/stack_layers_<model>.png, p50 and p99 per layer per suite."""

from __future__ import annotations

import argparse
import json
import math
import re
from pathlib import Path
from typing import Any, Sequence

from benchmarks.gpu_env import git_commit
from benchmarks.stack.config import SUITES
from benchmarks.stack.report import measured, write_result

LAYERS = ("ivy-text", "ivy-ids", "tulip-grpc", "tulip-framed", "inprocess", "inprocess-closed")
COLORS = {"ivy-text": "tab:blue", "ivy-ids": "tab:orange", "tulip-grpc": "tab:green", "tulip-framed": "tab:olive",
          "inprocess": "tab:red", "inprocess-closed": "tab:purple"}
TULIP = ("tulip-grpc", "tulip-framed")  # Tulip direct with ids: over --tulip-call (gRPC), and its framed EmbedStream
INPROCESS = ("inprocess", "inprocess-closed")  # rose.Engine in the benchmark's process (--inprocess true)


def layers_stem(model: str, label: str | None = None) -> str:
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", model).strip("_") or "model"
    return f"stack_layers_{safe}" + (f"_{re.sub(r'[^A-Za-z0-9._-]+', '_', label)}" if label else "")


def headline_env(env: dict[str, Any]) -> dict[str, Any]:
    """gpu, driver, torch and commit first (GIT_COMMIT when the tree has no .git), then the rest."""
    gpus = env.get("gpus") or [{}]
    return {"gpu": gpus[0].get("name"), "driver": gpus[0].get("driver"), "torch": env.get("torch"),
            "commit": git_commit() or env.get("git_commit"), **env}


def write_layers(out_dir: Path, stem: str, env: dict[str, Any], records: list[dict[str, Any]],
                 title: str, plot: bool = True) -> list[Path]:
    """The JSON (always) and, with `plot`, the PNG (when some step has numbers)."""
    paths = [write_result(out_dir, stem, env, records)]
    if plot and measured(records):
        paths.append(write_layers_plot(out_dir / f"{stem}.png", records, title))
    return paths


def _value(records: Sequence[dict[str, Any]], layer: str, suite: str, param: Any, key: str) -> float:
    for r in records:
        if r.get("layer") == layer and r["suite"] == suite and r["param"] == param and r.get(key) is not None:
            return float(r[key])
    return math.nan


def write_layers_plot(path: Path, records: list[dict[str, Any]], title: str) -> Path:
    """One panel per suite; per step a group of bars, one per layer: p50 solid, p99 the light bar
    behind it; a failed step is an x at the bottom."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    suites = [s for s in SUITES if any(r["suite"] == s for r in records)]
    layers = [name for name in LAYERS if any(r.get("layer") == name for r in records)]
    fig, axes = plt.subplots(1, len(suites), figsize=(4.4 * len(suites), 4.2), squeeze=False)
    for ax, suite in zip(axes[0], suites):
        params = sorted({r["param"] for r in records if r["suite"] == suite and r["param"] is not None})
        x = np.arange(len(params))
        width = 0.8 / max(1, len(layers))
        for k, layer in enumerate(layers):
            at = x - 0.4 + width * (k + 0.5)
            p50 = [_value(records, layer, suite, p, "p50_ms") for p in params]
            p99 = [_value(records, layer, suite, p, "p99_ms") for p in params]
            ax.bar(at, p99, width, color=COLORS[layer], alpha=0.3)
            ax.bar(at, p50, width, color=COLORS[layer], label=layer)
            failed = [a for a, p in zip(at, params) if any(
                r.get("layer") == layer and r["suite"] == suite and r["param"] == p and r.get("error")
                for r in records)]
            if failed:
                ax.plot(failed, [0.02] * len(failed), "x", color=COLORS[layer], transform=ax.get_xaxis_transform())
        ax.set_xticks(x, [str(p) for p in params])
        ax.set(yscale="log", title=suite, ylabel="latency (ms): p50 solid, p99 light",
               xlabel={"embed-latency": "tokens", "score-latency": "documents", "throughput": "documents a request",
                       "concurrency": "clients"}.get(suite, "param"))
        ax.grid(True, axis="y", alpha=0.3)
    axes[0][0].legend(fontsize="small")
    fig.suptitle(f"{title}: the stack's layers, one run (x = failed step)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m benchmarks.stack.layers_report FILE.json`: (re)draw FILE.png from a layers file."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("result", type=Path)
    args = parser.parse_args(argv)
    data = json.loads(args.result.read_text())
    title = (data["env"].get("config") or {}).get("model") or args.result.stem
    print(write_layers_plot(args.result.with_suffix(".png"), data["records"], title))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
