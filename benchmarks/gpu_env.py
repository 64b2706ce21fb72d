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
