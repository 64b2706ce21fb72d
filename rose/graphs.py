"""Whole-model CUDA graphs with lazy capture: embeddings, every layer, attention and pooling in one replay.

A graph bakes in its shapes, so it is keyed by the bucket layout (Tb tokens, Sb sequences, Pb rows):
ragged batches are padded at the end up to the smallest bucket that fits (rose.meta explains the
padding). Lazy capture: a layout's first batch runs eagerly at the padded shape (the warm-up: cuBLAS
handles, kernel autotuning, allocator growth), its second is captured and replayed, later ones replay.
All graphs draw from one memory pool; batches above the largest bucket run eagerly.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import numpy as np
import torch

from rose.buckets import DEFAULT_SEQ_BUCKETS, DEFAULT_TOKEN_BUCKETS, choose_layout
from rose.meta import ForwardMeta, HostMeta, MetaLayout

VERIFY_MAX_DIVERGENCE = 1e-3  # cosine divergence (1 - cos) between graph and eager output, per row


class GraphVerificationError(RuntimeError):
    """Graph replay disagrees with the eager forward: the replica must not serve."""


def layout_label(layout: MetaLayout) -> str:
    return f"t{layout.tokens}s{layout.seqs}p{layout.rows}"


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    static_in: torch.Tensor  # int64 [layout.words] on the device
    static_out: torch.Tensor  # float32 [Pb, dim] produced by the replay
    meta: ForwardMeta  # views into static_in (max_seqlen = Tb)


class CudaGraphs:
    """Lazy per-layout CUDA graphs around `forward(meta) -> [Pb, dim]` (a pure, capturable function)."""

    def __init__(self, forward: Callable[[ForwardMeta], torch.Tensor], plan: Callable[[ForwardMeta], None],
                 device: torch.device, token_buckets: Iterable[int] = DEFAULT_TOKEN_BUCKETS,
                 seq_buckets: Iterable[int] = DEFAULT_SEQ_BUCKETS, capture_after: int = 1) -> None:
        self.forward, self.plan, self.device = forward, plan, device
        self.token_buckets = tuple(sorted(set(int(t) for t in token_buckets)))
        self.seq_buckets = tuple(sorted(set(int(s) for s in seq_buckets)))
        if not self.token_buckets or not self.seq_buckets:
            raise ValueError("graph buckets must not be empty")
        self.capture_after = capture_after  # eager runs of a layout before it is captured
        self.pool = torch.cuda.graph_pool_handle()
        self.graphs: dict[MetaLayout, _Graph] = {}
        self.seen: Counter[MetaLayout] = Counter()
        self.capture_seconds = 0.0
        self._lock = threading.Lock()

    # -- bucket choice (host only) ---------------------------------------------------------------
    def layout_for(self, num_tokens: int, num_seqs: int, num_rows: int) -> MetaLayout | None:
        """The smallest bucket layout that fits, or None above the largest bucket (run eagerly)."""
        found = choose_layout(self.token_buckets, self.seq_buckets, num_tokens, num_seqs, num_rows)
        return None if found is None else MetaLayout(*found)

    # -- running ---------------------------------------------------------------------------------
    def run(self, host: HostMeta, staged: torch.Tensor) -> tuple[torch.Tensor, str]:
        """Run the padded batch `host` whose packed words sit in pinned `staged`; returns ([Pb, dim], how)
        with how = "replay" | "capture" | "eager". Everything is enqueued on the current stream."""
        layout = host.layout
        with self._lock:
            entry = self.graphs.get(layout)
            if entry is None:
                self.seen[layout] += 1
                if self.seen[layout] <= self.capture_after:
                    dev = staged.to(self.device, non_blocking=True)
                    meta = ForwardMeta.from_buffer(dev, layout, layout.tokens, host)
                    self.plan(meta)
                    return self.forward(meta), "eager"
                entry = self._capture(layout, host)
                how = "capture"
            else:
                how = "replay"
            entry.static_in.copy_(staged, non_blocking=True)
            entry.meta.host = host  # host-side planning (FlashInfer) reads the new batch; the graph does not
            self.plan(entry.meta)
            entry.graph.replay()
            return entry.static_out, how

    def _capture(self, layout: MetaLayout, host: HostMeta) -> _Graph:
        start = time.perf_counter()
        static_in = torch.zeros(layout.words, dtype=torch.int64, device=self.device)
        static_in.copy_(torch.from_numpy(host.packed))  # a valid batch for the capture-time warm run
        meta = ForwardMeta.from_buffer(static_in, layout, layout.tokens, host)
        self.plan(meta)
        # One warm run on a side stream, as torch.cuda.graph's docs ask, then the capture.
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            self.forward(meta)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            static_out = self.forward(meta)
        entry = _Graph(graph, static_in, static_out, meta)
        self.graphs[layout] = entry
        self.capture_seconds += time.perf_counter() - start
        return entry

    # -- prewarm, manifest, verification ----------------------------------------------------------
    def hot_layouts(self) -> list[MetaLayout]:
        """Layouts seen in traffic, most frequent first (captured or not)."""
        counts = Counter(self.seen)
        return [layout for layout, _ in counts.most_common()]

    def save_manifest(self, path: Path) -> None:
        rows = [[lay.tokens, lay.seqs, lay.rows, n] for lay, n in Counter(self.seen).most_common()]
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"version": 1, "layouts": rows}, indent=1))
        os.replace(tmp, path)


def load_manifest(path: Path) -> list[MetaLayout]:
    data = json.loads(Path(path).read_text())
    return [MetaLayout(int(t), int(s), int(p)) for t, s, p, *_ in data.get("layouts", [])]


def probe_sequences(layout: MetaLayout, vocab_size: int, max_length: int, seed: int = 0) -> list[np.ndarray] | None:
    """Random token-id sequences that fill `layout` exactly (lengths vary, each within max_length; never
    zeros), or None when no valid batch has this layout (it would need sequences over max_length)."""
    total = layout.tokens
    seqs = min(layout.seqs, layout.rows, total)
    if -(-total // max_length) > seqs:
        return None
    rng = np.random.default_rng(seed + layout.tokens * 7919 + layout.seqs * 31 + layout.rows)
    lengths = np.full(seqs, total // seqs, dtype=np.int64)
    lengths[: total % seqs] += 1
    for i in range(seqs - 1):  # shift tokens between neighbours: ragged, still within [1, max_length]
        room = int(min(lengths[i] - 1, max_length - lengths[i + 1]))
        if room > 0:
            d = int(rng.integers(0, room + 1))
            lengths[i] -= d
            lengths[i + 1] += d
    return [rng.integers(1, max(2, vocab_size), size=int(n)).astype(np.int32) for n in lengths]


def cosine_divergence(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per-row 1 - cos(a, b) in float64."""
    a = a.astype(np.float64)
    b = b.astype(np.float64)
    num = (a * b).sum(axis=1)
    den = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    return 1.0 - num / np.maximum(den, 1e-30)
