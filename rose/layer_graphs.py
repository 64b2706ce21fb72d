"""A bulk layout's forward as a chain of CUDA graphs, a few decoder layers each (rose.layer_steps replays them).

Stepped eagerly, a layer at 8192 tokens is ~0.55 ms of device time and about as much host time (its ~10
launches, Triton's included): the stream runs dry and bulk stepped alone lost 22-48 % on the H200
(`benchmarks/NOTES.md`, "Bulk stepped layer by layer"). A chain replays the same kernels from graphs: one
launch per `layers_per_graph` layers, the first graph also embedding, the last also pooling.

A chain is keyed by the bucket layout (rose.graphs' buckets; the batch is padded to it) and captured lazily
as whole-model graphs are: a layout's first stepped batch runs eagerly, its next one captures the chain, and
the new chain's rows are checked against the eager run of the same batch before it serves (rose.graph_checks).
A capture that fails or a chain that fails its check is not retried: that layout steps eagerly from then on.

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

from rose.graph_checks import check_replay
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
        self.eager_only: dict[MetaLayout, str] = {}
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

    def layout_for(self, num_tokens: int, num_seqs: int, num_rows: int, longest: int) -> MetaLayout | None:
        """The bucket layout a stepped batch pads to, or None (stepped eagerly at its exact size): above the
        largest bucket, and for a layout refused before. Past max_chains a new layout is stepped eagerly at its
        bucket layout (`steps`)."""
        layout = self.runner.graphs.layout_for(num_tokens, num_seqs, num_rows, longest)
        return None if layout is None or layout in self.eager_only else layout

    def steps(self, host: HostMeta, staged: torch.Tensor) -> Generator[tuple[torch.Tensor, str] | None, None, None]:
        """The padded batch `host`: yields None after each graph but the last, then (the rows on the device, how:
        "layers" for a chain's replay, "layers-capture" when this batch captured it, "eager"). A layout whose
        chain is due is captured, checked and served in the first step (the check's replay is the batch's rows:
        one step in all). A layout not yet due, or whose capture or check fails, or a batch stepped while another
        is stepped through chains, runs eagerly at the layout. The chains' lock is let go before the rows are
        yielded (and by the finally of an abandoned stepping), never left to the garbage collector."""
        layout = host.layout
        self.seen[layout] += 1
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
                rows, how = self._capture_checked(host, staged), "layers-capture"
            else:
                for rows in self._replay(chain, host, staged):  # None after each graph but the last: its rows
                    if rows is None:
                        yield None
                how = "layers"
        finally:
            self._stepping.release()
        if rows is None:  # the capture or its check failed
            yield from eager_layer_steps(self.runner, host, staged)
            return
        yield rows, how

    def _replay(self, chain: _Chain, host: HostMeta, staged: torch.Tensor):
        chain.static_in.copy_(staged, non_blocking=True)
        chain.meta.host = host
        self.runner.backend.plan(chain.meta)
        last = len(chain.graphs) - 1
        for i, graph in enumerate(chain.graphs):
            graph.replay()
            yield chain.static_out if i == last else None

    def _capture_checked(self, host: HostMeta, staged: torch.Tensor) -> torch.Tensor | None:
        """Capture the layout's chain, replay it for `host` and check the rows against the eager run; the rows
        (on the device) when the chain is kept, None when it is refused (logged once; eager from now on)."""
        layout = host.layout
        try:
            chain = self._capture(host, staged)
            for rows in self._replay(chain, host, staged):
                pass
            reference = self.runner.eager(host, staged)
            check_replay(f"layers {layout_label(layout)}", _host_rows(rows, host), _host_rows(reference, host))
        except Exception as exc:  # this layout steps eagerly from now on
            self.eager_only[layout] = f"{type(exc).__name__}: {exc}"
            log.warning("layer graphs %s: %s; this layout is stepped eagerly from now on", layout_label(layout),
                        self.eager_only[layout], exc_info=exc)
            return None
        self.chains[layout] = chain
        self.captures += 1
        return rows

    def _capture(self, host: HostMeta, staged: torch.Tensor) -> _Chain:
        """One warm run and the chain's captures, on a side stream (as rose.graphs captures)."""
        start, runner, layout = time.perf_counter(), self.runner, host.layout
        stream = torch.cuda.current_stream(runner.device)
        pool = self.pool
        static_in = torch.zeros(layout.words, dtype=torch.int64, device=runner.device)
        static_in.copy_(staged, non_blocking=True)
        meta = ForwardMeta.from_buffer(static_in, layout, layout.seqlen_bound, host, graph=True)
        runner.backend.plan(meta)
        if self._side is None:
            self._side = torch.cuda.Stream(runner.device)
        side = self._side
        side.wait_stream(stream)
        graphs, out = [], None
        try:
            with torch.cuda.stream(side):
                runner.forward(meta)  # the warm run
                hidden = runner.model.forward_layers(meta, runner.backend)
                _count_capture(1)
                try:
                    for i, count in enumerate(self.chunks):
                        graph = torch.cuda.CUDAGraph()
                        graph.capture_begin(pool=pool, capture_error_mode="thread_local")
                        try:
                            for _ in range(count):
                                h = next(hidden)
                            if i == len(self.chunks) - 1:
                                out = runner.pooled_rows(h, meta)
                        except BaseException:
                            _end_failed_capture(graph)
                            raise
                        graph.capture_end()
                        graphs.append(graph)
                finally:
                    _count_capture(-1)
                    hidden.close()
            stream.wait_stream(side)
        except BaseException:
            torch.cuda.set_stream(stream)
            end_pool_recording(runner.device, pool)
            self.pool = torch.cuda.graph_pool_handle()  # later chains: a fresh pool (captured ones keep theirs)
            raise
        finally:
            self.capture_seconds += time.perf_counter() - start
        return _Chain(graphs, static_in, out, meta)


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

