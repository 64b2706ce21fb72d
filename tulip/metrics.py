"""Prometheus metrics for one Tulip replica, on their own registry and HTTP port.

Hot-path metrics (histograms, counters) are observed by the worker and the handlers; gauges that mirror
state (queue depth, batches in flight, readiness) and everything ROSE reports in `engine.stats()` are read
at scrape time by a custom collector, so they cost nothing between scrapes.

Names (all exported by `TulipMetrics`):
  tulip_queue_sequences, tulip_queue_tokens          gauges: waiting work
  tulip_batches_in_flight, tulip_ready               gauges
  tulip_device_busy_seconds_total                    counter: seconds with a batch on the device (its duty cycle)
  tulip_thread_cpu_seconds_total{thread}             counter: CPU seconds of each Python thread (the event loop is
                                                     MainThread): which one a saturated replica is short of
  tulip_queue_wait_seconds                           histogram: enqueue -> packed into a batch, per sequence
  tulip_batch_sequences, tulip_batch_tokens          histograms: per launched batch (real tokens)
  tulip_batch_padded_tokens                          histogram: when the engine reports its padded bucket
  tulip_engine_launch_seconds                        histogram: time inside engine.step() (host side)
  tulip_batch_seconds                                histogram: launch -> rows on the host (step latency)
  tulip_requests_total{status}                       counter: Embed calls by gRPC status name
  tulip_request_seconds                              histogram: Embed handler latency
  tulip_tokens_total                                 counter: tokens embedded for answered requests
  tulip_skipped_sequences_total                      counter: cancelled/expired sequences that never ran
  tulip_launch_hold_seconds                          histogram: a free slot held to pack the next batch late
  tulip_idle_captures_total                          counter: graphs captured while the device was idle
  tulip_lane_queue_tokens{lane}                      gauge: tokens waiting per priority lane
  tulip_lane_wait_seconds{lane}                      histogram: queue wait per sequence, per lane
  tulip_lane_batches_total{lane}                     counter: batches that carried sequences of the lane
  tulip_lane_batch_tokens_total{lane}                counter: tokens of the lane in launched batches (its share)
  tulip_express_batches_total                        counter: interactive batches run beside bulk work: on the express
                                                     lane, or between bulk's layers (tulip/express.py)
  tulip_inline_launches_total                        counter: batches the event loop launched itself (tulip/worker.py)
  tulip_gc_pause_seconds{generation}                 histogram: the garbage collector's pauses (rose/gc_pauses.py)
  rose_pinned_bytes_in_use, rose_pinned_bytes_cap, rose_graphs_captured, rose_graph_capture_seconds,
  rose_step_seconds_last, rose_runs_total{bucket,mode}, and rose_<key> for any other numeric stat
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from tulip.scheduler import LANES

log = logging.getLogger("tulip.metrics")

_LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                    2.5, 5.0, 10.0, 30.0)
_SEQ_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
_TOKEN_BUCKETS = (16, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)


class TulipMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.queue_wait = Histogram("tulip_queue_wait_seconds", "Time a sequence waited in the FCFS queue",
                                    buckets=_LATENCY_BUCKETS, registry=r)
        self.batch_sequences = Histogram("tulip_batch_sequences", "Sequences per launched batch",
                                         buckets=_SEQ_BUCKETS, registry=r)
        self.batch_tokens = Histogram("tulip_batch_tokens", "Real tokens per launched batch",
                                      buckets=_TOKEN_BUCKETS, registry=r)
        self.batch_padded_tokens = Histogram("tulip_batch_padded_tokens",
                                             "Tokens per batch after padding to the engine's bucket",
                                             buckets=_TOKEN_BUCKETS, registry=r)
        self.engine_launch = Histogram("tulip_engine_launch_seconds", "Host time inside engine.step()",
                                       buckets=_LATENCY_BUCKETS, registry=r)
        self.batch_latency = Histogram("tulip_batch_seconds", "Batch launch until its rows are on the host",
                                       buckets=_LATENCY_BUCKETS, registry=r)
        self.requests = Counter("tulip_requests", "Embed calls by final gRPC status", ["status"], registry=r)
        self.request_latency = Histogram("tulip_request_seconds", "Embed call latency inside Tulip",
                                         buckets=_LATENCY_BUCKETS, registry=r)
        self.tokens = Counter("tulip_tokens", "Tokens embedded for answered requests", registry=r)
        self.skipped = Counter("tulip_skipped_sequences",
                               "Sequences of cancelled or expired requests removed from the queue unrun",
                               registry=r)
        self.launch_hold = Histogram("tulip_launch_hold_seconds",
                                     "Time the launcher held a free slot to pack the next batch late (pacing)",
                                     buckets=_LATENCY_BUCKETS, registry=r)
        self.idle_captures = Counter("tulip_idle_captures", "CUDA graphs captured while the device was idle",
                                     registry=r)
        self.lane_wait = Histogram("tulip_lane_wait_seconds", "Time a sequence waited in the queue, per lane",
                                   ["lane"], buckets=_LATENCY_BUCKETS, registry=r)
        self.lane_batches = Counter("tulip_lane_batches", "Batches that carried sequences of the lane", ["lane"],
                                    registry=r)
        self.lane_batch_tokens = Counter("tulip_lane_batch_tokens", "Tokens of the lane in launched batches",
                                         ["lane"], registry=r)
        self.express_batches = Counter("tulip_express_batches", "Interactive batches run beside bulk work (express lane, or between bulk's layers)",
                                       registry=r)
        self.inline_launches = Counter("tulip_inline_launches", "Batches launched on the event loop itself, the "
                                       "worker idle (no launcher hand-off)", registry=r)
        self.framed_connections = Gauge("tulip_framed_connections", "Open connections on the framed EmbedStream "
                                        "port", registry=r)
        self.framed_refused = Counter("tulip_framed_refused_connections", "Framed connections refused: over "
                                      "framed_max_connections", registry=r)
        self.gc_pause = Histogram("tulip_gc_pause_seconds", "Pauses of the cyclic garbage collector (every thread "
                                  "waits), by generation", ["generation"], buckets=_LATENCY_BUCKETS, registry=r)
        self._gc_pause = [self.gc_pause.labels(generation=str(g)) for g in range(3)]
        self._lane_wait = [self.lane_wait.labels(lane=name) for name in LANES]
        self._lane_batches = [self.lane_batches.labels(lane=name) for name in LANES]
        self._lane_batch_tokens = [self.lane_batch_tokens.labels(lane=name) for name in LANES]
        self._http = None

    # -- hot path -------------------------------------------------------------------------------

    def observe_gc_pause(self, generation: int, seconds: float) -> None:
        self._gc_pause[generation].observe(seconds)

    def observe_launch(self, packed, batch, launch_seconds: float, lazy: Any, express: bool = False,
                       inline: bool = False) -> None:
        if express:
            self.express_batches.inc()
        if inline:
            self.inline_launches.inc()
        taken = packed.taken_at
        for seq in packed.sequences:
            wait = max(0.0, taken - seq.enqueued_at)
            self.queue_wait.observe(wait)
            self._lane_wait[seq.ticket.lane].observe(wait)
        for lane, tokens in enumerate(getattr(packed, "lane_tokens", ())):
            if tokens:
                self._lane_batches[lane].inc()
                self._lane_batch_tokens[lane].inc(tokens)
        self.batch_sequences.observe(batch.num_seqs)
        self.batch_tokens.observe(batch.num_tokens)
        padded = getattr(lazy, "padded_tokens", None)
        if isinstance(padded, int):
            self.batch_padded_tokens.observe(padded)
        self.engine_launch.observe(launch_seconds)

    def observe_skipped(self, count: int) -> None:
        if count:
            self.skipped.inc(count)

    def observe_hold(self, seconds: float) -> None:
        self.launch_hold.observe(seconds)

    def observe_idle_capture(self) -> None:
        self.idle_captures.inc()

    def observe_delivery(self, seconds: float) -> None:
        self.batch_latency.observe(seconds)

    def observe_request(self, status: str, seconds: float, tokens: int = 0) -> None:
        self.requests.labels(status=status).inc()
        self.request_latency.observe(seconds)
        if tokens:
            self.tokens.inc(tokens)

    # -- scrape-time state ----------------------------------------------------------------------

    def bind_state(self, *, queue_depth: Callable[[], tuple[int, int]], inflight: Callable[[], int],
                   ready: Callable[[], bool], engine_stats: Callable[[], dict] | None,
                   lane_depth: Callable[[int], int] | None = None,
                   device_busy: Callable[[], float] | None = None) -> None:
        self.registry.register(_StateCollector(queue_depth, inflight, ready, engine_stats, lane_depth, device_busy))

    def serve(self, host: str, port: int) -> None:
        """Start the /metrics HTTP server (a daemon thread); port 0 leaves metrics off."""
        if port:
            self._http = start_http_server(port, addr=host, registry=self.registry)
            log.info("metrics on http://%s:%d/metrics", host, port)

    def shutdown(self) -> None:
        if isinstance(self._http, tuple):
            self._http[0].shutdown()


class _StateCollector:
    def __init__(self, queue_depth, inflight, ready, engine_stats, lane_depth=None, device_busy=None) -> None:
        self._queue_depth, self._inflight, self._ready, self._engine_stats = queue_depth, inflight, ready, engine_stats
        self._lane_depth, self._device_busy = lane_depth, device_busy

    def describe(self):
        return []  # state is dynamic; skip registry-time collision checks

    def collect(self):
        seqs, tokens = self._queue_depth()
        yield GaugeMetricFamily("tulip_queue_sequences", "Sequences waiting in the queue", value=seqs)
        yield GaugeMetricFamily("tulip_queue_tokens", "Tokens waiting in the queue", value=tokens)
        lanes = GaugeMetricFamily("tulip_lane_queue_tokens", "Tokens waiting per priority lane", labels=["lane"])
        for lane, name in enumerate(LANES):
            lanes.add_metric([name], float(self._lane_depth(lane) if self._lane_depth else 0))
        yield lanes
        yield GaugeMetricFamily("tulip_batches_in_flight", "Batches launched, not yet delivered",
                                value=self._inflight())
        yield GaugeMetricFamily("tulip_ready", "1 once the model is loaded, warmed up and verified",
                                value=1.0 if self._ready() else 0.0)
        if self._device_busy is not None:
            yield CounterMetricFamily("tulip_device_busy_seconds", "Seconds with a batch on the device (its duty "
                                      "cycle as the batcher sees it: launch or the previous delivery to delivery; "
                                      "the express lane's batches add theirs, so it may pass 1 a second)",
                                      value=self._device_busy())
        yield thread_cpu_family()
        if self._engine_stats is not None:
            yield from engine_stat_families(self._engine_stats)


def _thread_label(name: str) -> str:
    """A thread's label with Python's own numbering taken out ("Thread-10 (process_request_thread)" -> "Thread
    (process_request_thread)", "ThreadPoolExecutor-0_3" -> "ThreadPoolExecutor"): threads made one per task (the
    metrics server's one per scrape) share one series instead of adding one each, for ever."""
    return _NUMBERED.sub(r"\1", name)


_NUMBERED = re.compile(r"^(Thread|ThreadPoolExecutor|Dummy)-\d+(?:_\d+)?")


class _ThreadCpu:
    """CPU seconds (user + system) per Python thread label (_thread_label), from /proc (Linux; nothing
    elsewhere). Threads of one label add up, and a thread that ended keeps what it used, so each label's count
    only grows (a counter). The thread that reads (a scrape's) is left out."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # scrapes may overlap
        self._live: dict[int, tuple[str, float]] = {}  # native id -> (name, seconds at the last read)
        self._ended: dict[str, float] = {}

    def read(self) -> dict[str, float]:
        with self._lock:
            now: dict[int, tuple[str, float]] = {}
            reader = threading.current_thread()
            for thread in threading.enumerate():
                if thread is reader:  # not counted: a scrape's own thread (one a scrape) is no thread role; one an
                    if thread.native_id in self._live:  # overlapping scrape saw stays as it was seen, not ended
                        now[thread.native_id] = self._live[thread.native_id]  # (its seconds counted once)
                    continue
                try:
                    with open(f"/proc/self/task/{thread.native_id}/stat", "rb") as f:
                        fields = f.read().rsplit(b")", 1)[1].split()
                except (OSError, IndexError, TypeError):
                    continue
                now[thread.native_id] = (_thread_label(thread.name),
                                         (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS)
            for native_id, (name, seconds) in self._live.items():
                if native_id not in now:  # ended since the last read: what it used stays counted
                    self._ended[name] = self._ended.get(name, 0.0) + seconds
            self._live = now
            totals = dict(self._ended)
            for name, seconds in now.values():
                totals[name] = totals.get(name, 0.0) + seconds
            return totals


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_THREAD_CPU = _ThreadCpu()


def thread_cpu_family() -> CounterMetricFamily:
    """tulip_thread_cpu_seconds_total{thread}: each Python thread's CPU seconds (the event loop is MainThread)."""
    family = CounterMetricFamily("tulip_thread_cpu_seconds", "CPU seconds of each Python thread (the event loop "
                                 "runs on MainThread)", labels=["thread"])
    for name, value in sorted(_THREAD_CPU.read().items()):
        family.add_metric([name], value)
    return family


_KNOWN = {
    "pinned_bytes_in_use": "Page-locked host bytes held by LazyTensors",
    "pinned_bytes_cap": "Cap on page-locked host bytes",
    "graphs_captured": "CUDA graphs captured",
    "graph_capture_seconds": "Seconds spent capturing CUDA graphs",
    "captures_failed": "CUDA graph captures that failed (their layouts run eagerly)",
    "graphs_refused": "CUDA graphs refused: first replay disagreed with eager (their layouts run eagerly)",
    "step_seconds_last": "Duration of the engine's last step",
    "graph_substitutions": "Batches whose own layout had no graph yet, replayed at a larger captured one",
    "persistent_decoder_tokens": "Largest batch (tokens) the persistent decoder runs; 0: every batch takes the layers",
}


def engine_stat_families(stats_fn: Callable[[], dict]):
    """ROSE's engine.stats() as metric families; missing keys are skipped, a failing call logs once."""
    try:
        stats = stats_fn() or {}
    except Exception:
        log.debug("engine.stats() failed", exc_info=True)
        return
    for key, value in stats.items():
        if key == "runs" and isinstance(value, dict):
            runs = CounterMetricFamily("rose_runs", "Engine forward passes by bucket and mode",
                                       labels=["bucket", "mode"])
            for label, count in value.items():
                bucket, mode = (label if isinstance(label, tuple) and len(label) == 2 else (label, ""))
                runs.add_metric([str(bucket), str(mode)], float(count))
            yield runs
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            name = "rose_" + re.sub(r"[^a-zA-Z0-9_]", "_", str(key))
            yield GaugeMetricFamily(name, _KNOWN.get(key, f"ROSE engine stat {key}"), value=float(value))
