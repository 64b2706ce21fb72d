"""benchmarks.stack.lanes: the targets' arithmetic, and a short run on this CPU against two real `ivy up`
stacks (the bundled MiniLM), lanes off and on, whose Tulip counters show the A/B is real."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from stack_bench_fake import REPO

from benchmarks.stack.lanes_report import table, targets, write_lanes


def record(config: str, traffic: str, p99: float, tokens_per_s: float) -> dict:
    return {"config": config, "traffic": traffic, "clients": 1, "p50_ms": p99 / 2, "p99_ms": p99, "rps": 1.0,
            "tokens_per_s": tokens_per_s, "errors": 0}


def test_targets_compare_layers_express_and_lanes_with_idle_and_fcfs() -> None:
    idle = {**record("idle", "interactive", 4.0, 100), "server": {"device_busy_seconds": 2.0, "batches": 1000}}
    records = [idle, record("fcfs", "interactive", 40.0, 50),
               record("fcfs", "bulk", 80.0, 1000), record("lanes", "interactive", 40.0, 100),
               record("lanes", "bulk", 90.0, 1001), record("express", "interactive", 8.0, 100),
               record("express", "bulk", 90.0, 899), {**record("layers", "interactive", 6.0, 100), "rps": 200.0},
               record("layers", "bulk", 90.0, 600)]
    t = targets(records)
    assert t["interactive_p99_over_idle"] == 1.5 and t["interactive_p99_met"] is True  # layers: the defaults
    assert t["bulk_tokens_over_fcfs"] == 0.6 and t["bulk_tokens_met"] is False
    # 200 queries a second at 2 ms of device each (idle: 2 s over 1000 batches) leave bulk 60 % of the device
    assert t["interactive_device_share"] == 0.4 and t["bulk_tokens_over_fcfs_net"] == 1.0
    assert t["express_interactive_p99_over_idle"] == 2.0 and t["express_interactive_p99_met"] is True
    assert t["express_bulk_tokens_over_fcfs"] == 0.899 and t["express_bulk_tokens_met"] is False
    assert t["lanes_interactive_p99_over_idle"] == 10.0 and t["lanes_bulk_tokens_met"] is True
    assert "capped_interactive_p99_met" not in t  # no capped configuration in this run
    lines = table(records).splitlines()
    assert [line.split()[:2] for line in lines[1:10]] == [["idle", "interactive"], ["fcfs", "interactive"],
                                                          ["fcfs", "bulk"], ["lanes", "interactive"],
                                                          ["lanes", "bulk"], ["express", "interactive"],
                                                          ["express", "bulk"], ["layers", "interactive"],
                                                          ["layers", "bulk"]]
    targets_lines = [line for line in lines if line.startswith(("target", "  ("))]
    assert targets_lines[0].endswith("1.50 x MET") and targets_lines[1].endswith("60.0% MISSED")
    assert "40.0% of the device" in targets_lines[2] and targets_lines[2].endswith("100.0%)")
    assert targets_lines[3].endswith("2.00 x MET") and targets_lines[4].endswith("89.9% MISSED")
    missing = targets([record("layers", "bulk", 1.0, 1.0), {**record("fcfs", "bulk", 1, 1), "error": "x"}])
    assert missing["bulk_tokens_met"] is None and missing["interactive_p99_met"] is None


def test_the_file_holds_targets_and_the_plot_is_drawn(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    records = [record("idle", "interactive", 4.0, 100), record("fcfs", "bulk", 80.0, 1000),
               {**record("layers", "interactive", 0, 0), "error": "stack defaults: StackFailed"}]
    paths = write_lanes(tmp_path, "lanes", {"model": "m", "commit": "abc"}, records)
    assert [p.name for p in paths] == ["lanes.json", "lanes.png"] and paths[1].stat().st_size > 10_000
    data = json.loads(paths[0].read_text())
    assert list(data) == ["env", "targets", "records"] and data["targets"]["interactive_p99_met"] is None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_a_short_run_on_two_real_stacks_lanes_off_and_on(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    argv = [sys.executable, "-m", "benchmarks.stack.lanes", "--out", str(tmp_path), "--configs", "fcfs,lanes",
            "--duration-s", "0.5", "--plot", "false", "--warmup-requests", "1", "--bulk-clients", "2", "--bulk-docs", "3",
            "--distinct-inputs", "2", "--doc-max-tokens", "32", "--startup-timeout-s", "90",
            "--port", str(free_port()), "--tulip-port", str(free_port()), "--metrics-port", str(free_port())]
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    data = json.loads((tmp_path / "lanes.json").read_text())
    got = {(r["config"], r["traffic"]): r for r in data["records"]}
    assert sorted(got) == [("fcfs", "bulk"), ("fcfs", "interactive"), ("lanes", "bulk"), ("lanes", "interactive")]
    for r in got.values():
        assert r["requests"] > 0 and r["errors"] == 0 and r["p99_ms"] >= r["p50_ms"] > 0 and r["tokens_per_s"] > 0
    assert got["lanes", "bulk"]["clients"] == 2 and got["lanes", "interactive"]["clients"] == 1
    # The A/B is real: lanes off, Tulip batched the bulk requests in the one FCFS lane; on, in the bulk lane.
    assert got["fcfs", "bulk"]["server"]["lane_tokens_bulk"] == 0
    assert got["lanes", "bulk"]["server"]["lane_tokens_bulk"] > 0
    assert data["env"]["stacks"]["lanes-off"]["TULIP_LANES"] == "false" and data["env"]["model"]
    assert data["targets"]["lanes_bulk_tokens_over_fcfs"] is not None and data["env"]["commit"]
    assert done.stdout.strip().splitlines()[-1].startswith("target: bulk tokens/s with lanes")


def test_a_paced_client_keeps_its_schedule_and_counts_a_late_send_from_when_it_was_due(monkeypatch) -> None:
    """run_loop's pacing on a virtual clock (no wall-clock timing in a test): on schedule it sends one request
    every pace_s; behind a slow answer it sends the next at once and counts its latency from when it was due."""
    import benchmarks.stack.load as load
    from benchmarks.stack.client import Sample

    class Clock:
        now = 100.0

        def perf_counter(self) -> float:
            return self.now

        def sleep(self, seconds: float) -> None:
            self.now += seconds

    clock = Clock()
    monkeypatch.setattr(load, "time", clock)

    class Server:
        def __init__(self, seconds: list[float]) -> None:
            self.seconds, self.sent = seconds, []

        def send(self, client) -> Sample:
            start = clock.now
            self.sent.append(start)
            clock.now += self.seconds[(len(self.sent) - 1) % len(self.seconds)]
            return Sample(start, clock.now - start, 1, 1, True)

    quick = Server([0.01])
    samples = load.run_loop(None, [quick], load.Budget(0.5, 0, 0), pace_s=0.1)
    assert [round(t - 100.0, 6) for t in quick.sent] == [0.0, 0.1, 0.2, 0.3, 0.4]
    assert [round(s.latency_s, 6) for s in samples] == [0.01] * 5
    late = Server([0.25, 0.01, 0.01, 0.01, 0.01])  # the first answer comes 2.5 intervals late
    clock.now = 100.0
    samples = load.run_loop(None, [late], load.Budget(0.45, 0, 0), pace_s=0.1)
    assert [round(t - 100.0, 6) for t in late.sent] == [0.0, 0.25, 0.26, 0.3, 0.4]
    assert [round(s.latency_s, 6) for s in samples] == [0.25, 0.16, 0.07, 0.01, 0.01]  # from when each was due
    closed = Server([0.01])
    clock.now = 100.0
    assert len(load.run_loop(None, [closed], load.Budget(0.1, 0, 0))) == 10  # pace 0: back to back
