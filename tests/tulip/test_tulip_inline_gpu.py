"""Tulip's inline launch with the real ROSE engine on a GPU: a lone request whose layout is captured is
stepped on the event loop (a graph replay), one whose layout is not goes to the launcher, and both answer
what the engine answers alone.

    pytest -m gpu tests/tulip/test_tulip_inline_gpu.py
"""

import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_captured_layouts_launch_on_the_loop_and_answer_as_the_engine_does(tmp_path):
    sys.path.insert(0, str(Path(__file__).parents[1] / "rose"))
    from rose_tiny_models import build_qwen3
    from tulip_testkit import ServerThread, decode_response, encode_request, make_config

    from rose import Batch
    from rose.engine import Engine

    tiny = build_qwen3(tmp_path)
    engine = Engine.from_pretrained(tiny.path, device="cuda", prewarm=((64, 1),), graph_manifest=None)
    engine.warmup()  # captures and verifies the (64, 1) layout: a lone sequence of up to 64 tokens replays
    rng = np.random.default_rng(3)
    short = [int(t) for t in rng.integers(1, 200, size=64)]  # exactly the prewarmed key
    pair = [[int(t) for t in rng.integers(1, 200, size=n)] for n in (90, 70)]  # a layout never captured
    want_short, want_pair = engine.embed([short]), engine.embed(pair)
    config = make_config(device="cuda", max_batch_tokens=512, max_batch_seqs=8, express_batch_tokens=0)
    with ServerThread(config, engine) as s:
        worker = s.server.worker
        assert engine.replays(Batch.from_sequences([np.asarray(short, dtype=np.int32)], engine.spec.pooling))
        assert worker.inline
        for _ in range(3):
            got = decode_response(s.stub.Embed(encode_request([short]), timeout=60))
            assert cosine(got, want_short).min() > 0.999
        assert worker.inline_launches == 3
        got = decode_response(s.stub.Embed(encode_request(pair), timeout=60))
        assert cosine(got, want_pair).min() > 0.999
        assert worker.inline_launches == 3  # eager warm-up of a new layout: on the launcher, not the loop


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
