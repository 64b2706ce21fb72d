"""A bulk layout's forward as a chain of CUDA graphs, a few decoder layers each (rose.layer_steps replays them).

Stepped eagerly, a layer at 8192 tokens is ~0.55 ms of device time and about as much host time (its ~10
launches, Triton's included): the stream runs dry and bulk stepped alone lost 22-48 % on the H200
(`benchmarks/NOTES.md`, "Bulk stepped layer by layer"). A chain replays the same kernels from graphs: one
launch per `layers_per_graph` layers, the first graph also embedding, the last also pooling.

A chain is keyed by the bucket layout (rose.graphs' buckets; the batch is padded to it) and captured lazily
as whole-model graphs are: a layout's first stepped batch runs eagerly, its next one captures the chain, and
the new chain's rows are checked against the eager run of the same batch before it serves (rose.graph_checks).
A capture that fails or a chain that fails its check is not retried: that layout steps eagerly from then on.

The capturing batch is stepped like any other, so work stepped between two of its steps (an interactive query)
never waits for a whole capture: its eager run (the warm run on the capture's side stream, and the check's
reference) a layer a step, then the chain's graphs captured one a step, then the new chain replayed a graph a
step and checked. Captured in one step under the runner's lock, a chain held a query back ~50-60 ms on the H200
(`benchmarks/NOTES.md`, "Chains captured a step at a time").

The chains share one memory pool, apart from the whole-model graphs'. Inside a chain, graph i+1 may reuse what
graph i freed, and a chain captured later may reuse what an earlier one freed: safe because a chain always
replays in order and only one batch is stepped through chains at a time (`steps` holds a lock for the batch's
whole stepping; a second batch stepped meanwhile, from another thread or interleaved by the same one, runs
eagerly instead). What must not happen is a graph of another pool overwriting a chain's hidden states between
two of its graphs; the whole-model graphs (a query's replay between two layers) have their pool, eager runs
the ordinary allocator. Backends whose plan leaves host-side state (FlashInfer: `host_plan_state`) get no
chains: a query planned between two layers would re-plan the slot the chain reads.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Generator
from dataclasses import dataclass

import torch

from rose.graph_checks import GraphVerificationError, check_replay
from rose.graphs import _count_capture, _end_failed_capture, _host_rows, end_pool_recording, layout_label
from rose.meta import ForwardMeta, HostMeta, MetaLayout

log = logging.getLogger("rose.layer_graphs")


def layer_chunks(num_layers: int, layers_per_graph: int) -> list[int]:
    """How many decoder layers each graph of a chain holds, in order (the last may hold fewer)."""
    if layers_per_graph < 1:
        raise ValueError("layers_per_graph must be at least 1")
    full, rest = divmod(num_layers, layers_per_graph)
    return [layers_per_graph] * full + ([rest] if rest else [])


@dataclass
class _Chain:
    graphs: list[torch.cuda.CUDAGraph]
    static_in: torch.Tensor  # int64 [layout.words] on the device
    static_out: torch.Tensor  # the rows the last graph writes
    meta: ForwardMeta  # views into static_in (graph=True)


class LayerGraphs:
    """Lazily captured chains of per-layer CUDA graphs, one per bulk layout (module docstring)."""

    def __init__(self, runner, layers_per_graph: int = 1, capture_after: int = 1, max_chains: int = 16) -> None:
        self.runner = runner
        self.layers_per_graph = layers_per_graph
        self.chunks = layer_chunks(len(runner.model.layers), layers_per_graph)
        self.capture_after = capture_after  # eager steppings of a layout before its chain is captured
        self.max_chains = max_chains  # each keeps its graphs and its static input and rows
        self.chains: dict[MetaLayout, _Chain] = {}
        self.seen: Counter[MetaLayout] = Counter()
        self.examples: dict[MetaLayout, tuple[int, int, int, int]] = {}  # a real (T, S, P, longest) per layout
        self.eager_only: dict[MetaLayout, str] = {}
        self.refused: set[MetaLayout] = set()  # ... of eager_only, the ones whose chain failed its check
        self.divergence: dict[MetaLayout, float] = {}  # each kept chain's check: its rows against the eager run's
        self.capture_seconds = 0.0
        self.captures = 0
        self.full = 0  # due layouts stepped eagerly because max_chains were held
        self.pool = torch.cuda.graph_pool_handle()  # every chain's (module docstring)
        self._side: torch.cuda.Stream | None = None  # every capture's: the allocator reuses freed blocks per stream
        self._stepping = threading.Lock()  # held while a batch is stepped through chains

    def stats(self) -> dict:
        """Engine.stats' share (rose_<key> in Tulip's metrics)."""
        return {"layer_chains": len(self.chains), "layer_chains_refused": len(self.eager_only),
                "layer_chain_captures": self.captures, "layer_chain_capture_seconds": self.capture_seconds,
                "layer_chains_full": self.full}

    def manifest_rows(self) -> list[list[int]]:
        """[tokens, sequences, rows, longest, sights] of each layout stepped, hottest first (the graph manifest's
        "chains": the next start prewarms them, rose.warmup.prewarm_chains)."""
        return [[*self.examples[lay], n] for lay, n in self.seen.most_common() if n and lay in self.examples]

    def layout_for(self, num_tokens: int, num_seqs: int, num_rows: int, longest: int) -> MetaLayout | None:
        """The bucket layout a stepped batch pads to, or None (stepped eagerly at its exact size): above the
        largest bucket, and for a layout refused before. Past max_chains a new layout is stepped eagerly at its
        bucket layout (`steps`)."""
        layout = self.runner.graphs.layout_for(num_tokens, num_seqs, num_rows, longest)
        return None if layout is None or layout in self.eager_only else layout

    def steps(self, host: HostMeta, staged: torch.Tensor) -> Generator[tuple[torch.Tensor, str] | None, None, None]:
        """The padded batch `host`: yields None after each step but the last, then (the rows on the device, how:
        "layers" for a chain's replay, "layers-capture" when this batch captured it, "eager"). A layout whose
        chain is due is captured a step at a time (module docstring) and its check's replay is the batch's rows;
        should the capture or check fail, the batch's eager run is. A layout not yet due, or a batch stepped while
        another is stepped through chains, runs eagerly at the layout. The chains' lock is let go before the rows
        are yielded (and by the finally of an abandoned stepping), never left to the garbage collector."""
        layout = host.layout
        self.seen[layout] += 1
        if layout not in self.examples:
            self.examples[layout] = host.shape()
        chain = self.chains.get(layout)
        due = chain is None and layout not in self.eager_only and self.seen[layout] > self.capture_after
        if due and len(self.chains) >= self.max_chains:
            self.full += 1
            if self.full == 1:
                log.warning("layer graphs: %d chains held, the most; new bulk layouts are stepped eagerly",
                            self.max_chains)
            due = False
        if not (chain or due) or not self._stepping.acquire(blocking=False):
            yield from eager_layer_steps(self.runner, host, staged)
            return
        try:
            if chain is None:
                result = yield from self._capture_checked(host, staged)
            else:
                for rows in self._replay(chain, host, staged):  # None after each graph but the last: its rows
                    if rows is None:
                        yield None
                result = rows, "layers"
        finally:
            self._stepping.release()
        yield result

    def _replay(self, chain: _Chain, host: HostMeta, staged: torch.Tensor):
        chain.static_in.copy_(staged, non_blocking=True)
        chain.meta.host = host
        self.runner.backend.plan(chain.meta)
        last = len(chain.graphs) - 1
        for i, graph in enumerate(chain.graphs):
            graph.replay()
            yield chain.static_out if i == last else None

    def _capture_checked(self, host: HostMeta, staged: torch.Tensor):
        """Step `host` through its layout's eager run, the chain's capture and the new chain's replay, yielding
        None between steps; returns (rows, "layers-capture") when the chain is kept, else (the eager rows,
        "eager") with the layout refused (logged once; eager from now on)."""
        layout, reference, chain = host.layout, None, None
        try:
            for step in self._on_side(eager_layer_steps(self.runner, host, staged)):
                if step is None:
                    yield None
                else:
                    reference = step[0]
            chain = yield from self._capture(host, staged)
            try:
                for rows in self._replay(chain, host, staged):
                    if rows is None:
                        yield None
                worst = check_replay(f"layers {layout_label(layout)}", _host_rows(rows, host),
                                     _host_rows(reference, host), getattr(self.runner.graphs, "scores", False))
            except BaseException:  # the chain is dropped (refused, or the stepping abandoned)
                if not self.chains:  # it was the pool's only user: a pool nobody uses may not be captured into again
                    self.pool = self._fresh_pool()
                raise
        except Exception as exc:  # this layout steps eagerly from now on
            if isinstance(exc, GraphVerificationError):
                self.refused.add(layout)
            self.eager_only[layout] = f"{type(exc).__name__}: {exc}"
            log.warning("layer graphs %s: %s; this layout is stepped eagerly from now on", layout_label(layout),
                        self.eager_only[layout], exc_info=exc)
            if reference is not None:
                if reference.is_cuda:  # made on the side stream, copied back on this one
                    reference.record_stream(torch.cuda.current_stream(self.runner.device))
                return reference, "eager"
            for step in eager_layer_steps(self.runner, host, staged):  # the eager run itself failed: once more
                if step is None:
                    yield None
                else:
                    return step
        self.chains[layout], self.divergence[layout] = chain, worst
        self.captures += 1
        return rows, "layers-capture"

    @staticmethod
    def _fresh_pool():
        return torch.cuda.graph_pool_handle()

    def _side_stream(self) -> torch.cuda.Stream:
        if self._side is None:
            self._side = torch.cuda.Stream(self.runner.device)
        return self._side

    def _on_side(self, steps):
        """`steps`' work enqueued on the capture's side stream, in the main stream's order: the side waits for what
        the main stream has before each step, the main stream for the step after it (a query stepped between two
        steps runs after the one before, as on one stream). Its eager run warms the side stream for the capture
        (cuBLAS's workspace and the allocator's blocks are per stream), as torch.cuda.graph asks."""
        stream, side = torch.cuda.current_stream(self.runner.device), self._side_stream()
        while True:
            side.wait_stream(stream)
            with torch.cuda.stream(side):
                step = next(steps, _END)
            stream.wait_stream(side)
            if step is _END:
                return
            yield step

    def _capture(self, host: HostMeta, staged: torch.Tensor):
        """The chain's graphs captured on the side stream, one a step (yields None after each). A failed capture
        leaves the pool to the graphs already captured and gives later chains a fresh one."""
        start, runner, layout = time.perf_counter(), self.runner, host.layout
        stream, side = torch.cuda.current_stream(runner.device), self._side_stream()
        static_in = torch.zeros(layout.words, dtype=torch.int64, device=runner.device)
        static_in.copy_(staged, non_blocking=True)
        meta = ForwardMeta.from_buffer(static_in, layout, layout.seqlen_bound, host, graph=True)
        runner.backend.plan(meta)
        hidden = runner.model.forward_layers(meta, runner.backend)
        graphs, out = [], None
        try:
            for i, count in enumerate(self.chunks):
                side.wait_stream(stream)
                with torch.cuda.stream(side):
                    graph = torch.cuda.CUDAGraph()
                    _count_capture(1)
                    try:
                        graph.capture_begin(pool=self.pool, capture_error_mode="thread_local")
                        try:
                            for _ in range(count):
                                h = next(hidden)
                            if i == len(self.chunks) - 1:
                                out = runner.pooled_rows(h, meta)
                        except BaseException:
                            _end_failed_capture(graph)
                            raise
                        graph.capture_end()
                    finally:
                        _count_capture(-1)
                graphs.append(graph)
                stream.wait_stream(side)
                self.capture_seconds += time.perf_counter() - start
                start = None  # not capturing while the other steps run
                yield None
                start = time.perf_counter()
        except BaseException:
            if start is not None:
                self.capture_seconds += time.perf_counter() - start
            torch.cuda.set_stream(stream)
            end_pool_recording(runner.device, self.pool)
            self.pool = self._fresh_pool()  # later chains: a fresh pool (captured ones keep theirs)
            raise
        finally:
            hidden.close()
        return _Chain(graphs, static_in, out, meta)


_END = object()


def eager_layer_steps(runner, host: HostMeta, staged: torch.Tensor) -> Generator[tuple[torch.Tensor, str] | None, None,
                                                                                  None]:
    """`host` eagerly at its layout, one decoder layer per step: yields None after each layer but the last,
    then (the pooled rows, "eager"). A backend whose plan leaves state for the eager forwards after it (FlashInfer's one
    eager slot: `host_plan_state`) is planned again before each layer, since a batch stepped between two
    layers may have planned it for itself (each step runs under the runner's lock)."""
    meta = runner.eager_meta(host, staged)
    replan = bool(getattr(runner.backend, "host_plan_state", False))
    runner.backend.plan(meta)
    hidden = runner.model.forward_layers(meta, runner.backend)
    last = len(runner.model.layers) - 1
    for i in range(last + 1):
        if i and replan:
            runner.backend.plan(meta)
        h = next(hidden)
        if i == last:
            yield runner.pooled_rows(h, meta), "eager"
            return
        yield None

