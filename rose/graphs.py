"""Whole-model CUDA graphs with lazy capture: embeddings, every layer, attention and pooling in one replay.

A graph bakes in its shapes, so it is keyed by the bucket layout (Tb tokens, Sb sequences, Pb rows):
ragged batches are padded at the end up to the smallest bucket that fits (rose.meta explains the
padding). Lazy capture: a layout's first batch runs eagerly at the padded shape (the warm-up: cuBLAS
handles, kernel autotuning, allocator growth), its second is captured and replayed, later ones replay.
While a layout has no graph, a served batch of it replays a larger captured layout that holds it within a
padding bound instead, for its first SUBSTITUTE_SIGHTS sights (rose.graph_substitutes): no eager run and no
capture on the request path for the layouts the prewarm did not take. All graphs draw from one memory
pool; batches above the largest bucket run eagerly. A new graph's first
replay is checked against the eager run of the same batch (rose.graph_checks, as prewarm checks). A capture
that fails, or a graph that fails that check, is not retried: that batch and every later one of its layout
run eagerly (counted in captures_failed / graphs_refused, logged once).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

import numpy as np
import torch

from rose.buckets import DEFAULT_SEQ_BUCKETS, DEFAULT_TOKEN_BUCKETS, choose_layout
from rose.graph_checks import (VERIFY_MAX_DIVERGENCE, GraphVerificationError, check_replay,  # noqa: F401
                               cosine_divergence, load_manifest, probe_batch)  # (re-exported)
from rose.graph_substitutes import SUBSTITUTE_SIGHTS, find_substitute
from rose.meta import ForwardMeta, HostMeta, MetaLayout

log = logging.getLogger("rose.graphs")
LAYOUTS_KEPT = 65536  # batch shapes whose layout layout_for keeps (~200 bytes each)
_capturing = 0  # graph captures in progress, any lane (rose.express): PinnedPool leaves the host cache alone
_capturing_lock = threading.Lock()


def capturing() -> bool:
    """Whether some thread is capturing a CUDA graph now (device-wide calls would invalidate its capture)."""
    return _capturing > 0


def _count_capture(delta: int) -> None:
    global _capturing
    with _capturing_lock:
        _capturing += delta


def layout_label(layout: MetaLayout) -> str:
    return f"t{layout.tokens}s{layout.seqs}p{layout.rows}m{layout.seqlen_bound}"


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    static_in: torch.Tensor  # int64 [layout.words] on the device
    static_out: torch.Tensor  # float32 [Pb, dim] produced by the replay
    meta: ForwardMeta  # views into static_in (graph=True, max_seqlen = the layout's bound)
    views: dict = field(default_factory=dict, repr=False)  # (rows, dims) -> static_out[:rows, :dims]

    def out_rows(self, rows: int, dims: int | None) -> torch.Tensor:
        """static_out's first `rows` rows (and `dims` columns): a replay's real rows, sliced once per shape (a slice
        is a torch call, which gives up the GIL: PinnedBuffer.float_rows). At most layout.rows entries."""
        view = self.views.get((rows, dims))
        if view is None:
            view = self.views[(rows, dims)] = self.static_out[:rows, :dims]
        return view


class CudaGraphs:
    """Lazy per-layout CUDA graphs around `forward(meta) -> [Pb, dim]` (a pure, capturable function)."""

    scores = False  # the rows are a score head's (rose.score_head sets it): replays checked by their difference

    def __init__(self, forward: Callable[[ForwardMeta], torch.Tensor], plan: Callable[[ForwardMeta], None],
                 eager: Callable[[HostMeta, torch.Tensor], torch.Tensor], device: torch.device,
                 token_buckets: Iterable[int] = DEFAULT_TOKEN_BUCKETS,
                 seq_buckets: Iterable[int] = DEFAULT_SEQ_BUCKETS, capture_after: int = 1) -> None:
        """forward: what a graph captures; plan: the backend's host-side plan, before each replay; eager:
        the runner's one eager path (ModelRunner.eager), for every run of a layout that is not a replay."""
        self.forward, self.plan, self.eager, self.device = forward, plan, eager, device
        self.token_buckets = tuple(sorted(set(int(t) for t in token_buckets)))
        self.seq_buckets = tuple(sorted(set(int(s) for s in seq_buckets)))
        if not self.token_buckets or not self.seq_buckets:
            raise ValueError("graph buckets must not be empty")
        self.capture_after = capture_after  # eager runs of a layout before it is captured
        self.pool = torch.cuda.graph_pool_handle()
        self.graphs: dict[MetaLayout, _Graph] = {}
        self.seen: Counter[MetaLayout] = Counter()
        self.examples: dict[MetaLayout, tuple[int, int, int, int]] = {}  # a real (T, S, P, longest) per layout
        self.capture_seconds = 0.0
        self.eager_only: dict[MetaLayout, str] = {}  # layouts that never get a graph, and why
        self.refused: set[MetaLayout] = set()  # ... of those, the ones whose graph failed verification
        self.captures_failed = 0
        self.graphs_refused = 0
        self._lock = threading.Lock()
        self._side: torch.cuda.Stream | None = None  # warm runs and captures
        self.substituted: Counter[MetaLayout] = Counter()  # sights served by a larger captured layout
        self._layouts: dict[tuple[int, int, int, int], MetaLayout | None] = {}  # layout_for's answers

    # -- bucket choice (host only) ---------------------------------------------------------------
    def layout_for(self, num_tokens: int, num_seqs: int, num_rows: int, longest: int) -> MetaLayout | None:
        """The smallest bucket layout that fits, or None above the largest bucket (run eagerly); each shape's
        answer kept (a step's first host work: 3.9 -> 0.3 us on the CPU VM), LAYOUTS_KEPT shapes at most."""
        shape = (num_tokens, num_seqs, num_rows, longest)
        try:
            return self._layouts[shape]
        except KeyError:
            pass
        found = choose_layout(self.token_buckets, self.seq_buckets, num_tokens, num_seqs, num_rows, longest)
        layout = None if found is None else MetaLayout(*found)
        if len(self._layouts) >= LAYOUTS_KEPT:
            self._layouts.clear()  # a fresh start beats an LRU's bookkeeping on every step
        self._layouts[shape] = layout
        return layout

    def serving_layout(self, num_tokens: int, num_seqs: int, num_rows: int, longest: int) -> MetaLayout | None:
        """The layout a served batch runs at: its own when captured; else, for its first SUBSTITUTE_SIGHTS
        sights, a captured larger layout that fits it within the padding bound (rose.graph_substitutes), so
        the batch replays instead of running eagerly or capturing on the request path; else its own
        (the lazy path: eager warm-up, then capture)."""
        exact = self.layout_for(num_tokens, num_seqs, num_rows, longest)
        if exact is None or exact in self.graphs or exact in self.eager_only:
            return exact
        with self._lock:
            if self.substituted[exact] >= SUBSTITUTE_SIGHTS:
                return exact
            found = find_substitute(exact, self.graphs, num_tokens, num_seqs, num_rows, longest)
            if found is None:
                return exact
            self.substituted[exact] += 1
            self.examples.setdefault(exact, (num_tokens, num_seqs, num_rows, longest))
            return found

    # -- running ---------------------------------------------------------------------------------
    def run(self, host: HostMeta, staged: torch.Tensor, dims: int | None = None) -> tuple[torch.Tensor, str]:
        """Run the padded batch `host` whose packed words sit in pinned `staged`; returns (rows, how) with how =
        "replay" | "capture" | "eager", rows the real [P, dims] (dims: all the width by default) for a replay
        and [>= P, dim] otherwise. Everything is enqueued on the current stream."""
        layout = host.layout
        with self._lock:
            self._note(host)
            entry = self.graphs.get(layout)
            if entry is not None:
                self._replay(entry, host, staged)
                return entry.out_rows(host.num_rows, dims), "replay"
            if layout in self.eager_only or self.seen[layout] <= self.capture_after:  # warm-up, or no graph
                return self.eager(host, staged), "eager"
            try:
                entry = self._capture(layout, host, staged)
                out = self._replay(entry, host, staged)
            except Exception as exc:  # noqa: BLE001 - this batch and the layout's later ones run eagerly
                self.captures_failed += 1
                self._give_up(layout, exc)
                return self.eager(host, staged), "eager"
            return self._verify(entry, out, host, staged)

    def _verify(self, entry: _Graph, out: torch.Tensor, host: HostMeta,
                staged: torch.Tensor) -> tuple[torch.Tensor, str]:
        """The new graph's first replay `out` against the eager run of the same batch (the check prewarm
        makes); a graph that fails it is dropped and the batch gets the eager rows. Once per layout: one
        eager run more and the only host sync outside the copy out (the rows of both, to the host). The
        eager run allocates outside the graphs' pool, so it cannot overwrite `out`."""
        layout = host.layout
        reference = self.eager(host, staged)
        try:
            check_replay(layout_label(layout), _host_rows(out, host), _host_rows(reference, host), self.scores)
        except GraphVerificationError as exc:
            self.graphs_refused += 1
            self.refused.add(layout)
            self._give_up(layout, exc)
            return reference, "eager"
        self.graphs[layout] = entry
        return out, "capture"

    def _note(self, host: HostMeta) -> None:
        self.seen[host.layout] += 1
        if host.layout not in self.examples:
            self.examples[host.layout] = host.shape()

    def _replay(self, entry: _Graph, host: HostMeta, staged: torch.Tensor) -> torch.Tensor:
        entry.static_in.copy_(staged, non_blocking=True)
        entry.meta.host = host  # host-side planning (FlashInfer) reads the new batch; the graph does not
        self.plan(entry.meta)
        entry.graph.replay()
        return entry.static_out

    def _give_up(self, layout: MetaLayout, exc: BaseException) -> None:
        """No graph for `layout`, ever: it runs eagerly from now on. Logged once (it is never retried)."""
        self.eager_only[layout] = f"{type(exc).__name__}: {exc}"
        log.warning("CUDA graph %s: %s; this layout runs eagerly from now on", layout_label(layout),
                    self.eager_only[layout], exc_info=exc)

    def _capture(self, layout: MetaLayout, host: HostMeta, staged: torch.Tensor) -> _Graph:
        """One warm run and the capture, both on the graphs' own side stream, without torch.cuda.graph's
        context manager: that one synchronizes the whole device and empties the allocator's cache on every
        capture, so under load a capture also waited for the other batch in flight and every later eager run
        went back to cudaMalloc (benchmarks/NOTES.md, "Capture cost"). Neither is needed for a correct capture."""
        start = time.perf_counter()
        stream = torch.cuda.current_stream(self.device)
        try:
            static_in = torch.zeros(layout.words, dtype=torch.int64, device=self.device)
            static_in.copy_(staged, non_blocking=True)  # a valid batch for the warm run; pinned: no host wait
            meta = ForwardMeta.from_buffer(static_in, layout, layout.seqlen_bound, host, graph=True)
            self.plan(meta)
            side = self._side_stream()
            side.wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.stream(side):
                self.forward(meta)  # the warm run torch.cuda.graph's docs ask for, then the capture
                # Thread-local: the completer, the metrics thread and LazyTensor releases keep querying events
                # while the launcher thread captures; in the default (global) mode any of those calls from
                # another thread invalidates the capture (and raises there).
                _count_capture(1)
                try:
                    graph.capture_begin(pool=self.pool, capture_error_mode="thread_local")
                    try:
                        static_out = self.forward(meta)
                    except BaseException:
                        _end_failed_capture(graph)
                        raise
                    graph.capture_end()
                finally:
                    _count_capture(-1)
            stream.wait_stream(side)
        except BaseException:
            torch.cuda.set_stream(stream)  # the eager runs that follow belong on the stream this step started on
            self._reset_pool()
            raise
        finally:
            self.capture_seconds += time.perf_counter() - start
        return _Graph(graph, static_in, static_out, meta)

    def _side_stream(self) -> torch.cuda.Stream:
        if self._side is None:
            self._side = torch.cuda.Stream(self.device)
        return self._side

    def _reset_pool(self) -> None:
        """After a failed capture. When cudaStreamEndCapture fails, torch's CUDAGraph.capture_end raises before
        it ends the allocator's recording into our pool, and every later capture into that pool fails with
        "beginAllocateToPool: already recording to mempool_id" (seen on the H200). End that recording if it
        is still open, and give later graphs a fresh pool (graphs already captured keep theirs)."""
        end_pool_recording(self.device, self.pool)
        self.pool = torch.cuda.graph_pool_handle()

    def pending(self) -> list[tuple[int, int, int, int]]:
        """A real (T, S, P, longest) shape of each layout that has had its eager warm-up run(s) but no graph
        yet, hottest first: the layouts whose next batch would capture on the request path."""
        with self._lock:
            sights = self.seen + self.substituted
            return [self.examples[lay] for lay, n in sights.most_common()
                    if n >= self.capture_after and lay not in self.graphs and lay not in self.eager_only
                    and lay in self.examples]

    # -- the manifest ---------------------------------------------------------------------------
    def save_manifest(self, path: Path, chains: list[list[int]] | None = None) -> None:
        """Hot layouts, most frequent first, each with a real batch shape that maps to it; `chains`, the layouts
        stepped layer by layer (rose.layer_graphs.LayerGraphs.manifest_rows), beside them."""
        sights = self.seen + self.substituted
        rows = [[*self.examples[lay], n] for lay, n in sights.most_common() if lay in self.examples]
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"version": 2, "shapes": rows, "chains": chains or []}, indent=1))
        os.replace(tmp, path)


def end_pool_recording(device, pool) -> None:
    """End the allocator's recording into `pool` if a failed capture left it open (CudaGraphs._reset_pool)."""
    try:
        torch._C._cuda_endAllocateToPool(torch.device(device).index or 0, pool)
    except Exception:  # noqa: BLE001 - not recording (the capture failed before it began): nothing to end
        pass


def _end_failed_capture(graph: torch.cuda.CUDAGraph) -> None:
    """Take the stream out of capture mode after the captured forward raised; the forward's error is the one
    that propagates (capture_end of an invalidated capture raises too)."""
    try:
        graph.capture_end()
    except Exception:  # noqa: BLE001
        log.debug("capture_end after a failed capture", exc_info=True)


def _host_rows(out: torch.Tensor, host: HostMeta) -> np.ndarray:
    return out[: host.num_rows].float().cpu().numpy()
