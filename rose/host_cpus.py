"""The CPUs this process may use: its affinity set, lowered to a cgroup CPU quota (a container's `--cpus`, a
Kubernetes CPU limit). Torch-free: Ivy's workers and tokenizer threads and ROSE's kernel compile workers are
sized by it, not by the host's core count, which a CPU-limited container does not get.
"""

from __future__ import annotations

import os


def usable_cpus() -> int:
    """CPUs this process may run on: its affinity set, lowered to a cgroup CPU quota (a container's
    `--cpus`, a Kubernetes CPU limit) when one is set."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cpus = os.cpu_count() or 1
    quota = cgroup_cpu_quota()
    return max(1, min(cpus, quota) if quota else cpus)


def cgroup_cpu_quota(root: str = "/sys/fs/cgroup") -> int | None:
    """The cgroup's CPU limit rounded up to whole CPUs (v2 `cpu.max`, else v1 `cpu.cfs_quota_us` over
    `cpu.cfs_period_us`); None when there is no limit or no cgroup file to read."""
    try:
        with open(os.path.join(root, "cpu.max")) as f:
            quota, _, period = f.read().strip().partition(" ")
    except OSError:
        try:
            with open(os.path.join(root, "cpu", "cpu.cfs_quota_us")) as f:
                quota = f.read().strip()
            with open(os.path.join(root, "cpu", "cpu.cfs_period_us")) as f:
                period = f.read().strip()
        except OSError:
            return None
    try:
        q, p = int(quota), int(period or 100000)
    except ValueError:  # "max": no limit
        return None
    return -(-q // p) if q > 0 and p > 0 else None
