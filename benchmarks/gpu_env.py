"""Where GPU numbers were taken: GPU, driver, CUDA, torch and the git commit (GIT_COMMIT when the
tree was copied without .git, as on the lent device)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from datetime import datetime, timezone
from typing import Any

from benchmarks.stack.report import gpu_env


def git_commit() -> str | None:
    if os.environ.get("GIT_COMMIT"):
        return os.environ["GIT_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def collect() -> dict[str, Any]:
    env = {"timestamp": datetime.now(timezone.utc).isoformat(timespec="seconds"), "commit": git_commit(),
           "python": sys.version.split()[0], "platform": platform.platform(), **gpu_env()}
    gpus = env.get("gpus") or [{}]
    env["gpu"] = gpus[0].get("name")
    env["driver"] = gpus[0].get("driver")
    try:
        import transformers

        env["transformers"] = transformers.__version__
    except ImportError:
        pass
    return env


def copy_bandwidth() -> float:
    """The card's device-to-device copy rate, bytes read + written per second (what a weight-read floor is read
    at): a 1 GiB copy, three warm-ups, then ten timed by CUDA events."""
    import torch

    a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        b.copy_(a)
    end.record()
    torch.cuda.synchronize()
    return 2 * 10 * a.numel() / (start.elapsed_time(end) / 1e3)
