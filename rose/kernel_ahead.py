"""ROSE's Triton kernels compiled ahead of a replica's warm-up, in worker processes, in parallel.

A fresh replica's warm-up compiles each Triton kernel variant it meets (the attention per block shape, the
QK-norm+RoPE per token block, the norms; each integer or pointer specialization Triton makes of them) one after
another: 27 for the Qwen3-0.6B's serving start, and `ivy up` took 40 s to ready on a fresh H200 machine against
14-17 s with the cache kept (benchmarks/NOTES.md, "Triton kernels compiled ahead"). Triton's compile holds the
GIL, so threads cannot overlap them; processes can, while the process imports torch and loads the weights.

The variants come from the kernel manifest (rose.kernel_manifest) that earlier starts recorded. The engine's start
(`engine_start`), or Tulip's before it imports torch (`start_early`, adopted by the engine), hands the manifest's
variants for this GPU that Triton's cache lacks to up to ROSE_KERNEL_COMPILE_WORKERS (default min(8, CPUs - 1);
0 = off) workers (`python -m rose.kernel_ahead`, its share on stdin), each compiling with `triton.compile` (no GPU
needed) into TRITON_CACHE_DIR; warm-up waits for them and its launches load the cubins. A variant whose kernel
source changed since it was recorded is skipped (stale) and compiles at first use, as with no manifest at all.
Nothing here can stop a replica's start: every failure logs and the kernels compile at first use.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import ClassVar

from rose.host_cpus import usable_cpus
from rose.kernel_manifest import cuda_target, is_off, manifest_paths, module_exists, read_entries

log = logging.getLogger("rose.kernel_ahead")
WORKERS_ENV = "ROSE_KERNEL_COMPILE_WORKERS"


def default_workers(cpus: int | None = None, tulips: int = 1) -> int:
    """Compile workers a start takes unless ROSE_KERNEL_COMPILE_WORKERS says: up to 8 of the usable CPUs but
    one (rose.host_cpus: a CPU-limited container's, not the host's), shared among `tulips` replicas starting
    together (ivy up)."""
    return max(1, min(8, ((cpus or usable_cpus()) - 1) // tulips))


def workers_for(count: int) -> int:
    raw = os.environ.get(WORKERS_ENV, "").strip()
    default = default_workers()
    try:
        cap = int(raw) if raw else default
    except ValueError:
        log.warning("%s=%r is not a number: %d workers", WORKERS_ENV, raw, default)
        cap = default
    return max(0, min(cap, count))


class CompileWorkers:
    """Worker processes compiling manifest entries; wait() joins them and sums their reports, cancel() kills
    them. Workers nobody waited for are killed when this process exits."""

    _live: ClassVar[set[CompileWorkers]] = set()

    def __init__(self, procs: list[subprocess.Popen], target: dict) -> None:
        self.procs, self.target, self.started = procs, target, time.perf_counter()
        CompileWorkers._live.add(self)

    def wait(self, timeout: float = 120.0) -> dict:
        report = {"compiled": 0, "stale": 0, "failed": 0, "workers": len(self.procs)}
        deadline = self.started + timeout
        for proc in self.procs:
            try:
                out, _ = proc.communicate(timeout=max(0.1, deadline - time.perf_counter()))
                counts = json.loads(out.strip().splitlines()[-1])
                for key in ("compiled", "stale", "failed"):
                    report[key] += int(counts[key])
                for error in counts.get("errors", [])[:3]:
                    log.warning("kernel compile worker: %s", error)
            except Exception:  # noqa: BLE001 - a worker that hung, died or printed nothing sensible
                proc.kill()
                proc.communicate()
                report["failed"] += 1  # its share compiles at first use
        CompileWorkers._live.discard(self)
        report["seconds"] = round(time.perf_counter() - self.started, 2)
        return report

    def cancel(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.communicate()
        CompileWorkers._live.discard(self)


@atexit.register
def _cancel_live() -> None:
    for workers in list(CompileWorkers._live):
        workers.cancel()


def start_workers(entries: list[dict], target: dict, workers: int | None = None) -> CompileWorkers | None:
    """Compile `entries` (for `target`) in worker processes; None when there are none or workers are off."""
    n = workers_for(len(entries)) if workers is None else min(workers, len(entries))
    procs: list[subprocess.Popen] = []
    try:
        for i in range(n):
            proc = subprocess.Popen([sys.executable, "-m", "rose.kernel_ahead"], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                    env=dict(os.environ))  # TRITON_CACHE_DIR as this process has it now
            procs.append(proc)
            proc.stdin.write(json.dumps({"target": target, "kernels": entries[i::n]}))  # type: ignore[union-attr]
            proc.stdin.close()  # type: ignore[union-attr]
            proc.stdin = None  # communicate() in wait() must not touch it again
    except BaseException:
        CompileWorkers(procs, target).cancel()
        raise
    return CompileWorkers(procs, target) if procs else None


def missing(paths: list[Path], target: dict) -> list[dict]:
    """The manifests' entries for `target` that Triton's cache lacks."""
    return [e for e in read_entries(paths) if e.get("target") == target and not in_cache(e)]


def driver_target() -> dict | None:
    """The target of this host's GPUs from the driver (nvidia-smi), without torch: None unless every GPU has
    the same compute capability."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=10, check=True).stdout.split()
        caps = {tuple(int(x) for x in line.split(".")) for line in out}
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    if len(caps) != 1:
        return None
    (major, minor), = caps
    return cuda_target(major, minor)


