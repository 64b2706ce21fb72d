"""What the server did during one suite step, read from its Prometheus /metrics (ours: Tulip's).

`--server-metrics URL[,URL...]` (one per Tulip replica): every record then carries `server`, the change
over its measurement of the engine's forward passes by mode (`eager` = a graph key's first batch,
`capture`, `replay`, and the eager runs above the largest bucket), seconds spent capturing, and the
batches and their mean duration, and each priority lane's tokens in launched batches (`lane_tokens_bulk`,
`lane_tokens_interactive`), Tulip's full garbage collections (`gc_full`, `gc_full_seconds`), the seconds with a
batch on the device and its share of the step's wall time (`device_busy_seconds`, `device_busy_share`), the
CPU seconds of Tulip's event loop, launcher and completer threads and their shares (`cpu_loop`, `cpu_launcher`,
`cpu_completer`; the completer's includes its spin on the CUDA event), the host time inside engine.step()
(`launch_seconds`) and the tokens the device ran, padding included (`padded_tokens`). A latency
tail that lines up with eager runs and captures is lazy capture; one that lines up with full collections is
the collector; one that does neither is the gateway or the batcher. Peers' metrics have other names: their deltas stay empty.
"""

from __future__ import annotations

import time
import urllib.request
from collections import defaultdict

from prometheus_client.parser import text_string_to_metric_families

_SUMMED = {"rose_graph_capture_seconds": "capture_seconds", "tulip_batch_seconds_count": "batches",
           "tulip_batch_seconds_sum": "batch_seconds", "tulip_queue_wait_seconds_sum": "queue_wait_seconds",
           "tulip_queue_wait_seconds_count": "queued_sequences", "rose_graph_substitutions": "substitutions",
           "tulip_express_batches_total": "express_batches", "tulip_device_busy_seconds_total": "device_busy_seconds",
           "tulip_engine_launch_seconds_sum": "launch_seconds", "tulip_batch_padded_tokens_sum": "padded_tokens",
           "tulip_batch_tokens_sum": "batch_tokens"}
_THREADS = {"MainThread": "cpu_loop", "tulip-launcher": "cpu_launcher", "tulip-completer": "cpu_completer"}
_GC_FULL = {"tulip_gc_pause_seconds_count": "gc_full", "tulip_gc_pause_seconds_sum": "gc_full_seconds"}
_SHARES = {"device_busy_seconds": "device_busy_share", "cpu_loop": "cpu_loop_share",
           "cpu_launcher": "cpu_launcher_share", "cpu_completer": "cpu_completer_share"}  # delta(): / wall


def scrape(urls: list[str], timeout_s: float = 5.0) -> dict[str, float]:
    """Counters summed over the replicas: runs_<mode>, lane_tokens_<lane>, and the names in _SUMMED."""
    totals: dict[str, float] = defaultdict(float)
    totals["wall_seconds"] = time.monotonic()
    totals["replicas"] = float(len(urls))
    for url in urls:
        with urllib.request.urlopen(url, timeout=timeout_s) as answer:
            text = answer.read().decode()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "rose_runs_total":
                    totals[f"runs_{sample.labels.get('mode') or 'other'}"] += sample.value
                elif sample.name == "tulip_lane_batch_tokens_total":  # each priority lane's batched tokens
                    totals[f"lane_tokens_{sample.labels.get('lane') or 'other'}"] += sample.value
                elif sample.name == "tulip_thread_cpu_seconds_total" and sample.labels.get("thread") in _THREADS:
                    totals[_THREADS[sample.labels["thread"]]] += sample.value
                elif sample.name in _GC_FULL and sample.labels.get("generation") == "2":
                    totals[_GC_FULL[sample.name]] += sample.value
                elif sample.name in _SUMMED:
                    totals[_SUMMED[sample.name]] += sample.value
    return dict(totals)


def delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """after - before per counter, with the mean batch duration in ms when batches ran."""
    out = {key: round(after.get(key, 0.0) - before.get(key, 0.0), 6) for key in sorted(set(before) | set(after))}
    if out.get("batches"):
        out["mean_batch_ms"] = round(out.get("batch_seconds", 0.0) / out["batches"] * 1e3, 3)
    replicas = max(1, round(after.get("replicas", 1.0)))
    out.pop("replicas", None)
    if "wall_seconds" not in before:  # no earlier reading: no interval to share out
        out.pop("wall_seconds", None)
    wall = out.get("wall_seconds", 0.0)
    if wall > 0:  # shares of one replica's wall time (summed over the replicas: divided by their count)
        for key, share in _SHARES.items():
            if key in out:
                out[share] = round(out[key] / wall / replicas, 4)
    return out



def describe(change: dict[str, float]) -> str:
    """One progress-line fragment: 'eager 3 capture 2 replay 950 batches 955 (2.1 ms)'."""
    parts = [f"{mode} {int(change[f'runs_{mode}'])}" for mode in ("eager", "capture", "replay")
             if change.get(f"runs_{mode}")]
    if change.get("substitutions"):
        parts.append(f"substituted {int(change['substitutions'])}")
    if change.get("gc_full"):
        parts.append(f"gc2 {int(change['gc_full'])} ({change.get('gc_full_seconds', 0) * 1e3:.0f} ms)")
    if change.get("batches"):
        per = f", {change['queued_sequences'] / change['batches']:.1f} seqs" if change.get("queued_sequences") else ""
        parts.append(f"batches {int(change['batches'])} ({change.get('mean_batch_ms', 0):.1f} ms{per})")
    if "device_busy_share" in change:
        parts.append(f"busy {change['device_busy_share']:.0%}")
    for key, label in (("cpu_loop_share", "loop"), ("cpu_launcher_share", "launcher")):
        if key in change:
            parts.append(f"{label} {change[key]:.0%}")
    return " ".join(parts)
