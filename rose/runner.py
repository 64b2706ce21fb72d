"""The runner owns the device: the model, the attention backend, staging and output buffers, the stream.

step(batch): pack the batch's metadata on the host (numpy) -> pinned staging -> one non-blocking
host-to-device copy -> `forward(meta)` (model, pooling, output transform; a pure function of the weights
and ForwardMeta with fixed shapes and no host syncs, so a CUDA graph can capture it whole) -> one
non-blocking device-to-host copy into the same pinned buffer -> a CUDA event -> LazyTensor.

How a graph runner (issue 4) drives the same pieces, per bucket layout L = MetaLayout(Tb, Sb, Pb):
    host = runner.pack(batch, L)                                  # validate + pad on the host
    static = torch.empty(L.words, dtype=torch.int64, device=dev)  # once per L; views never move
    meta = ForwardMeta.from_buffer(static, L, max_seqlen=L.tokens, host=host)
    runner.backend.plan(meta)                                     # host-side, outside the graph
    with torch.cuda.graph(g, pool=shared_pool): out = runner.forward(meta)   # after one warm run
    per batch: static.copy_(pinned packed words, non_blocking=True); meta.host = host;
               runner.backend.plan(meta); g.replay(); out[:P] -> pinned rows -> event -> LazyTensor
The forward reads only device tensors and layout-fixed shapes, so the replay is exact for any batch that
fits L (max_seqlen = Tb is an upper bound the varlen kernel accepts).

One pinned buffer per step holds both the staging area and the output rows: the staging area is free
again once the output copy (later on the same stream) is done, i.e. exactly when the LazyTensor is
ready, and a single acquire cannot deadlock against other steps at the pool's cap.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from contextlib import nullcontext

import torch

from rose.attention import make_backend
from rose.batch import Batch
from rose.graphs import CudaGraphs, layout_label
from rose.layers import output_transform, segment_mean
from rose.lazy import LazyTensor, PinnedPool
from rose.loader import load_model
from rose.meta import ForwardMeta, HostMeta, MetaLayout, pack_batch
from rose.spec import ModelSpec


def token_bucket_label(num_tokens: int) -> str:
    """Eager runs are counted per power-of-two token class (issue 4 replaces this with graph buckets)."""
    return f"t{1 << max(0, num_tokens - 1).bit_length()}"


class ModelRunner:
    def __init__(self, spec: ModelSpec, device: torch.device, dtype: torch.dtype, attention: str,
                 pool: PinnedPool, graphs: dict | None = None) -> None:
        """graphs: None = eager only; else CudaGraphs keyword arguments (token_buckets, seq_buckets)."""
        self.spec, self.device, self.dtype, self.pool = spec, device, dtype, pool
        self.model = load_model(spec, device, dtype)
        self.backend = make_backend(attention, device, dtype, spec)
        self.transform = output_transform(spec.native_int8)
        self.dimensions = spec.dimensions
        self.vocab_size = int(spec.config["vocab_size"])
        self.pad_id = 0
        self.runs: Counter[tuple[str, str]] = Counter()
        self.step_seconds_last = 0.0
        self._lock = threading.Lock()  # one batch at a time through the device-side sequence
        self.graphs: CudaGraphs | None = None
        if graphs is not None and device.type == "cuda" and self.backend.graph_safe:
            self.graphs = CudaGraphs(self.forward, self.backend.plan, device, **graphs)

    # -- the capturable part --------------------------------------------------------------------
    def forward(self, meta: ForwardMeta) -> torch.Tensor:
        """float32 [Pb, dimensions]: pooled rows after the family's transform (rows >= P are filler)."""
        hidden = self.model(meta, self.backend)
        return self.transform(segment_mean(hidden, meta.span_index, meta.span_count))

    # -- host side ------------------------------------------------------------------------------
    def pack(self, batch: Batch, layout: MetaLayout | None = None) -> HostMeta:
        """Validate and pack `batch` (exact sizes unless a bucket `layout` is given)."""
        return pack_batch(batch, layout, pad_id=self.pad_id, max_length=self.spec.max_length,
                          vocab_size=self.vocab_size)

    def step(self, batch: Batch, use_graphs: bool = True) -> LazyTensor:
        start = time.perf_counter()
        layout = None
        if use_graphs and self.graphs is not None:
            longest = int(batch.seq_lens.max()) if batch.num_seqs else 1
            layout = self.graphs.layout_for(batch.num_tokens, batch.num_seqs, batch.num_rows, longest)
        host = self.pack(batch, layout)
        out_bytes = host.num_rows * self.dimensions * 4
        if host.num_rows == 0:
            return LazyTensor(None, None, (0, self.dimensions))
        on_cuda = self.device.type == "cuda"
        staging_at = -(-out_bytes // 64) * 64  # 64-byte aligned staging area after the output rows
        buf = self.pool.acquire(staging_at + host.layout.nbytes if on_cuda else out_bytes)
        try:
            with self._lock, torch.inference_mode(), _device_scope(self.device):
                staged = None
                if on_cuda:
                    staged = buf.tensor[staging_at: staging_at + host.layout.nbytes].view(torch.int64)
                    staged.numpy()[:] = host.packed
                if layout is not None:
                    out, how = self.graphs.run(host, staged)
                    label = layout_label(layout)
                else:
                    dev = staged.to(self.device, non_blocking=True) if on_cuda else torch.from_numpy(host.packed)
                    meta = ForwardMeta.from_buffer(dev, host.layout, host.max_seqlen, host)
                    self.backend.plan(meta)
                    out, how, label = self.forward(meta), "eager", token_bucket_label(host.num_tokens)
                out = out[: host.num_rows]
                rows = buf.tensor[:out_bytes].view(torch.float32).view(host.num_rows, self.dimensions)
                rows.copy_(out, non_blocking=on_cuda)
                event = None
                if on_cuda:
                    event = torch.cuda.Event()
                    event.record()
                self.runs[(label, how)] += 1
        except BaseException:
            if on_cuda:  # work already enqueued may still write into the buffer: let it drain first
                torch.cuda.synchronize(self.device)
            self.pool.release(buf)
            raise
        self.step_seconds_last = time.perf_counter() - start
        lazy = LazyTensor(self.pool, buf, (host.num_rows, self.dimensions), event)
        lazy.padded_tokens = host.layout.tokens
        return lazy

    def close(self) -> None:
        self.model = None  # type: ignore[assignment]
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def _device_scope(device: torch.device):
    """Make `device` current so streams and events belong to it."""
    return torch.cuda.device(device) if device.type == "cuda" else nullcontext()
