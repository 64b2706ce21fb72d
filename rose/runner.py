"""The runner owns the device: the model, the attention backend, staging and output buffers, the stream.

step(batch) is five steps, one method each:
1. layout: the CUDA-graph bucket layout that fits the batch (None: run at its exact size), then pack
   the batch's metadata on the host (numpy) for it;
2. stage: the packed words into the step's pinned buffer (a CPU reads the numpy array as it is);
3. dispatch: the graph runner (replay, capture, or an eager warm-up) or `eager()` at the exact size;
4. copy back: one non-blocking device-to-host copy of the rows into the same pinned buffer, a CUDA event;
5. counters: one run per (layout label, how).
The result is a LazyTensor around that buffer and event.

`forward(meta)` (model, pooling, output transform) is a pure function of the weights and ForwardMeta with
fixed shapes and no host syncs, so a CUDA graph can capture it whole. `eager(host, staged)` is the one
eager path, for exact-size batches and for every graph layout that runs eagerly (its warm-up run, the
reference a new graph is verified against, a layout whose capture failed): the packed words to the device,
an eager ForwardMeta (graph=False), the backend's plan, forward. rose.graphs drives the same pieces for a
graph: its own static input buffer, a ForwardMeta with graph=True and max_seqlen = the layout's bound,
plan before each replay.

One pinned buffer per step holds both the staging area and the output rows: the staging area is free
again once the output copy (later on the same stream) is done, i.e. exactly when the LazyTensor is
ready, and a single acquire cannot deadlock against other steps at the pool's cap.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from contextlib import nullcontext

import torch

from rose.attention import make_backend
from rose.batch import Batch
from rose.express import ExpressLane
from rose.graphs import CudaGraphs, layout_label
from rose.layers import output_transform, segment_mean
from rose.layers.persistent_attach import attach as attach_persistent
from rose.layers.persistent_attach import enable as enable_persistent
from rose.lazy import LazyTensor, PinnedBuffer, PinnedPool
from rose.loader import load_model
from rose.meta import ForwardMeta, HostMeta, MetaLayout, pack_batch
from rose.spec import ModelSpec

log = logging.getLogger("rose.runner")

def token_bucket_label(num_tokens: int) -> str:
    """Exact-size eager runs are counted per power-of-two token class."""
    return f"t{1 << max(0, num_tokens - 1).bit_length()}"


class ModelRunner:
    def __init__(self, spec: ModelSpec, device: torch.device, dtype: torch.dtype, attention: str,
                 pool: PinnedPool, graphs: dict | None = None, persistent_tokens: int = 0) -> None:
        """graphs: None = eager only; else CudaGraphs keyword arguments (token_buckets, seq_buckets).
        persistent_tokens: batches of up to this many tokens run every decoder layer in one persistent kernel
        where the model supports it (rose.layers.persistent_decoder), from warm_persistent() on (the engine's
        warm-up); 0 = off, ON / AUTO: rose.persistent_routing."""
        self.spec, self.device, self.dtype, self.pool, self.attention = spec, device, dtype, pool, attention
        self.model = load_model(spec, device, dtype)
        self.backend = make_backend(attention, device, dtype, spec)
        # built now, routed to once warm_persistent() has compiled and launched it (the engine's warm-up)
        self._persistent = attach_persistent(self.model, self.backend, persistent_tokens, warm=False)
        self.pooler = segment_mean  # hidden, span_index, span_count -> rows (SPLADE: rose.retrieval_head)
        self.transform = output_transform(spec.native_int8)
        self.dimensions = spec.dimensions
        self.vocab_size = int(spec.config["vocab_size"])
        self.type_vocab_size = spec.type_vocab_size
        self.pad_id = 0
        self.runs: Counter[tuple[str, str]] = Counter()
        self.step_seconds_last = 0.0
        self._lock = threading.Lock()  # one batch at a time through the device-side sequence (the express
        # lane has a lock of its own)
        self._count_lock = threading.Lock()
        self.graphs: CudaGraphs | None = None
        self.express: ExpressLane | None = None  # enable_express(): small batches beside long ones
        self.layers_per_graph = 1  # decoder layers per graph of a layer-stepped chain (rose.layer_graphs)
        self._layer_graphs = None  # rose.layer_graphs.LayerGraphs, built by the first layer_chains() on a GPU
        if graphs is not None and device.type == "cuda" and self.backend.graph_safe:
            self.graphs = CudaGraphs(self.forward, self.backend.plan, self.eager, device, **graphs)

    @property
    def on_cuda(self) -> bool:
        return self.device.type == "cuda"

    # -- the capturable part and the one eager path -----------------------------------------------
    def forward(self, meta: ForwardMeta, backend=None) -> torch.Tensor:
        """float32 [Pb, dimensions]: pooled rows after the family's transform, or a cross-encoder's score
        head (rose.score_head; rows >= P are filler). backend: the express lane's, else the runner's."""
        return self.pooled_rows(self.model(meta, backend or self.backend), meta)

    def pooled_rows(self, hidden: torch.Tensor, meta: ForwardMeta) -> torch.Tensor:
        """The model's hidden states -> its rows: pooling, then the family's transform."""
        return self.transform(self.pooler(hidden, meta.span_index, meta.span_count))

    def eager(self, host: HostMeta, staged: torch.Tensor, backend=None) -> torch.Tensor:
        """Run the packed batch `host` (its words in `staged`) eagerly at its layout: [Pb, dimensions]."""
        meta = self.eager_meta(host, staged)
        backend = backend or self.backend
        backend.plan(meta)
        return self.forward(meta, backend)

    def eager_meta(self, host: HostMeta, staged: torch.Tensor) -> ForwardMeta:
        """The packed words on the device and an eager ForwardMeta for them. A bucket layout passes its max-seqlen
        bound (the shapes its graph will see), an exact one the batch's own longest sequence."""
        dev = staged.to(self.device, non_blocking=True) if self.on_cuda else staged
        bound = host.layout.seqlen_bound if host.layout.max_seqlen else host.max_seqlen
        return ForwardMeta.from_buffer(dev, host.layout, bound, host)

    def device_scope(self):
        """This runner's device made current (streams and events belong to it)."""
        return _device_scope(self.device)

    # -- host side ------------------------------------------------------------------------------
    def pack(self, batch: Batch, layout: MetaLayout | None = None) -> HostMeta:
        """Validate and pack `batch` (exact sizes unless a bucket `layout` is given)."""
        return pack_batch(batch, layout, pad_id=self.pad_id, max_length=self.spec.max_length,
                          vocab_size=self.vocab_size, type_vocab_size=self.type_vocab_size)

    def enable_express(self, max_tokens: int) -> bool:
        """Give small batches a lane of their own beside long ones (rose.express); CUDA only. False on a CPU."""
        if not self.on_cuda:
            return False
        if self.express is None:
            self.express = ExpressLane.build(self, max_tokens)
        return True

    def warm_persistent(self) -> bool:
        """Compile and launch the persistent decoder built at start (rose.layers.persistent_decoder), then route
        small batches to it; once (the engine's warm-up, before any graph is captured, so the graphs of its
        layouts hold it). False when there is none or it failed (the layers serve)."""
        decoder, self._persistent = self._persistent, None
        if decoder is None:
            return False
        with self.device_scope():  # its launches on this runner's device (cuda:N)
            return enable_persistent(self.model, decoder)

    def layer_chains(self):
        """The per-layer graph chains batches stepped layer by layer replay (rose.layer_graphs), built on first
        use; None without whole-model graphs (a CPU), for a model without per-layer forwards, and for a backend
        whose plan leaves host state (FlashInfer: a query planned between two layers would re-plan the slot a
        chain reads)."""
        if getattr(self.backend, "host_plan_state", False):
            return None
        if self._layer_graphs is None and self.graphs is not None and hasattr(self.model, "forward_layers"):
            from rose.layer_graphs import LayerGraphs

            with self._count_lock:  # two threads' first steppings build one
                if self._layer_graphs is None:
                    self._layer_graphs = LayerGraphs(self, self.layers_per_graph)
        return self._layer_graphs

    def step(self, batch: Batch, use_graphs: bool = True, own_layout: bool = False,
             express: bool = False) -> LazyTensor:
        """own_layout: run at the batch's own graph layout, never a larger captured one (rose.graph_substitutes):
        what prewarm and idle capture step, to warm and capture that layout. express: on the express lane
        (enable_express), concurrently with the bulk lane's steps."""
        start = time.perf_counter()
        lane = self.express if express else None
        if express and lane is None:
            raise RuntimeError("express step without an express lane (enable_express)")
        graphs = lane.graphs if lane is not None else self.graphs
        layout = self._layout(graphs, batch, own_layout) if use_graphs else None
        host = self.pack(batch, layout)
        if host.num_rows == 0:
            return LazyTensor(None, None, (0, self.dimensions))
        buf = self.pool.acquire(self._buffer_bytes(host))
        try:
            with (lane.lock if lane else self._lock), torch.inference_mode(), _device_scope(self.device), \
                    (torch.cuda.stream(lane.stream) if lane else nullcontext()):
                staged = self._stage(host, buf)
                out, how = self._dispatch(graphs if layout is not None else None, host, staged,
                                          lane.backend if lane else None)
                event = self._copy_back(out, host, buf)
                self._count(host, layout, how, "x" if lane else "")
        except BaseException:
            self._release_after_failure(buf, lane.stream if lane else None)
            raise
        self.step_seconds_last = time.perf_counter() - start
        lazy = LazyTensor(self.pool, buf, (host.num_rows, self.dimensions), event)
        lazy.padded_tokens = host.layout.tokens
        lazy.cold = layout is not None and how != "replay"  # a graph layout without its graph yet
        return lazy

    def replays(self, batch: Batch) -> bool:
        """Whether step(batch) (the main lane) replays a captured graph of the batch's own layout (Engine.replays)."""
        graphs = self.graphs
        if graphs is None or not batch.num_seqs:
            return False
        layout = graphs.layout_for(batch.num_tokens, batch.num_seqs, batch.num_rows, int(batch.seq_lens.max()))
        return layout is not None and layout in graphs.graphs

    # -- the steps of step() ----------------------------------------------------------------------
    @staticmethod
    def _layout(graphs: CudaGraphs | None, batch: Batch, own: bool = False) -> MetaLayout | None:
        """1. The graph bucket layout `batch` runs at (its own, or a captured larger one: CudaGraphs.serving_layout);
        None without graphs or above the largest bucket."""
        if graphs is None:
            return None
        longest = int(batch.seq_lens.max()) if batch.num_seqs else 1
        choose = graphs.layout_for if own else graphs.serving_layout
        return choose(batch.num_tokens, batch.num_seqs, batch.num_rows, longest)

    def _out_bytes(self, host: HostMeta) -> int:
        return host.num_rows * self.dimensions * 4

    def _staging_at(self, host: HostMeta) -> int:
        return -(-self._out_bytes(host) // 64) * 64  # 64-byte aligned staging area after the output rows

    def _buffer_bytes(self, host: HostMeta) -> int:
        return self._staging_at(host) + host.layout.nbytes if self.on_cuda else self._out_bytes(host)

    def _stage(self, host: HostMeta, buf: PinnedBuffer) -> torch.Tensor:
        """2. The packed words where the device copies them from: the pinned buffer (CUDA) or the array."""
        if not self.on_cuda:
            return torch.from_numpy(host.packed)
        at = self._staging_at(host)
        words, staged = buf.int64_views(at, at + host.layout.nbytes)
        words[:] = host.packed
        return staged

    def _dispatch(self, graphs: CudaGraphs | None, host: HostMeta, staged: torch.Tensor,
                  backend=None) -> tuple[torch.Tensor, str]:
        """3. Rows [>= P, dimensions] on the device and how they were made (replay | capture | eager):
        through `graphs` for a graph layout, else eagerly at the exact size."""
        if graphs is not None:
            return graphs.run(host, staged, self.dimensions)
        return self.eager(host, staged, backend), "eager"

    def _copy_back(self, out: torch.Tensor, host: HostMeta, buf: PinnedBuffer):
        """4. The one copy out: the real rows at the served width (truncate_dim) into the pinned buffer, then an event
        after it (CUDA). A replay's rows come sliced already and the buffer's view is made once per shape: each
        torch call gives up the GIL (PinnedBuffer.float_rows)."""
        rows = buf.float_rows(host.num_rows, self.dimensions)
        if out.shape != rows.shape:
            out = out[: host.num_rows, : self.dimensions]
        rows.copy_(out, non_blocking=self.on_cuda)
        if not self.on_cuda:
            return None
        event = buf.done_event()
        event.record()
        return event

    def _count(self, host: HostMeta, layout: MetaLayout | None, how: str, lane: str = "") -> None:
        """5. One run of this layout (graph layouts by their label, exact sizes by token class; the express
        lane's prefixed with "x")."""
        label = layout_label(layout) if layout is not None else token_bucket_label(host.num_tokens)
        with self._count_lock:  # two lanes step from two threads
            self.runs[(lane + label, how)] += 1

    def _release_after_failure(self, buf: PinnedBuffer, stream=None) -> None:
        """A step failed: let work already enqueued on its stream (which may still write into `buf`) drain,
        then give the buffer back whatever the drain says (a device that cannot synchronize runs nothing
        more). The step's stream only, not the device: the other lane may be capturing a graph, and a device
        synchronize then invalidates its capture. The step's own exception is the one that propagates."""
        try:
            if self.on_cuda:
                (stream or torch.cuda.current_stream(self.device)).synchronize()
        except Exception:  # noqa: BLE001
            log.warning("could not synchronize the device after a failed step", exc_info=True)
        finally:
            self.pool.release(buf)

    def close(self) -> None:
        self.model = None  # type: ignore[assignment]
        self._persistent = None  # a decoder never warmed holds the stacked weights the parameters view
        if self.on_cuda:
            torch.cuda.empty_cache()


def _device_scope(device: torch.device):
    """Make `device` current so streams and events belong to it."""
    return torch.cuda.device(device) if device.type == "cuda" else nullcontext()
