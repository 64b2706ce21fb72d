"""benchmarks.step_host_compare reads the step-host A/B's round files as device.sh writes them and puts each model and
shape's sides side by side (the committed 2439ae8 / 1e5d9f8 rounds, and made-up files for the arithmetic)."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.step_host_compare import rounds, table

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "step_host_ab_2439ae8_1e5d9f8"


def _write(folder: Path, name: str, scale: float) -> None:
    phases = {p: {"p50_us": scale * w, "p90_us": 0.0} for p, w in
              (("layout", 1), ("pack", 2), ("buffer", 3), ("stage", 4), ("dispatch", 5), ("step", 20),
               ("host_to_host", 100), ("gpu", 80))}
    (folder / name).write_text(json.dumps({"results": {"1x128": phases}}))


def test_medians_over_rounds_and_the_work_before_the_replay(tmp_path):
    for name, scale in (("base1", 1.0), ("base2", 3.0), ("base3", 2.0), ("head1", 0.5), ("head2", 0.5)):
        _write(tmp_path, f"step_host_m_{name}.json", scale)
    (tmp_path / "step_host_m.json").write_text("{}")  # a lone run's file: not a round
    lines = table(rounds([tmp_path]))
    assert lines[1].startswith("m 1x128 | 30.0 -> 7.5 | 2.0 -> 0.5 | 4.0 -> 1.0 | 8.0 -> 2.0 | 40.0 -> 10.0 | ")
    assert lines[1].endswith("| 100 / 300 / 200; 50 / 50")


def test_the_committed_rounds_read_as_notes_says():
    lines = table(rounds([RESULTS / "call1", RESULTS / "call2"]))
    minilm = next(line for line in lines if line.startswith("minilm-l6 1x128 "))
    assert "| 97.0 -> 55.0 |" in minilm and "| 311.2 -> 264.8 |" in minilm
