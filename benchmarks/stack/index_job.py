"""One `ivy index` run as a child process for the index benchmark: to the end, or SIGKILLed in the middle.

`run_ivy_index` starts `python -m ivy index SOURCE OUTPUT FLAGS... --progress log`, its output appended to a
log, and waits; with `kill_at_shards` it watches OUTPUT/manifest.json and SIGKILLs the job as soon as that
many shards are committed (the kill of issue 18: any moment, here a known one). A finished run's own
summary.json (documents/s and tokens/s over its job, without the process's start) is returned and removed,
so that a resumed run into the same folder writes its own.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from benchmarks.stack.up_stack import REPO
from ivy.up_process import _parent_death_signal  # the job gets SIGTERM when the benchmark dies


def committed(output: Path) -> int:
    """Shards the manifest of `output` records as committed (0 before it exists)."""
    try:
        return len(json.loads((output / "manifest.json").read_text())["shards"])
    except (OSError, ValueError, KeyError):
        return 0


def run_ivy_index(source: Path, output: Path, flags: Sequence[str], log_path: Path, limit_s: float,
                  kill_at_shards: int = 0) -> dict[str, Any]:
    """{"argv", "exit_code", "wall_s", and "summary" (finished) or "killed"/"shards_at_kill"}; raises
    TimeoutError past `limit_s` (the job is killed first)."""
    argv = [sys.executable, "-m", "ivy", "index", str(source), str(output), *flags, "--progress", "log",
            "--log-interval-s", "5"]
    started = time.monotonic()
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                preexec_fn=_parent_death_signal())
    out: dict[str, Any] = {"argv": argv[3:]}
    try:
        while proc.poll() is None:
            if time.monotonic() - started > limit_s:
                raise TimeoutError(f"ivy index ran past its {limit_s:.0f} s ({output.name})")
            if kill_at_shards and committed(output) >= kill_at_shards:
                proc.kill()
                proc.wait()
                out.update(killed=True, shards_at_kill=committed(output))
                break
            time.sleep(0.02 if kill_at_shards else 0.2)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out.update(exit_code=proc.returncode, wall_s=round(time.monotonic() - started, 3))
    summary = output / "summary.json"
    if not out.get("killed") and proc.returncode == 0 and summary.exists():
        out["summary"] = json.loads(summary.read_text())
        summary.unlink()
    return out
