"""On the GPU: the kernel manifest a tiny Qwen3's warm-up records, compiled by worker processes into an empty
Triton cache, is what a fresh process's warm-up then loads: the real hook, workers and JIT, end to end (each start
in a process of its own, as a replica's; rose.kernel_ahead)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

START = """
import json, os, sys
from pathlib import Path
from rose.engine import Engine
root = Path(os.environ["TRITON_CACHE_DIR"])
cubins = lambda: sum(1 for _ in root.rglob("*.cubin"))
engine = Engine.from_pretrained(sys.argv[1], device="cuda", prewarm=((32, 1), (96, 3)), graph_manifest=None,
                                kernel_manifest=sys.argv[2])
ahead = engine.wait_for_kernels() or {}
before = cubins()
engine.warmup()
print(json.dumps({"ahead": ahead, "compiled_in_warmup": cubins() - before}))
engine.close()
"""


def _start(folder, manifest, cache, **env) -> dict:
    out = subprocess.run([sys.executable, "-c", START, str(folder), str(manifest)], capture_output=True, text=True,
                         timeout=300, check=False, env={**os.environ, "TRITON_CACHE_DIR": str(cache), **env})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_variants_compiled_ahead_are_loaded_by_the_next_start(tiny_models, tmp_path):
    folder, manifest = tiny_models["qwen3"].path, tmp_path / "rose_kernels.json"
    first = _start(folder, manifest, tmp_path / "first", ROSE_KERNEL_COMPILE_WORKERS="0")
    assert first["compiled_in_warmup"] > 0 and not first["ahead"]  # an empty cache, nothing ahead: compiled here
    major, minor = torch.cuda.get_device_capability()
    recorded = json.loads(manifest.read_text())["kernels"]
    assert recorded and all(e["target"]["arch"] == major * 10 + minor for e in recorded)
    second = _start(folder, manifest, tmp_path / "second")  # an empty cache again, the manifest there
    assert second["ahead"]["failed"] == 0 and second["ahead"]["compiled"] >= len(recorded)
    assert second["compiled_in_warmup"] == 0, "the warm-up compiled a variant the workers had compiled"


def test_the_persistent_decoder_is_recorded_and_compiled_ahead(tiny_root, tmp_path):
    """The persistent decoder (on by default for the 0.6B's layer shape) compiles in the engine's warm-up, after the
    recorder is installed: the manifest lists its kernel, and the next start with an empty cache compiles it in the
    workers, not in its warm-up."""
    from rose_tiny_models import build_qwen3_06b_shape

    folder, manifest = build_qwen3_06b_shape(tiny_root, bidirectional=True).path, tmp_path / "rose_kernels.json"
    env = {"ROSE_PERSISTENT_DECODER": "auto"}
    _start(folder, manifest, tmp_path / "first", ROSE_KERNEL_COMPILE_WORKERS="0", **env)
    names = [e["name"] for e in json.loads(manifest.read_text())["kernels"]]
    assert "decoder_kernel" in names, names
    second = _start(folder, manifest, tmp_path / "second", **env)
    assert second["ahead"]["failed"] == 0
    assert second["compiled_in_warmup"] == 0, "the warm-up compiled a variant the workers had compiled"
