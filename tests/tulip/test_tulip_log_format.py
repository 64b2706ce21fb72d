"""`TULIP_LOG_FORMAT=json` (rose/log_format.py): a real `tulip serve` writes every line of its start, its
serving and its drain as one JSON object with service "tulip"."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from rose.spec import bundled_model_dir

REPO = Path(__file__).resolve().parents[2]


def test_tulip_serve_logs_every_line_as_json() -> None:
    factory = f"{REPO / 'benchmarks' / 'zero_engine.py'}:ZeroEngine.from_pretrained"
    proc = subprocess.Popen([sys.executable, "-m", "tulip", "serve", "--port", "0", "--device", "cpu", "--model",
                             str(bundled_model_dir()), "--engine-factory", factory, "--metrics-port", "0"],
                            env={**os.environ, "TULIP_LOG_FORMAT": "json"}, cwd=REPO, stderr=subprocess.PIPE,
                            text=True)
    lines = []
    try:
        deadline = time.monotonic() + 60
        while not any("tulip ready" in line for line in lines):
            assert time.monotonic() < deadline and proc.poll() is None, lines
            lines.append(proc.stderr.readline())
        proc.terminate()
        lines += proc.stderr.read().splitlines()
        assert proc.wait(30) == 0
    finally:
        proc.kill()
    records = [json.loads(line) for line in lines if line.strip()]
    assert all(r["service"] == "tulip" and r["pid"] == proc.pid for r in records)
    messages = [r["message"] for r in records]
    assert any(m.startswith("tulip ready") for m in messages) and any("draining" in m for m in messages)
