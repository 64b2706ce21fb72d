"""Stand-ins for the torch.cuda calls rose.graphs makes, so lazy capture, replay and their failure paths run
on a CPU, through the real CudaGraphs and ModelRunner.step.

`FakeCuda.install(monkeypatch)` patches torch.cuda.{graph_pool_handle, Stream, current_stream, stream,
set_stream, CUDAGraph, graph, synchronize}. A fake capture runs the forward eagerly (what a real capture
records) and remembers how to recompute its output in place from the same static inputs: that is what
`replay()` does. Knobs: `fail` (raised when the capture ends, as capture_end raises for an invalidated
capture), `corrupt` (replays write a wrong but finite result). `captures` keeps each torch.cuda.graph call's
keyword arguments.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext

import torch


class FakeStream:
    def __init__(self, device=None):
        self.device = device

    def wait_stream(self, other):
        pass


class FakeGraph:
    def __init__(self):
        self.recompute = None
        self.replays = 0

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
                            ("CUDAGraph", FakeGraph), ("graph", self.graph),
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

    @contextmanager
    def graph(self, cuda_graph, pool=None, stream=None, capture_error_mode="global", **kwargs):
        self.captures.append({"pool": pool, "stream": stream, "capture_error_mode": capture_error_mode, **kwargs})
        self.capturing = cuda_graph
        try:
            yield
        finally:
            self.capturing = None
        if self.fail is not None:
            raise self.fail


def attach_graphs(runner, monkeypatch, **kwargs):
    """Give a CPU runner fake-CUDA graphs (restored by monkeypatch); returns the FakeCuda."""
    from rose.graphs import CudaGraphs

    fake = FakeCuda().install(monkeypatch)
    graphs = CudaGraphs(fake.wrap(runner.forward), runner.backend.plan, runner.eager, runner.device, **kwargs)
    monkeypatch.setattr(runner, "graphs", graphs)
    return fake
