"""The kernel manifest: the Triton variants of ROSE's kernels a replica compiled, for the next start to compile
ahead (rose.kernel_ahead).

`rose_kernels.json` beside the model; when the model's folder is read-only a start records under
~/.cache/rose/<folder name>/ instead, and reads both (a manifest shipped with the model, and its own). The file is
{"kernels": [entry, ...]}, an entry {"module", "name", "source_key" (the kernel's source hash when recorded),
"target" ({"backend", "arch", "warp_size"}: the GPU it was compiled for), "spec" (Triton's specialization record
in `JITFunction.preload`'s format, less the recording machine's libdevice path and the JIT's key)}. Entries of
several GPU types live side by side: each start compiles its own GPU's. When a kernel's source changes (an
upgrade), the next start that compiles it replaces its old entries with what it records.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import sys
import tempfile
import threading
from pathlib import Path

log = logging.getLogger("rose.kernel_manifest")
MANIFEST_NAME = "rose_kernels.json"


def manifest_paths(model_dir: str | Path, manifest: str | None = "auto") -> tuple[list[Path], Path | None]:
    """(files to read, file to write) for `manifest`: "auto" = beside the model, or under ~/.cache/rose/ when
    the model's folder is read-only; a path = that file; None, "" or "off" = off. A manifest shipped beside the model is
    read in every case but off."""
    if is_off(manifest):
        return [], None
    from rose.spec import default_manifest_path

    model_dir = Path(model_dir)
    write = default_manifest_path(model_dir, MANIFEST_NAME) if manifest == "auto" else Path(manifest)
    reads = [p for p in dict.fromkeys([model_dir / MANIFEST_NAME, write]) if p is not None and p.is_file()]
    return reads, write


def is_off(manifest: str | Path | None) -> bool:
    """The manifest setting that turns recording and compiling ahead off: None, "", "off" or "none"."""
    return not manifest or str(manifest).strip().lower() in ("off", "none")


def cuda_target(major: int, minor: int) -> dict:
    """An entry's target for a CUDA GPU of compute capability major.minor (Triton's GPUTarget, as a dict)."""
    return {"backend": "cuda", "arch": major * 10 + minor, "warp_size": 32}


def entry_key(entry: dict) -> tuple:
    return entry["module"], entry["name"], json.dumps(entry["target"], sort_keys=True), entry["spec"]


def read_entries(paths: list[Path]) -> list[dict]:
    """The entries of every readable manifest in `paths`, each variant once; an unreadable file is a warning."""
    entries: dict[tuple, dict] = {}
    for path in paths:  # a later file's entry wins: a start's own (refreshed) manifest over one shipped with the model
        try:
            for entry in json.loads(path.read_text())["kernels"]:
                entries[entry_key(entry)] = entry
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("ignoring the kernel manifest %s: %s", path, exc)
    return list(entries.values())


def portable_spec(specialization_data: str) -> str:
    """Triton's specialization record without what names the recording machine or process (the libdevice path,
    the JIT's key): the same variant recorded on two installs is one entry."""
    spec = json.loads(specialization_data)
    spec.pop("key", None)
    spec.get("options", {}).pop("extern_libs", None)
    return json.dumps(spec)


def current_target() -> dict:
    from triton.runtime import driver

    t = driver.active.get_current_target()
    return {"backend": t.backend, "arch": t.arch, "warp_size": t.warp_size}


class Recorder:
    """Records every variant of ROSE's kernels this process's Triton JIT compiles or loads from the cache, by
    Triton's post-compile hook (chaining a hook installed before it); its own failures never fail the compile it
    watches. With the hook set, Triton serializes each variant's specialization to JSON before calling it, for
    every JIT kernel in the process: a kernel given a value JSON cannot hold as a constexpr (a function) would
    fail its first launch there. ROSE's kernels take ints, floats, bools and dtypes."""

    _installed: Recorder | None = None

    def __init__(self) -> None:
        self.entries: dict[tuple, dict] = {}
        self.sources: dict[tuple[str, str], str] = {}  # (module, name) -> the source hash compiled here
        self._lock = threading.Lock()
        self._previous = None

    @classmethod
    def install(cls) -> Recorder | None:
        """The process's recorder, installed at the first call; None without Triton."""
        if cls._installed is None:
            try:
                from triton import knobs

                recorder = cls()
                recorder._previous = knobs.runtime.jit_post_compile_hook
                knobs.runtime.jit_post_compile_hook = recorder._hook
            except Exception:  # noqa: BLE001 - no Triton, or one without the hook: nothing is recorded
                return None
            cls._installed = recorder
        return cls._installed

    def _hook(self, *, fn, compile, **kwargs):
        try:
            if fn.module.startswith("rose."):
                entry = {"module": fn.module, "name": fn.name, "source_key": fn.jit_function.cache_key,
                         "target": current_target(), "spec": portable_spec(compile["specialization_data"])}
                with self._lock:
                    self.entries.setdefault(entry_key(entry), entry)
                    self.sources[(fn.module, fn.name)] = entry["source_key"]
        except Exception:  # noqa: BLE001 - the manifest is optional; the compile it watches is not
            log.debug("a kernel variant was not recorded", exc_info=True)
        if self._previous is not None:
            return self._previous(fn=fn, compile=compile, **kwargs)
        return None

    def save(self, path: Path) -> int:
        """Merge what was recorded into the manifest at `path` (written whole, then renamed into place), dropping
        old entries of a kernel whose source changed since; returns how many entries it lists (0: nothing to
        record). A failure only logs."""
        with self._lock:
            recorded, sources = list(self.entries.values()), dict(self.sources)
        if not recorded:
            return 0
        old = read_entries([path]) if path.is_file() else []
        kept = [e for e in old if _current_source(e, sources) == e["source_key"]]
        merged = {entry_key(e): e for e in kept}
        for entry in recorded:
            merged.setdefault(entry_key(entry), entry)
        if len(merged) == len(old) and len(kept) == len(old):
            return len(merged)  # nothing new
        temp = None
        try:
            with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=".rose_kernels_", delete=False) as f:
                temp = f.name
                json.dump({"kernels": list(merged.values())}, f, indent=1)
            os.chmod(temp, 0o644)  # readable by a replica running as another user than the one that recorded it
            os.replace(temp, path)
        except OSError as exc:
            log.info("kernel manifest not written to %s: %s", path, exc)
            if temp is not None:
                Path(temp).unlink(missing_ok=True)
            return 0
        return len(merged)


def _current_source(entry: dict, sources: dict[tuple[str, str], str]) -> str | None:
    """The kernel's source hash now: as this process compiled it, else from its module if imported (an entry of
    a kernel renamed or removed since: None, so it is dropped), else as recorded if its module still exists
    (unknown here: kept; a module removed since: None, dropped)."""
    key = (entry["module"], entry["name"])
    if key in sources:
        return sources[key]
    module = sys.modules.get(entry["module"])
    if module is None:
        return entry["source_key"] if module_exists(entry["module"]) else None
    return getattr(getattr(module, entry["name"], None), "cache_key", None)


def module_exists(name: str) -> bool:
    """Whether `name` is a module this install has (found without importing it; a package is imported to look)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False
