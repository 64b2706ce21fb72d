"""ROSE's Triton kernels compiled ahead from the kernel manifest (rose.kernel_ahead, rose.kernel_manifest), no GPU.

A manifest entry is what the recorder keeps from Triton's post-compile hook on a GPU (built here the way Triton's
JIT builds it); a worker process compiles it into TRITON_CACHE_DIR, and the JIT's own compile call for that
variant then finds it there (adds no file). Stale, broken, foreign and other-GPU entries; the recorder's merge and
refresh; an engine start that survives every failure of this optional step; the build-kernels command without
a GPU, as an image build runs it.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from rose import kernel_ahead, kernel_manifest
from rose.kernel_manifest import MANIFEST_NAME, Recorder, read_entries

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs Triton")
TARGET = {"backend": "cuda", "arch": 90, "warp_size": 32}
_MODULE_EXISTS = kernel_manifest.module_exists


@pytest.fixture(autouse=True)
def _fake_kernel_modules_exist(monkeypatch):
    """The recorder's tests name kernels of modules that are not files (rose.fake_kernels_*): as if they were, so
    that only a test about removed modules meets the real check."""
    monkeypatch.setattr(kernel_manifest, "module_exists",
                        lambda name: name.startswith("rose.fake_kernels") or _MODULE_EXISTS(name))
CUDA = SimpleNamespace(type="cuda")


def _act_mul_variant():
    """_act_mul_kernel's variant for bf16 pointers and 16-divisible ints as the JIT compiles it on an H100/H200:
    (the JIT's ASTSource arguments, its options, the manifest entry the recorder keeps)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend
    from triton.runtime.jit import serialize_specialization_data

    from rose.layers import fused

    fn = fused._act_mul_kernel
    signature = {"gu_ptr": "*bf16", "out_ptr": "*bf16", "inner": "i32", "stride": "i32", "ACT": "constexpr",
                 "BLOCK": "constexpr"}
    constexprs = {(4,): 0, (5,): 1024}
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(4)}
    options = make_backend(GPUTarget("cuda", 90, 32)).parse_options({"num_warps": 4, "debug": False})
    newer = "target" in inspect.signature(serialize_specialization_data).parameters  # Triton >= 3.7 records it
    spec = serialize_specialization_data(fn.fn.__qualname__, signature, constexprs, attrs, options, "key",
                                         *([GPUTarget("cuda", 90, 32)] if newer else []))
    entry = {"module": "rose.layers.fused", "name": "_act_mul_kernel", "source_key": fn.cache_key,
             "target": TARGET, "spec": kernel_manifest.portable_spec(spec)}
    return (fn, signature, constexprs, attrs), options, entry


def _write(path: Path, entries) -> Path:
    path.write_text(json.dumps({"kernels": entries}))
    return path


def _cache_files(root: Path) -> set[str]:
    return {str(p) for p in root.rglob("*") if p.is_file()}


@needs_triton
def test_a_worker_compiles_the_variant_the_jit_then_finds(tmp_path, monkeypatch):
    import triton
    from triton.backends.compiler import GPUTarget

    cache = tmp_path / "triton"
    monkeypatch.setenv("TRITON_CACHE_DIR", str(cache))  # the workers inherit it
    source, options, entry = _act_mul_variant()
    assert kernel_ahead.missing([_write(tmp_path / MANIFEST_NAME, [entry])], TARGET) == [entry]
    report = kernel_ahead.start_workers([entry], TARGET, workers=1).wait(timeout=240)
    assert (report["compiled"], report["stale"], report["failed"], report["workers"]) == (1, 0, 0, 1)
    before = _cache_files(cache)
    assert any(name.endswith(".cubin") for name in before)
    assert kernel_ahead.missing([tmp_path / MANIFEST_NAME], TARGET) == [], "now cached: no worker needed"
    # the JIT's own call for this variant (triton.runtime.jit's _do_compile): served from the cache
    triton.compile(triton.compiler.ASTSource(*source), target=GPUTarget("cuda", 90, 32), options=options.__dict__)
    assert _cache_files(cache) == before


