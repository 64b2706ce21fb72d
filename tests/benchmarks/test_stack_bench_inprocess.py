"""The in-process replay of a stack run's concurrency inputs (the denominator of the 80 % target)."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.stack.inprocess import interleave, main


def _inputs(levels: dict[int, int]) -> dict:
    return {"concurrency": {str(level): [[{"texts": [f"client {k} request {i} text"], "tokens": 7}
                                          for i in range(per_client)] for k in range(level)]
                            for level, per_client in levels.items()}}


def test_interleave_is_round_robin_over_clients() -> None:
    per_client = [[{"texts": ["a0"]}, {"texts": ["a1"]}], [{"texts": ["b0"]}], [{"texts": ["c0"]}, {"texts": ["c1"]}]]
    assert interleave(per_client) == ["a0", "b0", "c0", "a1", "c1"]


def test_replay_reports_engine_throughput_and_the_stack_ratio(minilm_dir: Path, tmp_path: Path, capsys) -> None:
    (tmp_path / "in.json").write_text(json.dumps(_inputs({1: 3, 2: 3})))
    stack = {"records": [{"suite": "concurrency", "param": 2, "tokens_per_s": 100.0},
                         {"suite": "throughput", "param": 100, "tokens_per_s": 1.0}]}
    (tmp_path / "stack.json").write_text(json.dumps(stack))
    assert main(["--model-dir", str(minilm_dir), "--inputs", str(tmp_path / "in.json"), "--stack",
                 str(tmp_path / "stack.json"), "--device", "cpu", "--rounds", "1", "--out",
                 str(tmp_path / "out.json")]) == 0
    rows = json.loads((tmp_path / "out.json").read_text())["rows"]
    assert [(r["clients"], r["batch_size"], r["requests"]) for r in rows] == [(1, 1, 3), (2, 2, 6)]
    assert all(r["tokens"] > 6 * r["requests"] and r["tokens_per_s"] > 0 for r in rows)
    assert "stack_over_inprocess" not in rows[0]
    assert rows[1]["stack_over_inprocess"] == round(100.0 / rows[1]["tokens_per_s"], 4)
    assert "stack/in-process" in capsys.readouterr().out
