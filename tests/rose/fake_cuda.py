"""Stand-ins for the torch.cuda calls rose.graphs makes, so lazy capture, replay and their failure paths run
on a CPU, through the real CudaGraphs and ModelRunner.step.

`FakeCuda.install(monkeypatch)` patches torch.cuda.{graph_pool_handle, Stream, current_stream, stream,
set_stream, CUDAGraph, graph, synchronize}. A fake capture (CUDAGraph.capture_begin .. capture_end, or the
torch.cuda.graph context) runs the forward eagerly (what a real capture records) and remembers how to recompute
its output in place from the same static inputs: that is what `replay()` does. Knobs: `fail` (raised when the
capture ends, as capture_end raises for an invalidated capture), `corrupt` (replays write a wrong but finite
result). `captures` keeps each capture's keyword arguments.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext

import torch


class FakeStream:
    def __init__(self, device=None, priority=0):
        self.device, self.priority = device, priority

    def wait_stream(self, other):
        pass


class FakeGraph:
    def __init__(self, cuda: FakeCuda | None = None):
        self.cuda = cuda
        self.recompute = None
        self.replays = 0

    def capture_begin(self, pool=None, capture_error_mode="global"):
        self.cuda.begin(self, {"pool": pool, "capture_error_mode": capture_error_mode})

    def capture_end(self):
        self.cuda.end()

    def replay(self):
        self.replays += 1
        self.recompute()


class FakeCuda:
    def __init__(self):
        self.captures: list[dict] = []
        self.fail: BaseException | None = None
        self.corrupt = False
        self.capturing: FakeGraph | None = None

    def install(self, monkeypatch) -> FakeCuda:
        for name, value in (("graph_pool_handle", lambda: ("fake-pool", 0)), ("Stream", FakeStream),
                            ("current_stream", lambda device=None: FakeStream(device)),
                            ("stream", lambda stream: nullcontext()), ("set_stream", lambda stream: None),
                            ("CUDAGraph", lambda: FakeGraph(self)), ("graph", self.graph),
                            ("synchronize", lambda device=None: None)):
            monkeypatch.setattr(torch.cuda, name, value)
        return self

    def wrap(self, forward):
        """The forward a CudaGraphs gets: records itself into the graph being captured."""
        def captured_forward(meta):
            out = forward(meta)
            graph = self.capturing
            if graph is not None:
                def recompute():
                    fresh = forward(meta)
                    out.copy_(fresh.flip(-1) if self.corrupt else fresh)

                graph.recompute = recompute
            return out

        return captured_forward

    def begin(self, cuda_graph, kwargs: dict) -> None:
        self.captures.append(kwargs)
        self.capturing = cuda_graph

    def end(self) -> None:
        self.capturing = None
        if self.fail is not None:
            raise self.fail

    @contextmanager
    def graph(self, cuda_graph, pool=None, stream=None, capture_error_mode="global", **kwargs):
        self.begin(cuda_graph, {"pool": pool, "stream": stream, "capture_error_mode": capture_error_mode, **kwargs})
        try:
            yield
        finally:
            self.end()


def attach_graphs(runner, monkeypatch, **kwargs):
    """Give a CPU runner fake-CUDA graphs (restored by monkeypatch); returns the FakeCuda."""
    from rose.graphs import CudaGraphs

    fake = FakeCuda().install(monkeypatch)
    graphs = CudaGraphs(fake.wrap(runner.forward), runner.backend.plan, runner.eager, runner.device, **kwargs)
    graphs.scores = getattr(runner, "score_head", None) is not None  # as attach_score_head sets it (by difference)
    monkeypatch.setattr(runner, "graphs", graphs)
    return fake


def attach_express(runner, monkeypatch, fake: FakeCuda, max_tokens: int):
    """Give a CPU runner with fake graphs (attach_graphs) an express lane built by ExpressLane.build, its graphs'
    forward recorded by `fake` as attach_graphs records the main graphs'; returns the lane."""
    import rose.express
    from rose.graphs import CudaGraphs

    monkeypatch.setattr(rose.express, "CudaGraphs", lambda forward, *a, **k: CudaGraphs(fake.wrap(forward), *a, **k))
    lane = rose.express.ExpressLane.build(runner, max_tokens)
    monkeypatch.setattr(runner, "express", lane)
    return lane
