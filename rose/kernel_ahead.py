"""ROSE's Triton kernels compiled ahead of a replica's warm-up, in worker processes, in parallel.

A fresh replica's warm-up compiles each Triton kernel variant it meets (the attention per block shape, the
QK-norm+RoPE per token block, the norms; each integer or pointer specialization Triton makes of them) one after
another: 13 for the Qwen3-0.6B config, 13.5 s of a 25.7 s start on the H200 host with an empty cache
(`benchmarks.cold_start`). Triton's compile holds the GIL, so threads cannot overlap them; processes can, and
the weights' load leaves the host's cores idle meanwhile.

The kernel manifest (`rose_kernels.json`, beside the model like the graph manifest) lists each variant this
process's ROSE kernels went through Triton's compile for: the kernel (module, name, the hash of its source),
Triton's own specialization record (the format of `JITFunction.preload`: signature, constants, specialization
attributes, options) and the GPU target. `Engine.from_pretrained` starts workers on it (`python -m
rose.kernel_ahead SHARE.json`) before loading the weights; each compiles its share into TRITON_CACHE_DIR with
`triton.compile`, which needs no GPU; warm-up waits for them, and its own launches then load the cubins from the
cache. A variant whose kernel source changed since it was recorded is skipped (stale) and compiles at first use
as before. `rose build-kernels MODEL_DIR --cache-dir DIR` compiles a manifest into DIR on a machine without a GPU
(an image build). ROSE_KERNEL_COMPILE_WORKERS: how many workers (default min(8, CPUs - 1); 0 = off).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("rose.kernel_ahead")
MANIFEST_NAME = "rose_kernels.json"
WORKERS_ENV = "ROSE_KERNEL_COMPILE_WORKERS"


class Recorder:
    """Records every ROSE kernel variant this process compiles (or loads from the cache) through Triton's JIT,
    by Triton's post-compile hook; chains a hook installed before it. One per process (install())."""

    _installed: Recorder | None = None

    def __init__(self) -> None:
        self.entries: dict[tuple[str, str, str], dict] = {}
        self.target: dict | None = None
        self._lock = threading.Lock()
        self._previous = None

    @classmethod
    def install(cls) -> Recorder | None:
        """The process's recorder, installed at first call; None without Triton."""
        if cls._installed is None:
            try:
                from triton import knobs
            except ImportError:
                return None
            recorder = cls()
            recorder._previous = knobs.runtime.jit_post_compile_hook
            knobs.runtime.jit_post_compile_hook = recorder._hook
            cls._installed = recorder
        return cls._installed

    def _hook(self, *, fn, compile, **kwargs):
        if fn.module.startswith("rose."):
            entry = {"module": fn.module, "name": fn.name, "source_key": fn.jit_function.cache_key,
                     "spec": compile["specialization_data"]}
            with self._lock:
                self.entries.setdefault((fn.module, fn.name, entry["spec"]), entry)
                if self.target is None:
                    self.target = current_target()
        if self._previous is not None:
            return self._previous(fn=fn, compile=compile, **kwargs)
        return None

    def save(self, path: Path) -> int:
        """Merge what was recorded into the manifest at `path`; returns how many variants it lists (0: nothing
        recorded, nothing written). An unwritable path only logs."""
        with self._lock:
            recorded, target = list(self.entries.values()), self.target
        if not recorded or target is None:
            return 0
        old = load(path)
        known = {} if old is None or old.target != target else {(e["module"], e["name"], e["spec"]): e
                                                                  for e in old.entries}
        added = [e for e in recorded if (e["module"], e["name"], e["spec"]) not in known]
        if not added:
            return len(known)
        entries = list(known.values()) + added
        try:
            path.write_text(json.dumps({"target": target, "kernels": entries}, indent=1))
        except OSError as exc:
            log.info("kernel manifest not written to %s: %s", path, exc)
            return 0
        return len(entries)


def current_target() -> dict:
    from triton.runtime import driver

    t = driver.active.get_current_target()
    return {"backend": t.backend, "arch": t.arch, "warp_size": t.warp_size}


@dataclass
class Manifest:
    target: dict
    entries: list[dict]


