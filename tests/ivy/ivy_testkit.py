"""Helpers for Ivy's tests: a gateway app in front of fake Tulip replicas, and model-folder copies."""

from __future__ import annotations

import json
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from starlette.testclient import TestClient

from ivy.app import create_app
from ivy.config import IvyConfig
from rose.spec import bundled_model_dir

MODEL = "sentence-transformers/all-MiniLM-L6-v2"


@contextmanager
def gateway(*fakes, **overrides) -> Iterator[TestClient]:
    """The gateway app in front of `fakes` (anything with an .address; fast health probes), lifespan running."""
    options = dict(replicas=tuple(f.address for f in fakes), health_interval_s=0.1)
    options.update(overrides)
    with TestClient(create_app(IvyConfig(**options)), raise_server_exceptions=False) as client:
        yield client


def model_copy(tmp_path: Path, name: str, *, config: dict | None = None, st_config: dict | None = None) -> Path:
    """A model folder like the bundled one (weights left out) with config.json / prompts overridden."""
    src = bundled_model_dir()
    dst = tmp_path / name
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("model.safetensors", "*.bin", "onnx", "openvino"))
    if config is not None:
        base = json.loads((src / "config.json").read_text())
        base.update(config)
        (dst / "config.json").write_text(json.dumps(base))
    if st_config is not None:
        (dst / "config_sentence_transformers.json").write_text(json.dumps(st_config))
    return dst
