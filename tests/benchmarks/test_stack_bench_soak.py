"""benchmarks.stack.soak: the verdict's arithmetic, the sampling of /proc and of Tulip's metrics text, and a
few seconds of soak on this CPU against a real `ivy up` stack (the bundled MiniLM)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from stack_bench_fake import REPO

from benchmarks.stack.soak_load import BATCH, NO_ANSWER, QUERY
from benchmarks.stack.soak_probe import parse_gauges, sample_rss, stack_processes
from benchmarks.stack.soak_report import intervals, table, verdict

MIB = 2**20


def probes(seconds: int = 180, rss_end: float = 1.0, allocated_end: float = 0, in_use_end: float = 0) -> list[dict]:
    """A probe every 10 s: RSS flat at 1000 kB (times rss_end at the last), pinned 8 MiB (+ the ends' extra)."""
    out = []
    for t in range(0, seconds + 1, 10):
        last = t == seconds
        out.append({"t_s": float(t), "rss_kb": {"tulip:1": 1000 * (rss_end if last else 1), "ivy-gateway": 500},
                    "gauges": {"pinned_allocated": 8 * MIB + (allocated_end if last else 0),
                               "pinned_in_use": 4 * MIB + (in_use_end if last else 0), "queue_tokens": 10}})
    return out


def finished(seconds: int = 180, slow_end: float = 1.0, status_at_100: int = 200) -> list[tuple]:
    """4 requests a second, queries 10 ms and batches 50 ms (times slow_end in the last minute); the 100th
    answered `status_at_100`."""
    out = []
    for k in range(seconds * 4):
        t = k / 4 + 0.1
        factor = slow_end if t >= seconds - 60 else 1.0
        kind = BATCH if k % 4 == 0 else QUERY
        status = status_at_100 if k == 100 else 200
        out.append((t, (0.05 if kind == BATCH else 0.01) * factor, 0.0, kind, status))
    return out


def test_a_flat_run_passes_every_check() -> None:
    v = verdict(finished(), probes(rss_end=1.04, allocated_end=MIB), one_batch_bytes=MIB)
    assert v["passed"] is True and v["errors"] == {"ok": True, "count": 0, "by_status": {}}
    assert v["rss"]["growth"] == {"tulip:1": 0.04, "ivy-gateway": 0.0} and v["rss"]["from_t_s"] == 60.0
    assert v["pinned"]["allocated_growth_bytes"] == MIB and v["pinned"]["ok"] is True
    assert v["p99"]["query"]["ratio"] == 1.0 and v["p99"]["batch"]["last_minute_ms"] == 50.0


@pytest.mark.parametrize(("check", "run"), [
    ("rss", lambda: verdict(finished(), probes(rss_end=1.05), MIB)),
    ("pinned", lambda: verdict(finished(), probes(allocated_end=MIB + 1), MIB)),
    ("pinned", lambda: verdict(finished(), probes(in_use_end=2 * MIB), MIB)),
    ("p99", lambda: verdict(finished(slow_end=1.6), probes(), MIB)),
    ("errors", lambda: verdict(finished(status_at_100=NO_ANSWER), probes(), MIB)),
])
def test_each_check_fails_on_its_own(check: str, run) -> None:
    v = run()
    assert v[check]["ok"] is False and v["passed"] is False
    assert [name for name in ("errors", "rss", "pinned", "p99") if v[name]["ok"] is False] == [check]


def test_errors_are_counted_by_status_and_a_short_run_is_not_judged() -> None:
    v = verdict(finished(100, status_at_100=429), probes(100), MIB)
    assert v["errors"] == {"ok": False, "count": 1, "by_status": {"429": 1}}
    assert v["rss"]["ok"] is v["pinned"]["ok"] is v["p99"]["ok"] is None and "120 s" in v["not_judged"]
    short = verdict(finished(100), probes(100), MIB)
    assert short["passed"] is None


def test_intervals_bin_requests_by_when_they_finished() -> None:
    rows = intervals(finished(30), probes(30))
    assert [r["t_s"] for r in rows] == [10.0, 20.0, 30.0]
    assert [r["requests"] for r in rows] == [40, 40, 40] and rows[0]["rps"] == 4.0
    assert rows[0]["query_p99_ms"] == 10.0 and rows[0]["batch_p50_ms"] == 50.0 and rows[0]["errors"] == 0
    result = {"intervals": rows, "interval_s": 10.0, "verdict": verdict(finished(30), probes(30), MIB)}
    assert table(result).splitlines()[-1].startswith("verdict: errors True  rss None")


def fake_process(proc: Path, pid: int, ppid: int, argv: list[str], rss_kb: int) -> None:
    folder = proc / str(pid)
    folder.mkdir()
    (folder / "stat").write_text(f"{pid} (python3 (x)) S {ppid} {pid} 0 0\n")  # comm with a space and a ')'
    (folder / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    (folder / "status").write_text(f"Name:\tpython3\nVmPeak:\t 9 kB\nVmRSS:\t {rss_kb} kB\nThreads:\t3\n")


def test_the_stack_tree_is_walked_from_ivy_up_and_rss_read(tmp_path: Path) -> None:
    py = "/usr/bin/python3"
    fake_process(tmp_path, 10, 1, [py, "-m", "ivy", "up", "--port", "8080"], 100)
    fake_process(tmp_path, 11, 10, [py, "-m", "tulip", "serve", "--model", "m", "--port", "50051"], 2000)
    fake_process(tmp_path, 12, 10, [py, "-m", "ivy", "serve"], 300)
    fake_process(tmp_path, 13, 12, [py, "-c", "from multiprocessing.spawn import spawn_main; spawn_main()"], 400)
    fake_process(tmp_path, 14, 12, [py, "-c", "from multiprocessing.resource_tracker import main;main(5)"], 9)
    fake_process(tmp_path, 20, 1, [py, "-m", "tulip", "serve", "--port", "60000"], 7)  # another stack's
    (tmp_path / "self").mkdir()
    assert stack_processes(10, tmp_path) == {10: "ivy-up", 11: "tulip", 12: "ivy-gateway", 13: "ivy-worker"}
    assert sample_rss(10, tmp_path) == {"ivy-up": 100, "tulip:50051": 2000, "ivy-gateway": 300,
                                        "ivy-worker[13]": 400}


METRICS = """# HELP rose_pinned_bytes_in_use Page-locked host bytes held by LazyTensors
# TYPE rose_pinned_bytes_in_use gauge
rose_pinned_bytes_in_use 1.6384e+04
# HELP rose_pinned_bytes_allocated ROSE engine stat pinned_bytes_allocated
# TYPE rose_pinned_bytes_allocated gauge
rose_pinned_bytes_allocated 65536.0
# HELP tulip_queue_tokens Tokens waiting in the queue
# TYPE tulip_queue_tokens gauge
tulip_queue_tokens 96.0
# HELP tulip_lane_queue_tokens Tokens waiting per priority lane
# TYPE tulip_lane_queue_tokens gauge
tulip_lane_queue_tokens{lane="bulk"} 64.0
# HELP tulip_batch_seconds Batch launch until its rows are on the host
# TYPE tulip_batch_seconds histogram
tulip_batch_seconds_bucket{le="+Inf"} 3.0
tulip_batch_seconds_count 3.0
tulip_batch_seconds_sum 0.5
"""


def test_the_gauges_are_read_from_metrics_text() -> None:
    assert parse_gauges(METRICS) == {"pinned_in_use": 16384.0, "pinned_allocated": 65536.0, "queue_tokens": 96.0}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_a_few_seconds_of_soak_on_a_real_stack(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    argv = [sys.executable, "-m", "benchmarks.stack.soak", "--out", str(tmp_path), "--plot", "false",
            "--duration-s", "3", "--interval-s", "1", "--saturation-step-s", "1", "--saturation-max-clients", "2",
            "--load-procs", "1", "--load-threads", "4", "--batch-docs", "3", "--distinct-inputs", "2",
            "--doc-max-tokens", "32", "--startup-timeout-s", "90",
            "--port", str(free_port()), "--tulip-port", str(free_port()), "--metrics-port", str(free_port())]
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    data = json.loads((tmp_path / "soak_all-MiniLM-L6-v2.json").read_text())
    assert data["saturation"]["rps"] > 0 and data["rate_per_s"] == pytest.approx(0.7 * data["saturation"]["rps"], 0.01)
    rows = data["intervals"]
    assert len(rows) == 3 and sum(r["requests"] for r in rows) > 0 and data["verdict"]["errors"]["ok"] is True
    for r in rows:  # every probe saw the whole stack and Tulip's gauges
        assert {"ivy-up", "ivy-gateway", "tulip:" + argv[argv.index("--tulip-port") + 1]} <= set(r["rss_kb"])
        assert min(r["rss_kb"].values()) > 0 and "pinned_allocated" in r["gauges"] and "queue_tokens" in r["gauges"]
    assert data["env"]["commit"] and data["env"]["model"] and data["verdict"]["passed"] is None
    assert done.stdout.strip().splitlines()[-1].startswith("verdict: errors True")
