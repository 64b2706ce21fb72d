"""Tulip starts compiling the model's kernel manifest before it imports the engine (rose.kernel_ahead), only for
ROSE with a model folder on a host with an NVIDIA GPU, and a failure there only logs."""

from __future__ import annotations

import pytest

from rose import kernel_ahead
from tulip import cli
from tulip.config import TulipConfig


@pytest.fixture
def calls(monkeypatch):
    seen = []
    monkeypatch.setattr(kernel_ahead, "start_early", lambda model: seen.append(model))
    monkeypatch.setattr(cli.os.path, "exists", lambda path: path == "/dev/nvidiactl")
    return seen


def test_started_for_a_model_on_a_gpu_host(calls):
    cli.compile_kernels_early(TulipConfig(model="/models/m"))
    assert calls == ["/models/m"]


@pytest.mark.parametrize("fields", [{}, {"device": "cpu"}, {"engine_factory": "my.module:factory"}])
def test_not_started_without_a_model_on_the_cpu_or_for_another_engine(calls, fields):
    cli.compile_kernels_early(TulipConfig(**{"model": "/models/m", **fields} if fields else {}))
    assert calls == []


def test_not_started_without_an_nvidia_device(calls, monkeypatch):
    monkeypatch.setattr(cli.os.path, "exists", lambda path: False)
    cli.compile_kernels_early(TulipConfig(model="/models/m"))
    assert calls == []


def test_a_failure_only_logs(monkeypatch, caplog):
    monkeypatch.setattr(cli.os.path, "exists", lambda path: True)

    def broken(model):
        raise OSError("no space left")

    monkeypatch.setattr(kernel_ahead, "start_early", broken)
    cli.compile_kernels_early(TulipConfig(model="/models/m"))
    assert "could not start compiling the kernel manifest early" in caplog.text
