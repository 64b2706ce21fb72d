"""ROSE's Triton kernels compiled ahead from a kernel manifest (rose.kernel_ahead), without a GPU.

The manifest entry is what Triton's post-compile hook hands the recorder on a GPU (its specialization record,
built here the way Triton's JIT builds it); a worker process compiles it into TRITON_CACHE_DIR, and the JIT's own
compile call for that variant then finds it there (adds no file). Stale, broken and foreign entries, the
recorder's merge and the build-kernels command without a GPU as an image build runs it.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from rose import kernel_ahead

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs Triton")
TARGET = {"backend": "cuda", "arch": 90, "warp_size": 32}


def _act_mul_variant():
    """_act_mul_kernel's variant for bf16 pointers and 16-divisible ints, as the JIT would compile it:
    (the JIT's ASTSource arguments, its options, the manifest entry)."""
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
    spec = serialize_specialization_data(fn.fn.__qualname__, signature, constexprs, attrs, options, "key")
    entry = {"module": "rose.layers.fused", "name": "_act_mul_kernel", "source_key": fn.cache_key, "spec": spec}
    return (fn, signature, constexprs, attrs), options, entry


def _write(path: Path, entries, target=TARGET) -> Path:
    path.write_text(json.dumps({"target": target, "kernels": entries}))
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
    ahead = kernel_ahead.start(_write(tmp_path / "rose_kernels.json", [entry]), workers=1)
    report = ahead.wait(timeout=240)
    assert (report["compiled"], report["stale"], report["failed"], report["workers"]) == (1, 0, 0, 1)
    assert not any(Path(name).exists() for name in ahead.shares), "the workers' shares are removed"
    assert kernel_ahead.in_cache(entry, TARGET)
    assert kernel_ahead.start(tmp_path / "rose_kernels.json", workers=1) is None, "all cached: no worker"
    before = _cache_files(cache)
    assert any(name.endswith(".cubin") for name in before)
    # the JIT's own call for this variant (triton.runtime.jit's _do_compile): served from the cache
    triton.compile(triton.compiler.ASTSource(*source), target=GPUTarget("cuda", 90, 32), options=options.__dict__)
    assert _cache_files(cache) == before


@needs_triton
def test_stale_broken_and_foreign_entries_never_raise(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    _, _, entry = _act_mul_variant()
    stale = {**entry, "source_key": "the kernel's source before an edit"}
    missing = {**entry, "module": "rose.no_such_module"}
    broken = {**entry, "spec": "{not json"}
    counts = kernel_ahead.compile_entries(TARGET, [stale, missing, broken])
    assert counts == {"compiled": 0, "stale": 1, "failed": 2}
    assert not (tmp_path / "triton").exists() or not _cache_files(tmp_path / "triton")


def _hook_call(recorder, module: str, spec: str) -> None:
    fn = SimpleNamespace(module=module, name="_k", jit_function=SimpleNamespace(cache_key="src"))
    recorder._hook(fn=fn, compile={"specialization_data": spec}, key="k", repr="r", is_manual_warmup=False,
                   already_compiled=False)


def test_recorder_keeps_roses_kernels_and_merges_with_the_manifest(tmp_path, monkeypatch):
    monkeypatch.setattr(kernel_ahead, "current_target", lambda: dict(TARGET))
    path = tmp_path / "rose_kernels.json"
    first = kernel_ahead.Recorder()
    assert first.save(path) == 0 and not path.exists(), "nothing recorded: nothing written"
    _hook_call(first, "rose.layers.fused", "a")
    _hook_call(first, "rose.layers.fused", "a")  # the same variant again (another process, the cache)
    _hook_call(first, "someone.elses.kernels", "x")
    assert first.save(path) == 1
    second = kernel_ahead.Recorder()
    _hook_call(second, "rose.layers.fused", "a")
    _hook_call(second, "rose.attention.triton_varlen", "b")
    assert second.save(path) == 2
    manifest = kernel_ahead.load(path)
    assert manifest.target == TARGET and [e["spec"] for e in manifest.entries] == ["a", "b"]
    other_gpu = kernel_ahead.Recorder()
    monkeypatch.setattr(kernel_ahead, "current_target", lambda: {**TARGET, "arch": 100})
    _hook_call(other_gpu, "rose.layers.fused", "c")
    assert other_gpu.save(path) == 1, "another GPU's manifest replaces this one's"


def test_recorder_chains_a_hook_installed_before_it(monkeypatch):
    monkeypatch.setattr(kernel_ahead, "current_target", lambda: dict(TARGET))
    calls = []
    recorder = kernel_ahead.Recorder()
    recorder._previous = lambda **kw: calls.append(kw["fn"].module)
    _hook_call(recorder, "rose.layers.fused", "a")
    assert calls == ["rose.layers.fused"]


def test_no_manifest_or_no_workers_starts_nothing(tmp_path, monkeypatch):
    assert kernel_ahead.start(tmp_path / "absent.json") is None
    (tmp_path / "bad.json").write_text("{")
    assert kernel_ahead.start(tmp_path / "bad.json") is None  # a warning, never an error
    path = _write(tmp_path / "rose_kernels.json", [{"module": "rose.x", "name": "k", "source_key": "", "spec": ""}])
    monkeypatch.setenv(kernel_ahead.WORKERS_ENV, "0")
    assert kernel_ahead.start(path) is None
    monkeypatch.setenv(kernel_ahead.WORKERS_ENV, "3")
    assert kernel_ahead.workers_for(10) == 3 and kernel_ahead.workers_for(2) == 2


def test_manifest_read_beside_the_model_when_shipped_there(tmp_path, monkeypatch):
    import rose.spec

    model = tmp_path / "model"
    model.mkdir()
    read, write = kernel_ahead.manifest_paths(model)
    assert read == write == model / kernel_ahead.MANIFEST_NAME  # writable: beside the model
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(rose.spec.os, "access", lambda path, mode: Path(path) != model)  # a read-only model
    read, write = kernel_ahead.manifest_paths(model)
    assert write == tmp_path / "cache" / "rose" / "model" / kernel_ahead.MANIFEST_NAME and read == write
    _write(model / kernel_ahead.MANIFEST_NAME, [])  # shipped with the model (rose build-kernels wrote it)
    assert kernel_ahead.manifest_paths(model) == (model / kernel_ahead.MANIFEST_NAME, write)


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
    _write(tmp_path / kernel_ahead.MANIFEST_NAME, [entry])
    assert main(["build-kernels", str(tmp_path), "--cache-dir", str(tmp_path / "cache")]) == 0
    assert "1 Triton variants" in capsys.readouterr().out
    assert any(p.suffix == ".cubin" for p in (tmp_path / "cache" / "triton").rglob("*"))


@needs_triton
def test_the_cache_lookup_imports_no_kernel_module_and_no_torch(tmp_path):
    import subprocess
    import sys

    _, _, entry = _act_mul_variant()
    code = ("import json, sys; from rose import kernel_ahead; "
            f"print(kernel_ahead.in_cache(json.loads({json.dumps(json.dumps(entry))}), {TARGET!r}), "
            "'torch' in sys.modules, 'rose.layers.fused' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "TRITON_CACHE_DIR": str(tmp_path)})
    assert out.stdout.split() == ["False", "False", "False"], out.stderr[-2000:]


def test_workers_started_early_are_adopted_once(tmp_path, monkeypatch):
    monkeypatch.setenv(kernel_ahead.WORKERS_ENV, "1")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    monkeypatch.delenv("ROSE_KERNEL_CACHE_DIR", raising=False)
    path = _write(tmp_path / kernel_ahead.MANIFEST_NAME,
                  [{"module": "rose.no_such_module", "name": "_k", "source_key": "s", "spec": "{}"}])
    early = kernel_ahead.start_early(tmp_path)
    assert early is not None and kernel_ahead.start(path) is early, "the engine adopts the early workers"
    again = kernel_ahead.start(path)
    assert again is not None and again is not early, "adopted once: a later start begins its own"
    for ahead in (early, again):
        assert ahead.wait(timeout=120)["failed"] == 1  # a module that is not there: reported, never raised
