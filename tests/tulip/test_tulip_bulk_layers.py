"""RELIABILITY 43: bulk stepped layer by layer with interactive batches between its layers (TULIP_BULK_LAYERS_AHEAD,
tulip/express.py): the main worker steps batches that carry bulk work through engine.step_layered, the express
worker steps interactive ones on the main lane (not the express lane) while that stepping is under way, and the
rows are the engine's own. A gated fake engine for the wiring, the tiny Qwen3 on a CPU for the rows, and on a
GPU the same through per-layer CUDA graphs."""

import dataclasses
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from tulip.scheduler import BULK, INTERACTIVE
from test_tulip_lanes import lane_request
from tulip_testkit import FakeEngine, ServerThread, decode_response, encode_request, make_config, wait_until


class LayeredFakeEngine(FakeEngine):
    """step_layered holds the launcher (the bulk's layers still being enqueued) until `layers_done` is set."""

    layer_steps = 4

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.layered: list = []
        self.layers_done = threading.Event()

    def step_layered(self, batch, ahead: int):
        self.layered.append((batch, ahead))
        assert self.layers_done.wait(30)
        return self.step(batch)


def test_a_query_runs_on_the_main_lane_while_bulk_is_stepped_by_layers() -> None:
    engine = LayeredFakeEngine(express=True)
    config = make_config(max_batch_tokens=64, express_batch_tokens=32, bulk_layers_ahead=2, pack_ahead_ms=0)
    with ServerThread(config, engine) as s:
        wait_until(lambda: s.server.queue.express_tokens == 32, what="interactive batches between layers on")
        assert s.server.worker.layers_ahead == 2 and not s.server.express.express_lane
        bulk = s.stub.Embed.future(lane_request(100, 60, BULK), timeout=60)
        wait_until(lambda: len(engine.layered) == 1, what="the bulk batch stepped by layers")
        query = s.stub.Embed(lane_request(7, 12, INTERACTIVE), timeout=10)  # while bulk's layers are enqueued
        assert query.rows == 1 and not bulk.done()
        assert engine.express_batches == [] and int(engine.batches[-1].token_ids[0]) == 7
        assert engine.layered[0][1] == 2
        engine.layers_done.set()
        assert bulk.result().rows == 1
        wait_until(lambda: s.server.worker.inflight == 0, what="bulk delivered")
        alone = s.stub.Embed(lane_request(8, 12, INTERACTIVE), timeout=10)  # no bulk about: a whole step
        assert alone.rows == 1 and len(engine.layered) == 1


def test_layered_off_or_unsupported_keeps_the_express_lane() -> None:
    with ServerThread(make_config(express_batch_tokens=32), LayeredFakeEngine(express=True)) as s:
        assert s.server.worker.layers_ahead == 2 and not s.server.express.express_lane  # the default
    for config, engine in ((make_config(express_batch_tokens=32, bulk_layers_ahead=0), LayeredFakeEngine(express=True)),
                           (make_config(express_batch_tokens=32), FakeEngine(express=True))):
        with ServerThread(config, engine) as s:
            assert s.server.worker.layers_ahead == 0 and s.server.express.express_lane
    with ServerThread(make_config(express_batch_tokens=0, bulk_layers_ahead=2), LayeredFakeEngine()) as s:
        assert s.server.worker.layers_ahead == 0 and s.server.express is None
    with pytest.raises(ValueError, match="bulk_layers_ahead"):
        make_config(bulk_layers_ahead=-1)


def _tiny_qwen3(tmp_path):
    sys.path.insert(0, str(Path(__file__).parents[1] / "rose"))
    from rose_tiny_models import build_qwen3

    return build_qwen3(tmp_path)


def _bulk_and_queries(engine, device: str, rounds: int = 2) -> dict:
    """The engine's stats at the end, read before the server closes it."""
    rng = np.random.default_rng(5)
    docs = [[int(t) for t in rng.integers(1, 200, size=n)] for n in (100, 90, 110, 80)]
    queries = [[int(t) for t in rng.integers(1, 200, size=12)] for _ in range(3)]
    want_docs, want_queries = engine.embed(docs), engine.embed(queries)
    config = make_config(device=device, max_batch_tokens=256, express_batch_tokens=64, bulk_layers_ahead=1)
    layered, step_layered = [], engine.step_layered
    engine.step_layered = lambda batch, ahead: layered.append(batch.num_tokens) or step_layered(batch, ahead)
    with ServerThread(config, engine) as s:
        assert s.server.worker.layers_ahead == 1
        for _ in range(rounds):
            bulk = [s.stub.Embed.future(_lane(encode_request([d]), BULK), timeout=120) for d in docs]
            got_q = [decode_response(s.stub.Embed(_lane(encode_request([q]), INTERACTIVE), timeout=120))
                     for q in queries]
            got_d = [decode_response(f.result()) for f in bulk]
            np.testing.assert_allclose(np.vstack(got_q), want_queries, rtol=2e-3, atol=2e-3)
            np.testing.assert_allclose(np.vstack(got_d), want_docs, rtol=2e-3, atol=2e-3)
        stats = engine.stats()
    assert sum(layered) >= rounds * sum(map(len, docs)), "every bulk document went through the layered stepping"
    return stats


