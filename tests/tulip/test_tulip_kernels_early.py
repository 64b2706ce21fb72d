"""Tulip starts compiling the model's kernel manifest before it imports the engine (rose.kernel_ahead), only for
ROSE with a model folder and a manifest, on a host whose GPUs the driver names; a failure there only logs."""

from __future__ import annotations

import pytest

from rose import kernel_ahead
from tulip import cli
from tulip.config import TulipConfig


H100 = {"backend": "cuda", "arch": 90, "warp_size": 32}


@pytest.fixture
def calls(monkeypatch):
    seen = []
    monkeypatch.setattr(kernel_ahead, "start_early", lambda model, target, manifest: seen.append((model, manifest)))
    monkeypatch.setattr(kernel_ahead, "driver_target", lambda: dict(H100))
    return seen


def test_started_for_a_model_on_a_gpu_host(calls):
    cli.compile_kernels_early(TulipConfig(model="/models/m"))
    cli.compile_kernels_early(TulipConfig(model="/models/m", kernel_manifest="/state/k.json"))
    assert calls == [("/models/m", "auto"), ("/models/m", "/state/k.json")]


@pytest.mark.parametrize("fields", [{"model": ""}, {"device": "cpu"}, {"engine_factory": "my.module:factory"},
                                    {"kernel_manifest": "off"}])
def test_not_started_without_a_model_or_manifest_on_the_cpu_or_for_another_engine(calls, fields):
    cli.compile_kernels_early(TulipConfig(**{"model": "/models/m", **fields}))
    assert calls == []


def test_not_started_when_the_driver_names_no_single_gpu_type(calls, monkeypatch):
    monkeypatch.setattr(kernel_ahead, "driver_target", lambda: None)
    cli.compile_kernels_early(TulipConfig(model="/models/m"))
    assert calls == []


def test_a_failure_only_logs(monkeypatch, caplog):
    monkeypatch.setattr(kernel_ahead, "driver_target", lambda: dict(H100))

    def broken(model, target, manifest):
        raise OSError("no space left")

    monkeypatch.setattr(kernel_ahead, "start_early", broken)
    cli.compile_kernels_early(TulipConfig(model="/models/m"))
    assert "could not start compiling the kernel manifest early" in caplog.text