_EARLY: dict[str, CompileWorkers] = {}  # by model folder: start_early()'s workers, for engine_start() to adopt


def start_early(model_dir: str | Path, target: dict, manifest: str | None = "auto") -> CompileWorkers | None:
    """Start the workers before this process imports torch and loads the engine (Tulip calls it first thing,
    the kernel cache pointed as the engine will point it); engine_start() for that folder adopts them."""
    from rose.kernel_cache import use_kernel_cache

    use_kernel_cache()
    workers = start_workers(missing(manifest_paths(model_dir, manifest)[0], target), target)
    if workers is not None:
        _EARLY[str(Path(model_dir).expanduser().resolve())] = workers
    return workers


def engine_start(model_dir: str | Path, device, manifest: str | None = "auto",
                 ) -> tuple[CompileWorkers | None, Path | None]:
    """For an engine starting on `device` (torch): (the workers compiling its manifest's variants for this GPU,
    adopted from start_early() when they compile for it, else started now, or None; where to record the
    manifest, or None). Never raises; early workers it does not adopt are cancelled."""
    early = _EARLY.pop(str(Path(model_dir).expanduser().resolve()), None)
    workers, write = None, None
    try:
        if device.type == "cuda" and not is_off(manifest):
            import torch

            target = cuda_target(*torch.cuda.get_device_capability(device))
            reads, write = manifest_paths(model_dir, manifest)
            if early is not None and early.target == target:
                workers, early = early, None
            else:
                workers = start_workers(missing(reads, target), target)
    except Exception:  # noqa: BLE001 - kernels then compile at first use, as without a manifest
        log.warning("the kernel manifest's variants are not compiled ahead", exc_info=True)
    if early is not None:
        early.cancel()
    return workers, write


def in_cache(entry: dict) -> bool:
    """Whether Triton's cache holds this variant already (the lookup `triton.compile` starts with), taking the
    kernel's source as recorded: no kernel module (and no torch) is imported, so a process can ask before its
    own imports. A variant whose source changed since reads as missing unless its old build is cached; either
    way the worker (which checks the source) or the first use compiles the new one."""
    try:
        import hashlib
        from types import SimpleNamespace

        from triton._C.libtriton import get_cache_invalidating_env_vars
        from triton.compiler import ASTSource
        from triton.compiler.compiler import make_backend
        from triton.runtime.cache import get_cache_key, get_cache_manager

        fn = SimpleNamespace(__name__=entry["name"], cache_key=entry["source_key"], arg_names=())
        src = ASTSource(fn, *_specialization(entry))
        backend = make_backend(_gpu(entry["target"]))
        parsed = backend.parse_options(dict(_options(entry), **src.parse_options()))
        key = get_cache_key(src, backend, parsed, env_vars=get_cache_invalidating_env_vars())
        name = f"{src.name[:150]}.json"
        return name in (get_cache_manager(hashlib.sha256(key.encode("utf-8")).hexdigest()).get_group(name) or {})
    except Exception:  # noqa: BLE001 - let a worker try it, and report what fails
        return False


def _specialization(entry: dict) -> tuple[dict, dict, dict]:
    """(signature, constants, attrs) from the entry's specialization record, as `JITFunction.preload` reads it."""
    import triton.language as tl
    from triton.runtime.jit import convert_to_tuple_if_list

    spec = json.loads(entry["spec"])
    constants = {tuple(k): tl.dtype(v) if tl.dtype.is_dtype(v) else
                 tl.constexpr(convert_to_tuple_if_list(v["constexpr"])) if isinstance(v, dict) and "constexpr" in v
                 else convert_to_tuple_if_list(v) for k, v in zip(spec["constant_keys"], spec["constant_vals"])}
    attrs = {tuple(k): v for k, v in zip(spec["attrs_keys"], spec["attrs_vals"])}
    signature = {k: convert_to_tuple_if_list(v) for k, v in spec["signature"].items()}
    return signature, constants, attrs


def _options(entry: dict) -> dict:
    options = json.loads(entry["spec"])["options"]
    options.pop("extern_libs", None)  # the recording machine's libdevice path: this machine's default instead
    return {k: tuple(v) if isinstance(v, list) else v for k, v in options.items()}


def _gpu(target: dict):
    from triton.backends.compiler import GPUTarget

    return GPUTarget(target["backend"], target["arch"], target["warp_size"])


def compile_entries(target: dict, entries: list[dict]) -> dict:
    """Compile each entry for `target` into Triton's cache (one already there is only loaded). Returns counts:
    compiled, stale (the kernel's source changed since it was recorded, or its module is gone), failed; and the
    failures' errors."""
    import importlib

    import triton

    counts: dict = {"compiled": 0, "stale": 0, "failed": 0, "errors": []}
    for entry in entries:
        if not module_exists(entry["module"]):  # removed since it was recorded
            counts["stale"] += 1
            continue
        try:
            fn = getattr(importlib.import_module(entry["module"]), entry["name"])
            if fn.cache_key != entry["source_key"]:
                counts["stale"] += 1
                continue
            triton.compile(triton.compiler.ASTSource(fn, *_specialization(entry)), target=_gpu(target),
                           options=_options(entry))
            counts["compiled"] += 1
        except Exception as exc:  # noqa: BLE001 - that variant compiles at first use instead
            counts["failed"] += 1
            counts["errors"].append(f"{entry.get('module')}.{entry.get('name')}: {type(exc).__name__}: {exc}"[:500])
    return counts


def main() -> int:
    share = json.loads(sys.stdin.read())
    print(json.dumps(compile_entries(share["target"], share["kernels"])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