def _lane(req, lane: int):
    req.lane = lane
    return req


def test_on_a_cpu_bulk_by_layers_and_queries_between_answer_as_the_engine_does(tmp_path) -> None:
    from rose.engine import Engine

    engine = Engine.from_pretrained(_tiny_qwen3(tmp_path).path, device="cpu")
    assert engine.layer_steps == 2  # the tiny model's two layers
    _bulk_and_queries(engine, "cpu")


@pytest.mark.gpu
def test_on_the_gpu_bulk_by_layer_graphs_and_queries_between_answer_as_the_engine_does(tmp_path) -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from rose.engine import Engine

    engine = Engine.from_pretrained(_tiny_qwen3(tmp_path).path, device="cuda", prewarm=((16, 1),),
                                    graph_manifest=None)
    engine.warmup()
    stats = _bulk_and_queries(engine, "cuda", rounds=4)  # a layout's second stepping captures its chain
    assert stats["layer_chains"] >= 1 and not stats["layer_chains_refused"], stats


def test_a_bulk_batch_stepped_by_layers_never_runs_on_the_event_loop() -> None:
    """The inline launch (TULIP_INLINE_LAUNCH) takes a lone request's batch on the event loop when it replays a
    graph; a batch stepped by layers would hold the loop for the whole batch, so it goes to the launcher."""
    engine = LayeredFakeEngine(replays_when=lambda batch: True)
    engine.layers_done.set()
    config = make_config(max_batch_tokens=64, express_batch_tokens=32, pack_ahead_ms=0, inline_launch=True)
    with ServerThread(config, engine) as s:
        assert s.server.worker.inline
        for marker in (100, 101, 102):  # sequential: each alone, nothing in flight
            assert s.stub.Embed(lane_request(marker, 40, BULK), timeout=10).rows == 1
        assert s.stub.Embed(lane_request(7, 12, INTERACTIVE), timeout=10).rows == 1
    assert len(engine.layered) == 3
    threads = engine.step_threads
    assert all(name != "test-tulip-loop" for name in threads[:3]), threads
    assert threads[3] == "test-tulip-loop", threads  # an interactive lone request still launches inline


def test_the_engine_prewarms_layer_chains_only_where_bulk_is_stepped_by_layers(monkeypatch) -> None:
    """tulip.engine_loader.build_engine asks ROSE's warmup for the manifest's layer chains (Engine.prewarm_layer_chains)
    when Tulip steps bulk by layers (lanes on, the express budget set, TULIP_BULK_LAYERS_AHEAD > 0), not otherwise."""
    import rose
    from tulip.config import TulipConfig
    from tulip.engine_loader import build_engine

    seen = []

    class Loaded:
        prewarm_layer_chains = False

        def warmup(self):
            seen.append(self.prewarm_layer_chains)

    monkeypatch.setattr(rose.Engine, "from_pretrained", staticmethod(lambda *a, **k: Loaded()))
    base = TulipConfig(device="cpu")
    assert base.lanes and base.express_batch_tokens and base.bulk_layers_ahead > 0  # the defaults step by layers
    for config, want in ((base, True), (dataclasses.replace(base, bulk_layers_ahead=0), False),
                         (dataclasses.replace(base, lanes=False), False)):
        build_engine(config)
        assert seen[-1] is want, config


def test_express_batches_never_exceed_the_token_budget() -> None:
    """express_batch_tokens above max_batch_tokens (the default 1024 beside a 512 budget) is held to the budget:
    the engine's buckets and memory are sized by max_batch_tokens, express batches included."""
    with ServerThread(make_config(max_batch_tokens=48, express_batch_tokens=1024), FakeEngine(express=True)) as s:
        wait_until(lambda: s.server.queue.express_tokens, what="express on")
        assert s.server.express.express_tokens == 48 and s.server.queue.express_tokens == 48