def load(path: Path | None) -> Manifest | None:
    """The manifest at `path`, or None (absent or unreadable: a warning, never an error)."""
    if path is None or not path.is_file():
        return None
    try:
        raw = json.loads(path.read_text())
        return Manifest(dict(raw["target"]), list(raw["kernels"]))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("ignoring the kernel manifest %s: %s", path, exc)
        return None


def manifest_paths(model_dir: Path) -> tuple[Path | None, Path | None]:
    """(where to read, where to write) the model's kernel manifest: beside the model when one was shipped there
    or the folder is writable, else under ~/.cache/rose/<folder name>/ (as the graph manifest)."""
    from rose.spec import default_manifest_path

    write = default_manifest_path(Path(model_dir), MANIFEST_NAME)
    beside = Path(model_dir) / MANIFEST_NAME
    return (beside if beside.is_file() else write), write


def workers_for(count: int) -> int:
    raw = os.environ.get(WORKERS_ENV, "").strip()
    cap = int(raw) if raw else min(8, max(1, (os.cpu_count() or 2) - 1))
    return max(0, min(cap, count))


@dataclass
class Ahead:
    """Worker processes compiling a manifest's variants; wait() joins them and sums their reports."""

    procs: list[subprocess.Popen]
    shares: list[str]  # each worker's share of the manifest, a temporary file
    started: float = field(default_factory=time.perf_counter)

    def wait(self, timeout: float = 300.0) -> dict:
        report = {"compiled": 0, "stale": 0, "failed": 0, "workers": len(self.procs)}
        deadline = self.started + timeout
        for proc in self.procs:
            try:
                out, err = proc.communicate(timeout=max(0.1, deadline - time.perf_counter()))
                for key, value in json.loads(out.strip().splitlines()[-1]).items():
                    report[key] = report.get(key, 0) + value
            except (subprocess.TimeoutExpired, ValueError, IndexError):
                proc.kill()
                out, err = proc.communicate()
                report["failed"] += 1
            if err.strip():
                log.warning("kernel compile worker: %s", err.strip()[-2000:])
        self._remove_shares()
        report["seconds"] = round(time.perf_counter() - self.started, 2)
        return report

    def cancel(self) -> None:
        for proc in self.procs:
            proc.kill()
            proc.communicate()
        self._remove_shares()

    def _remove_shares(self) -> None:
        for name in self.shares:
            Path(name).unlink(missing_ok=True)


_EARLY: dict[str, Ahead] = {}  # started by start_early(), adopted by the engine's start()


def start_early(model_dir: str | Path) -> Ahead | None:
    """start() for the model's manifest before this process imports torch and the engine (Tulip calls it
    first thing, with the kernel cache pointed as the engine will point it); the engine's own start() for that
    manifest then adopts these workers instead of starting others."""
    from rose.kernel_cache import use_kernel_cache

    use_kernel_cache()
    read = manifest_paths(Path(model_dir))[0]
    ahead = start(read)
    if ahead is not None and read is not None:
        _EARLY[str(read.resolve())] = ahead
    return ahead


def start(path: Path | None, workers: int | None = None) -> Ahead | None:
    """Start compiling the manifest's variants that Triton's cache lacks, in worker processes (None: no
    manifest, all of them cached, or workers off); the workers start_early() began for it, if any."""
    if path is not None and str(path.resolve()) in _EARLY:
        return _EARLY.pop(str(path.resolve()))
    manifest = load(path)
    if manifest is None:
        return None
    n = workers_for(len(manifest.entries)) if workers is None else min(workers, len(manifest.entries))
    missing = [e for e in manifest.entries if not in_cache(e, manifest.target)] if n > 0 else []
    n = min(n, len(missing))
    if n <= 0:
        return None
    procs, shares = [], []
    for i in range(n):
        with tempfile.NamedTemporaryFile("w", suffix=".json", prefix="rose_kernels_", delete=False) as f:
            json.dump({"target": manifest.target, "kernels": missing[i::n]}, f)
        shares.append(f.name)
        procs.append(subprocess.Popen([sys.executable, "-m", "rose.kernel_ahead", f.name], stdin=subprocess.DEVNULL,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      env=dict(os.environ)))  # TRITON_CACHE_DIR as this process has it now
    return Ahead(procs, shares)


