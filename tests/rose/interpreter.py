"""Run a script of this folder under Triton's interpreter in a process of its own (the interpreter is chosen when
a kernel module is imported, so never in the test process): what the kernels' CPU tests share."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                  reason="needs Triton (pip install triton)")


def run_interpreted(script: str, cases: int) -> None:
    """Run tests/rose/`script` (it sets TRITON_INTERPRET=1 itself, prints a line per case ending in " ok" or a
    mismatch, and exits 1 on any mismatch); assert it passed with exactly `cases` cases."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, str(Path(__file__).with_name(script))], env=env, capture_output=True,
                         text=True, timeout=600, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.count(" ok") == cases, run.stdout
