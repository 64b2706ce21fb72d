"""--server-metrics: each record carries what the engine did during its measurement, read from
Tulip's own exposition (tulip.metrics.engine_stat_families), so a renamed metric fails here."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from stack_bench_fake import MODEL, FakeStack

from benchmarks.stack.__main__ import main
from benchmarks.stack.server_counters import delta, describe, scrape
from tulip.metrics import engine_stat_families


class _EngineCollector:
    def __init__(self, stats) -> None:
        self.stats = stats

    def collect(self):
        yield from engine_stat_families(self.stats)


@contextmanager
def _serving(registry) -> Iterator[str]:
    """`registry`'s exposition at a loopback /metrics URL while the block runs."""
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = generate_latest(registry)
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/metrics"
    finally:
        server.shutdown()


@pytest.fixture()
def metrics_url(fake_stack: FakeStack) -> Iterator[str]:
    """A Tulip-shaped /metrics whose replay count is the fake stack's embedding calls (one batch each)."""
    def stats() -> dict:
        calls = fake_stack.hits["/v1/embeddings"]
        return {"runs": {("t128", "eager"): 1, ("t128", "capture"): 1, ("t128", "replay"): calls},
                "graphs_captured": 1, "graph_capture_seconds": 0.04}

    registry = CollectorRegistry()
    registry.register(_EngineCollector(stats))

    with _serving(registry) as url:
        yield url


def test_scrape_reads_tulips_names(metrics_url: str, fake_stack: FakeStack) -> None:
    now = scrape([metrics_url])
    assert now["runs_eager"] == 1 and now["runs_capture"] == 1
    assert now["runs_replay"] == fake_stack.hits["/v1/embeddings"]
    assert now["capture_seconds"] == pytest.approx(0.04)
    twice = scrape([metrics_url, metrics_url])  # replicas add up
    assert twice["runs_eager"] == 2


def test_delta_and_description() -> None:
    before = {"runs_eager": 1, "runs_replay": 10, "batches": 10, "batch_seconds": 0.02}
    after = {"runs_eager": 4, "runs_capture": 2, "runs_replay": 110, "batches": 116, "batch_seconds": 0.232}
    change = delta(before, after)
    assert change["runs_eager"] == 3 and change["runs_capture"] == 2 and change["runs_replay"] == 100
    assert change["mean_batch_ms"] == pytest.approx(2.0)
    assert describe(change) == "eager 3 capture 2 replay 100 batches 106 (2.0 ms)"


def test_records_carry_the_servers_counters(fake_stack: FakeStack, metrics_url: str, tmp_path: Path) -> None:
    argv = ["--url", fake_stack.url, "--model", MODEL, "--out", str(tmp_path), "--suite", "embed-latency",
            "--embed-tokens", "16,32", "--duration-s", "5", "--requests", "4", "--warmup-requests", "2",
            "--distinct-inputs", "2", "--skip-verify", "true", "--server-metrics", metrics_url]
    assert main(argv) == 0
    records = json.loads((tmp_path / f"stack_{MODEL}.json").read_text())["records"]
    assert len(records) == 2
    for record in records:  # warm-up requests happen before the first scrape: only the timed ones count
        assert record["server"]["runs_replay"] == record["requests"] == 4
        assert record["server"]["runs_eager"] == 0


def test_client_process_steps_count_from_after_the_warm_up(fake_stack: FakeStack, metrics_url: str,
                                                          tmp_path: Path) -> None:
    argv = ["--url", fake_stack.url, "--model", MODEL, "--out", str(tmp_path), "--suite", "concurrency",
            "--concurrency-levels", "2", "--duration-s", "5", "--requests", "3", "--warmup-requests", "2",
            "--distinct-inputs", "2", "--skip-verify", "true", "--server-metrics", metrics_url]
    assert main(argv) == 0
    record = json.loads((tmp_path / f"stack_{MODEL}.json").read_text())["records"][0]
    assert record["requests"] == 6
    assert record["server"]["runs_replay"] == 6, "the 4 warm-up requests are not counted"


def test_unreachable_metrics_leave_records_without(fake_stack: FakeStack, tmp_path: Path) -> None:
    argv = ["--url", fake_stack.url, "--model", MODEL, "--out", str(tmp_path), "--suite", "embed-latency",
            "--embed-tokens", "16", "--requests", "2", "--warmup-requests", "1", "--distinct-inputs", "1",
            "--skip-verify", "true", "--server-metrics", "http://127.0.0.1:9/metrics"]
    assert main(argv) == 0
    record = json.loads((tmp_path / f"stack_{MODEL}.json").read_text())["records"][0]
    assert "server" not in record


def test_full_garbage_collections_are_read_from_tulips_own_histogram() -> None:
    from tulip.metrics import TulipMetrics

    metrics = TulipMetrics()
    metrics.observe_gc_pause(0, 0.0001)
    metrics.observe_gc_pause(2, 0.120)
    metrics.observe_gc_pause(2, 0.060)

    with _serving(metrics.registry) as url:
        now = scrape([url])
    assert now["gc_full"] == 2 and now["gc_full_seconds"] == pytest.approx(0.18)  # generation 0 left out
    assert describe(delta({}, now)) == "gc2 2 (180 ms)"