def _specialization(spec: dict, tl) -> tuple[dict, dict, dict]:
    """(signature, constants, attrs) from Triton's specialization record, as `JITFunction.preload` reads it."""
    constants = {tuple(k): tl.dtype(v) if tl.dtype.is_dtype(v) else
                 tl.constexpr(v["constexpr"]) if isinstance(v, dict) and "constexpr" in v else v
                 for k, v in zip(spec["constant_keys"], spec["constant_vals"])}
    attrs = {tuple(k): v for k, v in zip(spec["attrs_keys"], spec["attrs_vals"])}
    signature = {k: tuple(v) if isinstance(v, list) else v for k, v in spec["signature"].items()}
    return signature, constants, attrs


def _options(entry: dict) -> dict:
    return {k: tuple(v) if isinstance(v, list) else v for k, v in json.loads(entry["spec"])["options"].items()
            if k != "extern_libs"}  # a path of the recording machine's Triton: this one's default instead


def _variant(entry: dict):
    """(ASTSource, options) of a manifest entry as Triton's JIT builds them, or None when the kernel's source
    changed since it was recorded."""
    import importlib

    import triton
    import triton.language as tl

    fn = getattr(importlib.import_module(entry["module"]), entry["name"])
    if fn.cache_key != entry["source_key"]:
        return None
    return triton.compiler.ASTSource(fn, *_specialization(json.loads(entry["spec"]), tl)), _options(entry)


def _gpu(target: dict):
    from triton.backends.compiler import GPUTarget

    return GPUTarget(target["backend"], target["arch"], target["warp_size"])


def in_cache(entry: dict, target: dict) -> bool:
    """Whether Triton's cache holds this variant already (the lookup `triton.compile` starts with), taking the
    kernel's source as recorded: no kernel module (and no torch) is imported, so a process can ask before its
    own imports. A variant whose source changed since reads as missing unless its old build is cached; either
    way the worker (which checks the source) or the first use compiles the new one."""
    import hashlib
    from types import SimpleNamespace

    import triton.language as tl
    from triton._C.libtriton import get_cache_invalidating_env_vars
    from triton.compiler import ASTSource
    from triton.compiler.compiler import make_backend
    from triton.runtime.cache import get_cache_key, get_cache_manager

    try:
        fn = SimpleNamespace(__name__=entry["name"], cache_key=entry["source_key"], arg_names=())
        src, options = ASTSource(fn, *_specialization(json.loads(entry["spec"]), tl)), _options(entry)
        backend = make_backend(_gpu(target))
        parsed = backend.parse_options(dict(options, **src.parse_options()))
        key = get_cache_key(src, backend, parsed, env_vars=get_cache_invalidating_env_vars())
        name = f"{src.name[:150]}.json"
        return name in (get_cache_manager(hashlib.sha256(key.encode("utf-8")).hexdigest()).get_group(name) or {})
    except Exception:  # noqa: BLE001 - let a worker try it, and report what fails
        return False


def compile_entries(target: dict, entries: list[dict]) -> dict:
    """Compile each recorded variant for `target` into Triton's cache (an existing one is only loaded).
    Returns counts: compiled, stale (the kernel's source changed since), failed."""
    import triton

    counts = {"compiled": 0, "stale": 0, "failed": 0}
    for entry in entries:
        try:
            variant = _variant(entry)
            if variant is None:
                counts["stale"] += 1
                continue
            triton.compile(variant[0], target=_gpu(target), options=variant[1])
            counts["compiled"] += 1
        except Exception as exc:  # noqa: BLE001 - that variant compiles at first use instead
            counts["failed"] += 1
            print(f"rose.kernel_ahead: {entry.get('module')}.{entry.get('name')}: {type(exc).__name__}: {exc}",
                  file=sys.stderr)
    return counts


def main() -> int:
    share = json.loads(Path(sys.argv[1]).read_text())
    print(json.dumps(compile_entries(share["target"], share["kernels"])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
