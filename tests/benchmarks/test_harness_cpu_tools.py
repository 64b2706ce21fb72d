"""benchmarks.thread_cpu (per-thread CPU from /proc) and benchmarks.profile_summary (py-spy's collapsed stacks)."""

from __future__ import annotations

import os
import sys
import threading
import time

import pytest

from benchmarks import profile_summary, thread_cpu

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


@linux
def test_a_busy_thread_shows_its_cpu_per_request() -> None:
    stop = threading.Event()

    def burn() -> None:
        while not stop.is_set():
            sum(range(1000))

    worker = threading.Thread(target=burn)
    worker.start()
    try:
        t0 = time.perf_counter()
        before = thread_cpu.snap([os.getpid()])
        t1 = time.perf_counter()
        time.sleep(0.5)
        t2 = time.perf_counter()
        after = thread_cpu.snap([os.getpid()])
        t3 = time.perf_counter()
    finally:
        stop.set()
        worker.join()
    rows = thread_cpu.diff(before, after, requests=10)
    busy = next(r for r in rows if r["tid"] == worker.native_id)
    # it ran for most of the window between the snapshots (the GIL shared with this thread's snapshots),
    # never longer than it: µs per request over 10 requests
    assert 0.3 * (t2 - t1) * 1e5 < busy["run_us"] <= (t3 - t0) * 1e5 * 1.02 + 200
    assert busy["runqueue_wait_us"] >= 0 and not busy["main"]
    assert any(r["main"] for r in rows)


@linux
def test_a_thread_started_after_the_first_snapshot_counts_whole() -> None:
    before = thread_cpu.snap([os.getpid()])
    done = threading.Event()
    t = threading.Thread(target=lambda: (sum(range(200_000)), done.wait(5)))
    t.start()
    time.sleep(0.05)
    after = thread_cpu.snap([os.getpid()])
    done.set()
    t.join()
    assert any(r["tid"] == t.native_id for r in thread_cpu.diff(before, after))


RAW = """thread (11): MainThread;run (asyncio/runners.py:118);handle (tulip/stream.py:40);admit (tulip/server.py:9) 6
thread (11): MainThread;run (asyncio/runners.py:118) 3
thread (12): tulip-completer;_deliver (tulip/worker.py:300);synchronize (torch/cuda/streams.py:5) 1
thread (11): MainThread;run (asyncio/runners.py:118);uv_run (core.c);epoll_pwait (libc.so.6) 10
thread (12): tulip-completer;wait (rose/lazy.py:2);0x7f00 (libc.so.6) 5
"""


def test_self_and_inclusive_shares_and_the_waits_dropped(tmp_path) -> None:
    path = tmp_path / "spy.txt"
    path.write_text(RAW)
    s = profile_summary.summarize(path, rate=1000, requests=2, top=5, drop_idle=True)
    assert s["samples"] == 10 and s["idle_dropped"] == 15
    own = {r["frame"]: r for r in s["self"]}
    assert own["admit (tulip/server.py)"]["share"] == pytest.approx(0.6)
    assert own["admit (tulip/server.py)"]["us_per_request"] == pytest.approx(3000)  # 6 ms over 2 requests
    inclusive = {r["frame"]: r["share"] for r in s["inclusive"]}
    assert inclusive["run (asyncio/runners.py)"] == pytest.approx(0.9)
    assert s["threads"] == {"MainThread": pytest.approx(0.9), "tulip-completer": pytest.approx(0.1)}
    kept = profile_summary.summarize(path, rate=1000, requests=None, top=5)
    assert kept["samples"] == 25 and kept["cpu_us_per_request"] is None


def test_frames_lose_their_lines_and_site_packages() -> None:
    frame = "Histogram.observe (/usr/lib/python3/site-packages/prometheus_client/metrics.py:412)"
    assert profile_summary.short_frame(frame) == "Histogram.observe (prometheus_client/metrics.py)"
    assert profile_summary.short_frame("launch (/work/repo/tulip/worker.py:20)") == "launch (tulip/worker.py)"