def test_device_duty_cycle_and_thread_cpu_are_read_from_tulips_names() -> None:
    """tulip_device_busy_seconds_total and the loop's tulip_thread_cpu_seconds_total become shares of the
    step's wall time: whether the device starved, and whether the event loop was the one short of CPU."""
    from tulip.metrics import TulipMetrics

    busy = [0.0]
    metrics = TulipMetrics()
    metrics.bind_state(queue_depth=lambda: (0, 0), inflight=lambda: 0, ready=lambda: True, engine_stats=None,
                       device_busy=lambda: busy[0])
    with _serving(metrics.registry) as url:
        before = scrape([url])
        busy[0] = 0.05
        spin_until = time.process_time() + 0.05
        while time.process_time() < spin_until:  # the main thread burns 50 ms of CPU
            pass
        time.sleep(0.05)
        after = scrape([url])
    change = delta(before, after)
    assert change["device_busy_seconds"] == pytest.approx(0.05)
    assert 0 < change["device_busy_share"] <= 0.05 / 0.1 + 1e-6  # at least 100 ms of wall went by
    assert change["cpu_loop"] >= 0.03  # /proc counts in clock ticks (10 ms)
    assert 0 < change["cpu_loop_share"] <= 1.0
    assert "busy" in describe(change) and "loop" in describe(change)


def test_a_thread_that_ends_keeps_its_cpu_in_the_count_and_no_earlier_reading_means_no_shares() -> None:
    """tulip_thread_cpu_seconds_total only grows: threads of one name add up and an ended thread's seconds
    stay. delta() without an earlier reading has no interval, so it gives no shares."""
    from tulip.metrics import _ThreadCpu

    cpu = _ThreadCpu()
    go = threading.Event()
    burned = threading.Semaphore(0)

    def burn() -> None:
        end = time.thread_time() + 0.05
        while time.thread_time() < end:
            pass
        burned.release()
        go.wait(10)

    workers = [threading.Thread(target=burn, name="burner") for _ in range(2)]
    for w in workers:
        w.start()
    for _ in workers:
        assert burned.acquire(timeout=30)
    during = cpu.read()["burner"]
    go.set()
    for w in workers:
        w.join()
    after = cpu.read().get("burner", 0.0)
    assert during >= 0.08  # both threads' ~50 ms, in 10 ms ticks
    assert after >= during, "an ended thread's seconds stay counted"
    change = delta({}, {"wall_seconds": 123.0, "device_busy_seconds": 1.0, "cpu_loop": 2.0})
    assert "wall_seconds" not in change and "device_busy_share" not in change
    assert describe(change) == ""


def test_threads_made_one_per_task_share_one_series_and_the_reader_is_left_out() -> None:
    """prometheus_client's metrics server serves each scrape on a new thread ("Thread-N (process_request_thread)"):
    each scrape added a series to tulip_thread_cpu_seconds_total for good (37 after 30 scrapes). Python's
    numbering is taken out of the label, and the reading thread is not counted."""
    from tulip.metrics import _thread_label, _ThreadCpu

    assert _thread_label("Thread-10 (process_request_thread)") == "Thread (process_request_thread)"
    assert _thread_label("ThreadPoolExecutor-0_3") == "ThreadPoolExecutor"
    assert _thread_label("tulip-launcher") == "tulip-launcher" and _thread_label("MainThread") == "MainThread"
    cpu = _ThreadCpu()
    seen: list[set[str]] = []
    for _ in range(20):  # as a scrape does: read from a fresh, unnamed thread
        reader = threading.Thread(target=lambda: seen.append(set(cpu.read())))
        reader.start()
        reader.join()
    labels = set().union(*seen)
    assert not any(label.startswith("Thread-") for label in labels), labels
    assert len(set(cpu.read())) <= len(threading.enumerate()) + 1, "ended threads' labels stay bounded"


def test_a_scrape_thread_seen_by_an_overlapping_scrape_is_counted_once() -> None:
    """Scrapes overlap (a Prometheus pair, a curl): one scrape's thread, alive and seen by another, then reading
    itself, was taken for ended (its seconds moved to the ended tally) and counted live again by a third: twice."""
    from tulip.metrics import _ThreadCpu

    cpu = _ThreadCpu()
    burned, done = threading.Event(), threading.Event()
    read_mine = threading.Event()

    def scrape() -> None:  # a scrape thread that burns CPU, reads, and stays alive a while
        end = time.thread_time() + 0.3
        while time.thread_time() < end:
            pass
        burned.set()
        read_mine.wait(10)
        cpu.read()
        done.wait(10)

    a = threading.Thread(target=scrape, name="scrape-a")
    a.start()
    assert burned.wait(30)
    first = cpu.read()["scrape-a"]  # another scrape sees a alive
    read_mine.set()
    time.sleep(0.2)  # a reads (leaving itself out)
    third = cpu.read()["scrape-a"]
    done.set()
    a.join()
    last = cpu.read()["scrape-a"]
    assert first >= 0.25 and abs(third - first) < 0.05 and abs(last - first) < 0.05, (first, third, last)

