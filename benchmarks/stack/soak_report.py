"""The soak's intervals, verdict, file, plot and table (benchmarks/stack/soak.py).

Times are seconds since the open-loop load started. A probe (RSS of every stack process, Tulip's gauges) is
taken at 0 and every interval; interval k holds the requests that finished in (probe k-1, probe k].

Verdict (issue 15), each check True, False, or None where the run is too short to judge (under
MIN_JUDGED_S of load) or a reading is missing:
- errors: no request of the soak answered other than 200 (by status in `errors_by_status`);
- rss: every process's RSS grows less than RSS_GROWTH from the probe at the end of the first minute to
  the last probe;
- pinned: ROSE's pinned bytes allocated grow at most one batch's worth (`one_batch_bytes`) from the end
  of the first minute to the last probe, and the peak in use of the last minute is at most one batch's
  worth above the peak of the second minute (in use swings with the batches in flight; a leak raises it);
- p99: for single queries and for document batches apart, the p99 of the last minute is at most
  P99_FACTOR x the p99 of the second minute (a kind with fewer than MIN_WINDOW_REQUESTS in a minute: None).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from benchmarks.stack.soak_load import BATCH, NO_ANSWER, QUERY, Finished

MINUTE_S, MIN_JUDGED_S = 60.0, 120.0
RSS_GROWTH, P99_FACTOR, MIN_WINDOW_REQUESTS = 0.05, 1.5, 20
KINDS = {QUERY: "query", BATCH: "batch"}


def status_name(status: int) -> str:
    return {NO_ANSWER: "no_answer", 0: "bad_body"}.get(status, str(status))


def _percentiles(latencies_s: Sequence[float]) -> tuple[float | None, float | None]:
    if not len(latencies_s):
        return None, None
    p50, p99 = np.percentile(np.asarray(latencies_s) * 1e3, [50, 99])
    return round(float(p50), 3), round(float(p99), 3)


def errors_by_status(finished: Sequence[Finished]) -> dict[str, int]:
    out: dict[str, int] = {}
    for f in finished:
        if f[4] != 200:
            out[status_name(f[4])] = out.get(status_name(f[4]), 0) + 1
    return out


def intervals(finished: Sequence[Finished], probes: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One record per probe after the first: its requests' percentiles, rate, errors, client lag, and the
    probe's RSS and gauges. `finished` times are already relative to the load's start."""
    out = []
    for before, probe in zip(probes, probes[1:]):
        lo, hi = before["t_s"], probe["t_s"]
        inside = [f for f in finished if lo < f[0] <= hi]
        ok = [f for f in inside if f[4] == 200]
        record: dict[str, Any] = {"t_s": hi, "requests": len(inside), "rps": round(len(inside) / max(hi - lo, 1e-9), 2),
                                  "errors": len(inside) - len(ok), "errors_by_status": errors_by_status(inside)}
        record["p50_ms"], record["p99_ms"] = _percentiles([f[1] for f in ok])
        for kind, name in KINDS.items():
            record[f"{name}_p50_ms"], record[f"{name}_p99_ms"] = _percentiles([f[1] for f in ok if f[3] == kind])
        lags = [f[2] for f in inside]
        record["max_lag_ms"] = round(max(lags) * 1e3, 3) if lags else None
        record["rss_kb"], record["gauges"] = probe["rss_kb"], probe["gauges"]
        out.append(record)
    return out


def _first_at(probes: Sequence[dict[str, Any]], t_s: float) -> dict[str, Any] | None:
    return next((p for p in probes if p["t_s"] >= t_s), None)


def _window_p99(finished: Sequence[Finished], kind: int, lo: float, hi: float) -> tuple[float | None, int]:
    latencies = [f[1] for f in finished if f[3] == kind and f[4] == 200 and lo <= f[0] < hi]
    if len(latencies) < MIN_WINDOW_REQUESTS:
        return None, len(latencies)
    return _percentiles(latencies)[1], len(latencies)