@needs_triton
def test_stale_broken_and_foreign_entries_never_raise(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    _, _, entry = _act_mul_variant()
    stale = {**entry, "source_key": "the kernel's source before an edit"}
    removed_module = {**entry, "module": "rose.no_such_module"}  # a kernel's module removed since: stale
    broken = {**entry, "spec": "{not json"}
    counts = kernel_ahead.compile_entries(TARGET, [stale, removed_module, broken])
    assert (counts["compiled"], counts["stale"], counts["failed"]) == (0, 2, 1) and len(counts["errors"]) == 1
    assert not _cache_files(tmp_path) - {str(p) for p in tmp_path.glob("*")}


@needs_triton
def test_only_this_gpus_entries_are_compiled_ahead(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    _, _, entry = _act_mul_variant()
    other = {**entry, "target": {**TARGET, "arch": 80}}
    path = _write(tmp_path / MANIFEST_NAME, [entry, other])
    assert kernel_ahead.missing([path], {**TARGET, "arch": 80}) == [other]
    assert kernel_ahead.missing([path], {**TARGET, "arch": 100}) == []


@needs_triton
def test_the_cache_lookup_imports_no_kernel_module_and_no_torch(tmp_path, monkeypatch):
    import subprocess
    import sys

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    _, _, entry = _act_mul_variant()
    assert kernel_ahead.compile_entries(TARGET, [entry])["compiled"] == 1
    code = ("import json, sys; from rose import kernel_ahead; "
            f"print(kernel_ahead.in_cache(json.loads({json.dumps(json.dumps(entry))})), "
            "'torch' in sys.modules, 'rose.layers.fused' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False,
                         env={**os.environ, "TRITON_CACHE_DIR": str(tmp_path)})
    assert out.stdout.split() == ["True", "False", "False"], out.stderr[-2000:]


def _hook_call(recorder, module: str, spec: str, source: str = "src") -> None:
    fn = SimpleNamespace(module=module, name="_k", jit_function=SimpleNamespace(cache_key=source))
    spec_data = json.dumps({"options": {"extern_libs": [["libdevice", "/this/machine"]]}, "key": "k", "s": spec})
    recorder._hook(fn=fn, compile={"specialization_data": spec_data}, key="k", repr="r", is_manual_warmup=False,
                   already_compiled=False)


def test_recorder_keeps_roses_kernels_merges_and_replaces_a_changed_kernels(tmp_path, monkeypatch):
    monkeypatch.setattr(kernel_manifest, "current_target", lambda: dict(TARGET))
    path = tmp_path / MANIFEST_NAME
    first = Recorder()
    assert first.save(path) == 0 and not path.exists(), "nothing recorded: nothing written"
    _hook_call(first, "rose.fake_kernels_a", "a")
    _hook_call(first, "rose.fake_kernels_a", "a")  # the same variant again (another process, the cache)
    _hook_call(first, "someone.elses.kernels", "x")
    assert first.save(path) == 1
    assert "/this/machine" not in path.read_text(), "no machine-specific path in the manifest"
    second = Recorder()
    _hook_call(second, "rose.fake_kernels_b", "b")
    monkeypatch.setattr(kernel_manifest, "current_target", lambda: {**TARGET, "arch": 80})
    _hook_call(second, "rose.fake_kernels_b", "b")  # the same variant on another GPU: kept beside
    assert second.save(path) == 3
    upgraded = Recorder()
    monkeypatch.setattr(kernel_manifest, "current_target", lambda: dict(TARGET))
    _hook_call(upgraded, "rose.fake_kernels_a", "a", source="src after an upgrade")
    assert upgraded.save(path) == 3
    sources = {(e["module"], e["source_key"]) for e in read_entries([path])}
    assert ("rose.fake_kernels_a", "src") not in sources and ("rose.fake_kernels_a", "src after an upgrade") in sources
    assert not list(tmp_path.glob(".rose_kernels_*")), "written whole, then renamed into place"


def test_the_recorder_never_fails_the_compile_it_watches(monkeypatch):
    calls = []

    def broken():
        raise RuntimeError("no driver")

    monkeypatch.setattr(kernel_manifest, "current_target", broken)
    recorder = Recorder()
    recorder._previous = lambda **kw: calls.append(kw["fn"].module)  # a hook installed before it: chained
    _hook_call(recorder, "rose.layers.fused", "a")
    assert calls == ["rose.layers.fused"] and not recorder.entries


def test_the_engine_start_survives_every_failure_and_cancels_unadopted_workers(tmp_path, monkeypatch):
    assert kernel_ahead.engine_start(tmp_path, SimpleNamespace(type="cpu")) == (None, None)
    assert kernel_ahead.engine_start(tmp_path, CUDA, manifest=None) == (None, None)

    def broken(*args, **kwargs):
        raise OSError("too many open files")

    monkeypatch.setattr(kernel_ahead, "start_workers", broken)
    monkeypatch.setattr(kernel_ahead, "missing", lambda reads, target: [])
    import torch

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    workers, record_to = kernel_ahead.engine_start(tmp_path, CUDA)
    assert workers is None and record_to == tmp_path / MANIFEST_NAME  # logged; the start goes on
    cancelled = []
    early = SimpleNamespace(target={**TARGET, "arch": 80}, cancel=lambda: cancelled.append(1))
    monkeypatch.setitem(kernel_ahead._EARLY, str(tmp_path.resolve()), early)
    monkeypatch.setattr(kernel_ahead, "start_workers", lambda entries, target: None)
    assert kernel_ahead.engine_start(tmp_path, CUDA)[0] is None and cancelled == [1], "another GPU's: cancelled"
    adopted = SimpleNamespace(target=dict(TARGET), cancel=lambda: cancelled.append(2))
    monkeypatch.setitem(kernel_ahead._EARLY, str(tmp_path.resolve()), adopted)
    assert kernel_ahead.engine_start(tmp_path, CUDA)[0] is adopted and cancelled == [1]


def test_early_workers_are_adopted_once(tmp_path, monkeypatch):
    monkeypatch.setenv(kernel_ahead.WORKERS_ENV, "1")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    monkeypatch.delenv("ROSE_KERNEL_CACHE_DIR", raising=False)
    entry = {"module": "rose.no_such_module", "name": "_k", "source_key": "s", "target": TARGET, "spec": "{}"}
    _write(tmp_path / MANIFEST_NAME, [entry])
    early = kernel_ahead.start_early(tmp_path, TARGET)
    assert early is not None and str(tmp_path.resolve()) in kernel_ahead._EARLY
    import torch

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    adopted, _ = kernel_ahead.engine_start(tmp_path, CUDA)
    assert adopted is early and not kernel_ahead._EARLY
    again, _ = kernel_ahead.engine_start(tmp_path, CUDA)
    assert again is not None and again is not early, "adopted once: a later start begins its own"
    for workers in (early, again):
        assert workers.wait(timeout=120)["stale"] == 1  # a module that is not there: counted, never raised


def test_workers_setting(monkeypatch):
    monkeypatch.setenv(kernel_ahead.WORKERS_ENV, "0")
    assert kernel_ahead.start_workers([{"x": 1}], TARGET) is None
    monkeypatch.setenv(kernel_ahead.WORKERS_ENV, "3")
    assert kernel_ahead.workers_for(10) == 3 and kernel_ahead.workers_for(2) == 2
    monkeypatch.setenv(kernel_ahead.WORKERS_ENV, "auto")
    assert kernel_ahead.workers_for(10) == min(8, max(1, (os.cpu_count() or 2) - 1))  # not a number: the default


def test_manifest_places(tmp_path, monkeypatch):
    import rose.spec

    model = tmp_path / "model"
    model.mkdir()
    assert kernel_manifest.manifest_paths(model) == ([], model / MANIFEST_NAME)  # writable: beside the model
    assert kernel_manifest.manifest_paths(model, None) == ([], None)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(rose.spec.os, "access", lambda path, mode: Path(path) != model)  # a read-only model
    own = tmp_path / "cache" / "rose" / "model" / MANIFEST_NAME
    assert kernel_manifest.manifest_paths(model) == ([], own)
    _write(model / MANIFEST_NAME, [])  # shipped with the model (rose build-kernels wrote it)
    _write(own, [])
    assert kernel_manifest.manifest_paths(model) == ([model / MANIFEST_NAME, own], own), "both read"
    explicit = tmp_path / "state" / MANIFEST_NAME
    assert kernel_manifest.manifest_paths(model, str(explicit)) == ([model / MANIFEST_NAME], explicit)
    assert kernel_manifest.manifest_paths(model, "off") == ([], None)


@needs_triton
def test_build_kernels_without_a_gpu_compiles_the_manifest(tmp_path, capsys, monkeypatch):
    import torch

    from rose.cli import main

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: build-kernels warms the engine instead")
    for key in ("TRITON_CACHE_DIR", "ROSE_KERNEL_CACHE_DIR", "FLASHINFER_WORKSPACE_BASE",
                "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"):
        monkeypatch.setenv(key, "")  # --cache-dir sets these: restored after the test
        monkeypatch.delenv(key)
    monkeypatch.setenv(kernel_ahead.WORKERS_ENV, "1")
    _, _, entry = _act_mul_variant()
    _write(tmp_path / MANIFEST_NAME, [entry])
    assert main(["build-kernels", str(tmp_path), "--cache-dir", str(tmp_path / "cache")]) == 0
    assert "1 of 1 Triton variants" in capsys.readouterr().out
    assert any(p.suffix == ".cubin" for p in (tmp_path / "cache" / "triton").rglob("*"))
    assert main(["build-kernels", str(tmp_path), "--backends", "flashinfer-fa2"]) == 1, "named: needs a GPU"


@pytest.mark.parametrize("stdout,target", [("9.0\n9.0\n", TARGET), ("9.0\n8.0\n", None), ("", None), ("N/A\n", None)])
def test_driver_target_names_one_gpu_type(monkeypatch, stdout, target):
    monkeypatch.setattr(kernel_ahead.subprocess, "run", lambda *a, **k: SimpleNamespace(stdout=stdout))
    assert kernel_ahead.driver_target() == target


def test_driver_target_without_a_driver(monkeypatch):
    def absent(*args, **kwargs):
        raise FileNotFoundError("nvidia-smi")

    monkeypatch.setattr(kernel_ahead.subprocess, "run", absent)
    assert kernel_ahead.driver_target() is None


def test_a_starts_own_manifest_wins_over_a_shipped_one_and_is_readable_by_all(tmp_path, monkeypatch):
    monkeypatch.setattr(kernel_manifest, "current_target", lambda: dict(TARGET))
    entry = {"module": "not.imported", "name": "_k", "source_key": "old", "target": TARGET, "spec": "{}"}
    shipped = _write(tmp_path / "shipped.json", [entry])
    own = _write(tmp_path / "own.json", [{**entry, "source_key": "new"}])
    assert [e["source_key"] for e in read_entries([shipped, own])] == ["new"]
    recorder = Recorder()
    _hook_call(recorder, "rose.fake_kernels_a", "a")
    assert recorder.save(tmp_path / "written.json") == 1
    assert (tmp_path / "written.json").stat().st_mode & 0o777 == 0o644


def test_entries_of_kernels_changed_or_gone_are_dropped(tmp_path, monkeypatch):
    import rose.layers.fused  # noqa: F401 - imported: its kernels' current sources are known

    monkeypatch.setattr(kernel_manifest, "current_target", lambda: dict(TARGET))
    base = {"target": TARGET, "spec": "{}"}
    changed = {"module": "rose.layers.fused", "name": "_act_mul_kernel", "source_key": "before an edit", **base}
    gone = {"module": "rose.layers.fused", "name": "_a_kernel_renamed_since", "source_key": "s", **base}
    (tmp_path / "kernels_never_imported_here.py").write_text("")  # a module that exists, not imported: kept
    monkeypatch.syspath_prepend(str(tmp_path))
    unknown = {"module": "kernels_never_imported_here", "name": "_k", "source_key": "s", **base}
    removed = {"module": "rose.a_module_removed_since", "name": "_k", "source_key": "s", **base}  # dropped
    path = _write(tmp_path / MANIFEST_NAME, [changed, gone, unknown, removed])
    recorder = Recorder()
    _hook_call(recorder, "rose.fake_kernels_b", "b")
    assert recorder.save(path) == 2
    assert {e["module"] for e in read_entries([path])} == {"kernels_never_imported_here", "rose.fake_kernels_b"}


def test_compile_workers_follow_the_usable_cpus_not_the_hosts(monkeypatch) -> None:
    from rose import host_cpus, kernel_ahead

    monkeypatch.setattr(kernel_ahead, "usable_cpus", lambda: 4)  # a 4-CPU container on a larger host
    assert kernel_ahead.default_workers() == 3
    assert kernel_ahead.default_workers(tulips=2) == 1
    assert kernel_ahead.default_workers(cpus=64) == 8
    monkeypatch.setattr(host_cpus, "cgroup_cpu_quota", lambda root="/sys/fs/cgroup": 2)
    assert host_cpus.usable_cpus() <= 2
