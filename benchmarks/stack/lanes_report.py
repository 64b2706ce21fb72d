"""The lanes run's targets, file, plot and table (benchmarks/stack/lanes.py).

Targets (issue 17), with Tulip's defaults (`layers`: lanes on, bulk stepped layer by layer, interactive work
between its layers): the interactive p99 at most 2 x its idle p99, and bulk tokens/s at least 90 % of its FCFS
(lanes off) throughput; the same ratios for `express` (interactive work beside bulk on the express lane:
TULIP_BULK_LAYERS_AHEAD=0), `lanes` (lanes on, express off: TULIP_EXPRESS_BATCH_TOKENS=0) and `capped`
(express off, TULIP_INTERACTIVE_BATCH_TOKENS: batches capped while interactive traffic is about). OUT/lanes[_<label>].json = {"env", "targets", "records"}; the PNG
has the interactive latency per configuration (p50 solid, p99 light, the 2 x idle p99 line) and the bulk
throughput (the 90 % of FCFS line). Redraw: python -m benchmarks.stack.lanes_report FILE.json.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Sequence

CONFIGS = ("idle", "fcfs", "lanes", "express", "layers", "capped")
TARGETED = (("layers", ""), ("express", "express_"), ("lanes", "lanes_"), ("capped", "capped_"))  # configuration, its targets' prefix
P99_FACTOR, BULK_SHARE = 2.0, 0.9


def find(records: Sequence[dict[str, Any]], config: str, traffic: str) -> dict[str, Any] | None:
    for r in records:
        if r.get("config") == config and r.get("traffic") == traffic and not r.get("error"):
            return r
    return None


def query_device_ms(records: Sequence[dict[str, Any]]) -> float | None:
    """Device milliseconds of one interactive query, from the idle configuration's Tulip counters."""
    idle = find(records, "idle", "interactive")
    server = (idle or {}).get("server") or {}
    busy, batches = server.get("device_busy_seconds"), server.get("batches")
    return 1e3 * busy / batches if busy and batches else None