def verdict(finished: Sequence[Finished], probes: Sequence[dict[str, Any]], one_batch_bytes: int) -> dict[str, Any]:
    """The four checks with their numbers, and `passed` (True when all hold, False when one fails, else None)."""
    errors = errors_by_status(finished)
    out: dict[str, Any] = {"errors": {"ok": not errors, "count": sum(errors.values()), "by_status": errors}}
    end = probes[-1]["t_s"] if probes else 0.0
    judged = end >= MIN_JUDGED_S
    reason = None if judged else f"needs at least {MIN_JUDGED_S:g} s of load, ran {end:g} s"
    first, last = _first_at(probes, MINUTE_S), probes[-1] if probes else None

    rss: dict[str, Any] = {"ok": None, "limit": f"< {RSS_GROWTH:.0%} growth", "growth": {}}
    if judged and first and last:
        for label, start_kb in first["rss_kb"].items():
            end_kb = last["rss_kb"].get(label)
            rss["growth"][label] = None if end_kb is None or not start_kb else round(end_kb / start_kb - 1, 4)
        rss["ok"] = bool(rss["growth"]) and all(g is not None and g < RSS_GROWTH for g in rss["growth"].values())
        rss["from_t_s"], rss["to_t_s"] = first["t_s"], last["t_s"]
    out["rss"] = rss

    pinned: dict[str, Any] = {"ok": None, "one_batch_bytes": one_batch_bytes}
    if judged and first and last and "pinned_allocated" in first["gauges"] and "pinned_allocated" in last["gauges"]:
        pinned["allocated_growth_bytes"] = last["gauges"]["pinned_allocated"] - first["gauges"]["pinned_allocated"]
        second = [p["gauges"].get("pinned_in_use", 0.0) for p in probes if MINUTE_S <= p["t_s"] < 2 * MINUTE_S]
        final = [p["gauges"].get("pinned_in_use", 0.0) for p in probes if p["t_s"] >= end - MINUTE_S]
        pinned["in_use_peak_growth_bytes"] = max(final) - max(second or final)
        pinned["ok"] = (pinned["allocated_growth_bytes"] <= one_batch_bytes
                        and pinned["in_use_peak_growth_bytes"] <= one_batch_bytes)
    out["pinned"] = pinned

    p99: dict[str, Any] = {"ok": None, "limit": f"last minute <= {P99_FACTOR:g} x second minute"}
    if judged:
        oks = []
        for kind, name in KINDS.items():
            second_p99, n2 = _window_p99(finished, kind, MINUTE_S, 2 * MINUTE_S)
            last_p99, n_last = _window_p99(finished, kind, end - MINUTE_S, float("inf"))
            ratio = round(last_p99 / second_p99, 3) if second_p99 and last_p99 is not None else None
            p99[name] = {"second_minute_ms": second_p99, "last_minute_ms": last_p99, "ratio": ratio,
                         "requests": [n2, n_last]}
            oks.append(None if ratio is None else ratio <= P99_FACTOR)
        p99["ok"] = False if False in oks else None if None in oks else True
    out["p99"] = p99
    checks = [out[name]["ok"] for name in ("errors", "rss", "pinned", "p99")]
    out["passed"] = False if False in checks else None if None in checks else True
    if reason:
        out["not_judged"] = reason
    return out


def write_soak(out_dir: Path, stem: str, result: dict[str, Any], plot: bool = True) -> list[Path]:
    """OUT/<stem>.json (always) and, with `plot`, OUT/<stem>.png when there are intervals and matplotlib."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{stem}.json"
    path.write_text(json.dumps(result, indent=2, default=str) + "\n")
    paths = [path]
    if plot and result.get("intervals"):
        try:
            paths.append(write_soak_plot(out_dir / f"{stem}.png", result))
        except ImportError:
            pass
    return paths


def write_soak_plot(path: Path, result: dict[str, Any]) -> Path:
    """Three panels over time: p99 per kind, RSS per process (MiB), pinned bytes (MiB) and queue tokens."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["intervals"]
    t = [r["t_s"] for r in rows]
    fig, (lat, mem, pin) = plt.subplots(3, 1, figsize=(9, 9), sharex=True)
    for name in KINDS.values():
        lat.plot(t, [r[f"{name}_p99_ms"] for r in rows], marker=".", label=f"{name} p99")
    lat.set_ylabel("p99 (ms)")
    labels = sorted({label for r in rows for label in r["rss_kb"]})
    for label in labels:
        mem.plot(t, [r["rss_kb"].get(label, np.nan) / 1024 for r in rows], label=label)
    mem.set_ylabel("RSS (MiB)")
    for key in ("pinned_in_use", "pinned_allocated"):
        pin.plot(t, [r["gauges"].get(key, np.nan) / 2**20 for r in rows], label=key)
    pin.set_ylabel("pinned (MiB)")
    queue = pin.twinx()
    queue.plot(t, [r["gauges"].get("queue_tokens", np.nan) for r in rows], color="grey", alpha=0.5, label="queue tokens")
    queue.set_ylabel("queue tokens")
    pin.set_xlabel("seconds of load")
    for ax in (lat, mem, pin):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    env = result.get("env", {})
    fig.suptitle(f"soak {env.get('model')} at {result.get('rate_per_s', 0):.0f} req/s "
                 f"({env.get('gpu')}, {env.get('commit')})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def table(result: dict[str, Any]) -> str:
    """The short table printed last: one line per minute, then the verdict."""
    rows = result.get("intervals") or []
    lines = [f"{'t_s':>6} {'req/s':>8} {'query p99':>10} {'batch p99':>10} {'err':>5} {'max RSS MiB':>12} "
             f"{'pinned MiB':>11} {'queue tok':>10}"]
    per_minute = max(1, round(MINUTE_S / (result.get("interval_s") or MINUTE_S)))
    for i, r in enumerate(rows):
        if len(rows) <= 12 or (i + 1) % per_minute == 0 or r is rows[-1]:
            rss = max(r["rss_kb"].values(), default=0) / 1024
            g = r["gauges"]
            fmt = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
            lines.append(f"{r['t_s']:6.0f} {r['rps']:8.1f} {fmt(r['query_p99_ms']):>10} {fmt(r['batch_p99_ms']):>10} "
                         f"{r['errors']:5d} {rss:12.0f} {g.get('pinned_in_use', 0) / 2**20:11.1f} "
                         f"{g.get('queue_tokens', 0):10.0f}")
    v = result.get("verdict") or {}
    lines.append("verdict: " + "  ".join(f"{k} {v[k]['ok']}" for k in ("errors", "rss", "pinned", "p99") if k in v)
                 + f"  -> passed {v.get('passed')}" + (f" ({v['not_judged']})" if v.get("not_judged") else ""))
    return "\n".join(lines)
