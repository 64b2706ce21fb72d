"""RELIABILITY 62 on the GPU: after a kernel's illegal memory access the device runs no more work and
rose.devices.device_runs (Engine.device_ok) says so, where before it said the device runs; Tulip then answers
device_lost and exits 3 (tulip.device_check, tests/tulip/test_tulip_faults.py with the fake engine). The fault is
made in a process of its own: it leaves that process's CUDA context unusable."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

REPO = Path(__file__).resolve().parents[2]
SCRIPT = """
import torch
import triton
import triton.language as tl

from rose.devices import device_runs, prepare_probe


@triton.jit
def wild_store(ptr):
    tl.store(ptr + tl.full((1,), 1 << 40, tl.int64), tl.full((1,), 1.0, tl.float32))


device = torch.device("cuda")
x = torch.zeros(1, device=device)
prepare_probe(device)  # as Engine.warmup does
print("before", device_runs(device), flush=True)
wild_store[(1,)](x)
try:
    torch.cuda.synchronize()
    print("synchronize passed", flush=True)
except Exception as exc:
    print("synchronize raised", type(exc).__name__, str(exc).splitlines()[0], flush=True)
print("after", device_runs(device), flush=True)
"""


def test_an_illegal_address_leaves_the_device_unable_to_run_work(tmp_path) -> None:
    script = tmp_path / "wild_store.py"  # Triton reads a kernel's source from its file
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}  # rose, by path
    out = subprocess.run([sys.executable, str(script)], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=300, check=False)
    print(out.stdout)
    assert "before True" in out.stdout, out.stdout + out.stderr
    assert "synchronize raised" in out.stdout and "after False" in out.stdout, out.stdout + out.stderr[-2000:]