def targets(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Each target's measured ratio and verdict (None where a configuration it needs is missing): for layers
    (the defaults), and the same ratios under `express_`, `lanes_` and `capped_` for those configurations. Beside
    the bulk ratio, `..._net`: bulk against what FCFS would do with the device time the interactive client's own
    queries leave (its queries a second x one query's device time when idle): what the scheduling itself costs."""
    out: dict[str, Any] = {}
    per_query = query_device_ms(records)
    for config, prefix in TARGETED:
        idle, on_i = find(records, "idle", "interactive"), find(records, config, "interactive")
        fcfs_b, on_b = find(records, "fcfs", "bulk"), find(records, config, "bulk")
        p99 = on_i["p99_ms"] / idle["p99_ms"] if idle and on_i and idle["p99_ms"] else None
        bulk = on_b["tokens_per_s"] / fcfs_b["tokens_per_s"] if fcfs_b and on_b and fcfs_b["tokens_per_s"] else None
        if prefix and p99 is None and bulk is None:
            continue  # no such configuration in this run
        share = on_i["rps"] * per_query / 1e3 if per_query and on_i else None
        net = bulk / (1 - share) if bulk is not None and share is not None and share < 1 else None
        out.update({
            f"{prefix}interactive_p99_over_idle": None if p99 is None else round(p99, 3),
            f"{prefix}interactive_p99_target": f"<= {P99_FACTOR:g}",
            f"{prefix}interactive_p99_met": None if p99 is None else p99 <= P99_FACTOR,
            f"{prefix}bulk_tokens_over_fcfs": None if bulk is None else round(bulk, 3),
            f"{prefix}bulk_tokens_target": f">= {BULK_SHARE:g}",
            f"{prefix}bulk_tokens_met": None if bulk is None else bulk >= BULK_SHARE,
            f"{prefix}interactive_device_share": None if share is None else round(share, 3),
            f"{prefix}bulk_tokens_over_fcfs_net": None if net is None else round(net, 3),
        })
    return out


def write_lanes(out_dir: Path, stem: str, env: dict[str, Any], records: list[dict[str, Any]],
                plot: bool = True) -> list[Path]:
    """The JSON (always, targets first) and, with `plot`, the PNG when matplotlib is installed."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{stem}.json"
    path.write_text(json.dumps({"env": env, "targets": targets(records), "records": records}, indent=2,
                               default=str) + "\n")
    paths = [path]
    if plot and any(not r.get("error") for r in records):
        try:
            paths.append(write_lanes_plot(out_dir / f"{stem}.png", records, plot_title(env, stem)))
        except ImportError:
            print("matplotlib is not installed: no PNG", flush=True)
    return paths


def plot_title(env: dict[str, Any], stem: str) -> str:
    """The model, the commit and the GPU (or the host's platform) of a run."""
    where = env.get("gpu") or env.get("platform") or "?"
    return f"{env.get('model') or stem} @ {str(env.get('commit') or '?')[:10]} on {where}"


def write_lanes_plot(path: Path, records: list[dict[str, Any]], title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.2))
    shown = [c for c in CONFIGS if find(records, c, "interactive")]
    for x, config in enumerate(shown):
        r = find(records, config, "interactive")
        left.bar(x, r["p99_ms"], 0.6, color="tab:blue", alpha=0.3, label="p99" if x == 0 else None)
        left.bar(x, r["p50_ms"], 0.6, color="tab:blue", label="p50" if x == 0 else None)
    idle = find(records, "idle", "interactive")
    if idle:
        left.axhline(P99_FACTOR * idle["p99_ms"], color="tab:red", linestyle=":", label="target: 2 x idle p99")
    left.set_xticks(range(len(shown)), shown)
    left.set(title="interactive: 1 client, single queries", ylabel="latency (ms)")
    left.legend(fontsize="small")
    bulk = [c for c in CONFIGS if find(records, c, "bulk")]
    right.bar(range(len(bulk)), [find(records, c, "bulk")["tokens_per_s"] / 1e3 for c in bulk], 0.6, color="tab:green")
    fcfs = find(records, "fcfs", "bulk")
    if fcfs:
        right.axhline(BULK_SHARE * fcfs["tokens_per_s"] / 1e3, color="tab:red", linestyle=":",
                      label="target: 90 % of FCFS")
        right.legend(fontsize="small")
    right.set_xticks(range(len(bulk)), bulk)
    right.set(title="bulk: closed-loop batches, priority bulk", ylabel="k tokens/s")
    for ax in (left, right):
        ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle(f"{title}: priority lanes (idle / FCFS = lanes off / lanes / express / layers / capped), one run",
                 fontsize="medium")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def table(records: Sequence[dict[str, Any]]) -> str:
    """The records and the targets, for the end of the run's output."""
    lines = [f"{'config':7s} {'traffic':12s} {'clients':>7s} {'p50 ms':>8s} {'p99 ms':>8s} {'req/s':>8s} "
             f"{'k tok/s':>9s} {'errors':>6s}"]
    for r in sorted(records, key=lambda r: (CONFIGS.index(r["config"]), r["traffic"] != "interactive")):
        head = f"{r['config']:7s} {r['traffic']:12s} {r.get('clients', 0):7d}"
        if r.get("error"):
            lines.append(f"{head} ERROR {str(r['error'])[:70]}")
            continue
        lines.append(f"{head} {r['p50_ms']:8.2f} {r['p99_ms']:8.2f} {r['rps']:8.1f} {r['tokens_per_s'] / 1e3:9.1f} "
                     f"{r['errors']:6d}")
    t = targets(records)

    def verdict(met: bool | None) -> str:
        return "n/a" if met is None else "MET" if met else "MISSED"

    for name, prefix in TARGETED:
        if f"{prefix}interactive_p99_over_idle" not in t:
            continue
        p99, bulk = t[f"{prefix}interactive_p99_over_idle"], t[f"{prefix}bulk_tokens_over_fcfs"]
        lines.append(f"target: interactive p99 with {name} <= 2 x idle p99: "
                     f"{'n/a' if p99 is None else f'{p99:.2f} x'} {verdict(t[f'{prefix}interactive_p99_met'])}")
        lines.append(f"target: bulk tokens/s with {name} >= 90 % of FCFS: "
                     f"{'n/a' if bulk is None else f'{bulk:.1%}'} {verdict(t[f'{prefix}bulk_tokens_met'])}")
        if (net := t[f"{prefix}bulk_tokens_over_fcfs_net"]) is not None:
            lines.append(f"  (the interactive client's own queries took {t[f'{prefix}interactive_device_share']:.1%} "
                         f"of the device; bulk over FCFS on the rest: {net:.1%})")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m benchmarks.stack.lanes_report FILE.json`: (re)draw FILE.png and print the table."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("result", type=Path)
    args = parser.parse_args(argv)
    data = json.loads(args.result.read_text())
    print(write_lanes_plot(args.result.with_suffix(".png"), data["records"], plot_title(data["env"], "lanes")))
    print(table(data["records"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
