"""What the soak samples from the running stack: each process's RSS (/proc) and Tulip's gauges (/metrics).

The processes are `ivy up`'s tree: `ivy up` itself, each `tulip serve`, the gateway (`ivy serve`) and its
uvicorn workers (multiprocessing children of the gateway). Found by walking /proc/*/stat parent ids down
from the `ivy up` PID, so a stack of any size is covered; helpers no one owns here (multiprocessing's
resource tracker, compiler workers) are left out by their command line. RSS is VmRSS of
/proc/PID/status (kB). Tulip's gauges come from its Prometheus text (tulip/metrics.py): ROSE's pinned pool
(rose_pinned_bytes_in_use, rose_pinned_bytes_allocated, rose_pinned_bytes_cap) and the queue depth
(tulip_queue_sequences, tulip_queue_tokens, tulip_batches_in_flight), summed over the replicas.
"""

from __future__ import annotations

import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

PROC = Path("/proc")
GAUGES = {"rose_pinned_bytes_in_use": "pinned_in_use", "rose_pinned_bytes_allocated": "pinned_allocated",
          "rose_pinned_bytes_cap": "pinned_cap", "tulip_queue_sequences": "queue_sequences",
          "tulip_queue_tokens": "queue_tokens", "tulip_batches_in_flight": "batches_in_flight"}


def _cmdline(pid: int, proc: Path) -> list[str]:
    try:
        return [a for a in (proc / str(pid) / "cmdline").read_bytes().decode(errors="replace").split("\0") if a]
    except OSError:
        return []


def parent_ids(proc: Path = PROC) -> dict[int, int]:
    """pid -> parent pid of every process in `proc` (field 4 of /proc/PID/stat, after the ')' of comm)."""
    parents: dict[int, int] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # exited meanwhile
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) >= 2:
            parents[int(entry.name)] = int(fields[1])
    return parents


def role(argv: list[str], parent_role: str | None) -> str | None:
    """'ivy-up', 'tulip', 'ivy-gateway', 'ivy-worker', or None for a process the soak does not watch."""
    if "-m" in argv[:-2]:
        i = argv.index("-m")
        command = (argv[i + 1], argv[i + 2])
        if command == ("ivy", "up"):
            return "ivy-up"
        if command == ("tulip", "serve"):
            return "tulip"
        if command == ("ivy", "serve"):
            return "ivy-gateway"
    if parent_role == "ivy-gateway" and "spawn_main" in " ".join(argv):  # a uvicorn worker (multiprocessing)
        return "ivy-worker"
    return None


def stack_processes(root_pid: int, proc: Path = PROC) -> dict[int, str]:
    """pid -> role of the watched processes in the tree under `root_pid` (root included)."""
    children: dict[int, list[int]] = {}
    for pid, ppid in parent_ids(proc).items():
        children.setdefault(ppid, []).append(pid)
    found: dict[int, str] = {}
    todo: list[tuple[int, str | None]] = [(root_pid, None)]
    while todo:
        pid, parent_role = todo.pop()
        mine = role(_cmdline(pid, proc), parent_role)
        if mine:
            found[pid] = mine
        todo += [(child, mine) for child in sorted(children.get(pid, ()))]
    return found


def rss_kb(pid: int, proc: Path = PROC) -> int | None:
    """VmRSS of /proc/PID/status in kB; None when the process is gone (or a kernel thread)."""
    try:
        for line in (proc / str(pid) / "status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def process_label(pid: int, role_name: str, argv: list[str]) -> str:
    """A stable name per process: 'tulip:50051' (its --port), else 'ivy-worker[1234]' by pid."""
    if role_name == "tulip" and "--port" in argv[:-1]:
        return f"tulip:{argv[argv.index('--port') + 1]}"
    return role_name if role_name in ("ivy-up", "ivy-gateway") else f"{role_name}[{pid}]"


def sample_rss(root_pid: int, proc: Path = PROC) -> dict[str, int]:
    """label -> RSS in kB of every watched process of the stack now."""
    out: dict[str, int] = {}
    for pid, role_name in stack_processes(root_pid, proc).items():
        rss = rss_kb(pid, proc)
        if rss is not None:
            out[process_label(pid, role_name, _cmdline(pid, proc))] = rss
    return out


def parse_gauges(text: str) -> dict[str, float]:
    """The GAUGES of one Prometheus text, by their short names; absent ones are left out."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in GAUGES:
                out[GAUGES[sample.name]] = out.get(GAUGES[sample.name], 0.0) + sample.value
    return out


def scrape_gauges(urls: list[str], timeout_s: float = 5.0) -> dict[str, float]:
    """parse_gauges summed over the replicas' /metrics, plus `replicas_scraped`; a replica that does not
    answer is left out of the sums (and of the count)."""
    totals: dict[str, float] = {"replicas_scraped": 0}
    for url in urls:
        try:
            with urllib.request.urlopen(url, timeout=timeout_s) as answer:
                gauges = parse_gauges(answer.read().decode())
        except (OSError, ValueError):
            continue
        totals["replicas_scraped"] += 1
        for key, value in gauges.items():
            totals[key] = totals.get(key, 0.0) + value
    return totals
