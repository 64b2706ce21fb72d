"""Per-batch metadata: packed on the host (numpy) into one int64 array, viewed on the device as ForwardMeta.

Why one array: one pinned staging buffer, one host-to-device copy, and (for CUDA graphs) one static
device buffer per bucket whose views never move: a graph runner copies the next batch's packed array
into the same buffer and replays.

Layout for buckets (Tb tokens, Sb sequences, Pb rows), in int64 words:
  input_ids [Tb] | positions [Tb] | seq_ids [Tb] | span_index [Tb] | token_types [Tb] | cu_seqlens int32 [Sb+1]
  | span_count f32 [Pb]
Padding goes only at the end: tokens T..Tb-1 have id `pad_id`, position 0, token type 0 and form their own
pseudo-sequence (seq id S; cu_seqlens gets Tb after T, and every further entry repeats Tb). Tokens in no
span pool into the dummy row Pb, which the pooler drops. Rows P..Pb-1 have count 1 (no division by 0).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch

from rose.batch import Batch


# lone sequences' words kept (_lone_words): one key per (layout, length, span, pad id), for layouts of up to
# LONE_WORDS_TOKENS tokens (where the host's share of a step is largest): <= 41 KB each, <= 10.5 MB in all
LONE_WORDS_TOKENS = 1024
LONE_WORDS_CACHED = 256


class BatchError(ValueError):
    """The batch cannot run: a token id outside the vocabulary, a sequence too long, bad spans."""


@dataclass(frozen=True)
class MetaLayout:
    tokens: int  # Tb
    seqs: int  # Sb (cu_seqlens has Sb + 1 entries)
    rows: int  # Pb
    max_seqlen: int = 0  # Mb: bound on any (pseudo-)sequence, baked into varlen kernels' grids; 0 = Tb

    @property
    def cu_words(self) -> int:
        return (self.seqs + 2) // 2  # int32 [Sb + 1] packed two per word

    @property
    def count_words(self) -> int:
        return (self.rows + 1) // 2

    @property
    def words(self) -> int:
        return 5 * self.tokens + self.cu_words + self.count_words

    @property
    def nbytes(self) -> int:
        return 8 * self.words

    def fits(self, num_tokens: int, num_seqs: int, num_rows: int) -> bool:
        pad_seq = 1 if self.tokens > num_tokens else 0
        return num_tokens <= self.tokens and num_seqs + pad_seq <= self.seqs and num_rows <= self.rows

    @property
    def seqlen_bound(self) -> int:
        """The max_seqlen a graph of this layout passes to the attention kernel."""
        return self.max_seqlen or self.tokens


@dataclass(frozen=True)
class HostMeta:
    """What the host knows about a packed batch (backends that plan on the host read it)."""

    layout: MetaLayout
    packed: np.ndarray  # int64 [layout.words]
    num_tokens: int
    num_seqs: int
    num_rows: int
    max_seqlen: int  # longest (pseudo-)sequence in the packed array
    cu_seqlens: np.ndarray  # int32 [Sb + 1], the same values as on the device

    def shape(self) -> tuple[int, int, int, int]:
        """(tokens, sequences, rows, longest real sequence): what a probe batch needs to map to this layout
        (rose.graph_checks.probe_batch; the graph manifest's rows)."""
        longest = int(np.diff(self.cu_seqlens[: self.num_seqs + 1]).max(initial=1))
        return self.num_tokens, self.num_seqs, self.num_rows, longest


@dataclass
class ForwardMeta:
    """Device views of one packed batch: the only per-batch input of a model forward."""

    input_ids: torch.Tensor  # int64 [Tb]
    positions: torch.Tensor  # int64 [Tb], position within its own sequence
    seq_ids: torch.Tensor  # int64 [Tb], padding tokens get id S
    span_index: torch.Tensor  # int64 [Tb], output row the token pools into; Pb = none
    token_types: torch.Tensor  # int64 [Tb], BERT token type (a pair's second text is 1); 0 for most models
    cu_seqlens: torch.Tensor  # int32 [Sb + 1]
    span_count: torch.Tensor  # float32 [Pb], tokens per row
    max_seqlen: int  # host int; a graph bakes it in, so graphs pass an upper bound (e.g. Tb)
    layout: MetaLayout
    host: HostMeta | None = None  # present in eager runs; a captured graph must not read it
    # True only for the meta a CUDA graph is captured and replayed with (rose.graphs): backends that keep
    # per-layout state for graphs (FlashInfer's fixed-buffer wrappers) key it on this, never on the shapes.
    graph: bool = False

    @classmethod
    def from_buffer(cls, buf: torch.Tensor, layout: MetaLayout, max_seqlen: int,
                    host: HostMeta | None = None, graph: bool = False) -> ForwardMeta:
        """Views into `buf` (int64 [>= layout.words], on the device); no copies, no kernels. `graph`: this
        meta is what a CUDA graph of `layout` is captured with and replayed through."""
        t = layout.tokens
        cu_at = 5 * t
        count_at = cu_at + layout.cu_words
        return cls(
            input_ids=buf[0:t],
            positions=buf[t:2 * t],
            seq_ids=buf[2 * t:3 * t],
            span_index=buf[3 * t:4 * t],
            token_types=buf[4 * t:5 * t],
            cu_seqlens=buf[cu_at:count_at].view(torch.int32)[: layout.seqs + 1],
            span_count=buf[count_at:count_at + layout.count_words].view(torch.float32)[: layout.rows],
            max_seqlen=int(max_seqlen),
            layout=layout,
            host=host,
            graph=graph,
        )


def pack_batch(batch: Batch, layout: MetaLayout | None = None, *, pad_id: int = 0,
               max_length: int | None = None, vocab_size: int | None = None,
               type_vocab_size: int = 1) -> HostMeta:
    """Validate `batch` and pack it for `layout` (default: exact sizes, plus nothing). Token types must lie
    in [0, type_vocab_size): an embedding lookup outside its table is a device-side assert on CUDA."""
    t, s, p = batch.num_tokens, batch.num_seqs, batch.num_rows
    layout = layout or MetaLayout(t, s, p)
    if not layout.fits(t, s, p):
        raise BatchError(f"batch of {t} tokens, {s} sequences, {p} rows does not fit {layout}")
    ids = batch.token_ids  # int32 (Batch checks): a negative id reads as >= 2**31 through a uint32 view
    if t and vocab_size is not None and int(ids.view(np.uint32).max()) >= vocab_size:
        bad = int(ids.max()) if int(ids.max()) >= vocab_size else int(ids.min())
        raise BatchError(f"token id {bad} is outside the vocabulary [0, {vocab_size})")
    types = batch.token_types
    if types is not None and t and int(types.view(np.uint32).max()) >= type_vocab_size:
        raise BatchError(f"token types must lie in [0, {type_vocab_size}) for this model")
    longest = t if s == 1 else int(batch.seq_lens.max()) if s else 0
    if max_length is not None and longest > max_length:
        raise BatchError(f"a sequence has {longest} tokens; the model takes at most {max_length}")
    if s == 1 and p == 1 and types is None:
        return _pack_one(batch, layout, pad_id)
    return _pack_general(batch, layout, pad_id, longest)


def _pack_general(batch: Batch, layout: MetaLayout, pad_id: int, longest: int) -> HostMeta:
    """pack_batch's general rule, for a validated batch."""
    t, s, p = batch.num_tokens, batch.num_seqs, batch.num_rows
    ids, types = batch.token_ids, batch.token_types
    cu_seqlens = batch.cu_seqlens
    seq_ids = np.repeat(np.arange(s, dtype=np.int64), batch.seq_lens)
    span_index = _span_index(batch.spans, seq_ids, t, layout, cu_seqlens)

    packed = np.zeros(layout.words, dtype=np.int64)
    tb = layout.tokens
    packed[0:t] = ids
    packed[t:tb] = pad_id
    packed[tb:tb + t] = batch.positions  # padding positions stay 0: always a valid embedding row
    packed[2 * tb:2 * tb + t] = seq_ids
    packed[2 * tb + t:3 * tb] = s
    packed[3 * tb:4 * tb] = span_index
    if types is not None:
        packed[4 * tb:4 * tb + t] = types  # the rest (padding, or no types) stays 0
    cu_at = 5 * tb
    count_at = cu_at + layout.cu_words
    cu = packed[cu_at:count_at].view(np.int32)[: layout.seqs + 1]
    cu[: s + 1] = cu_seqlens
    cu[s + 1:] = tb
    counts = packed[count_at:count_at + layout.count_words].view(np.float32)[: layout.rows]
    counts[:] = 1.0
    if p:
        counts[:p] = batch.spans[:, 1] - batch.spans[:, 0]
    return HostMeta(layout=layout, packed=packed, num_tokens=t, num_seqs=s, num_rows=p,
                    max_seqlen=max(longest, tb - t), cu_seqlens=cu.copy())


def _pack_one(batch: Batch, layout: MetaLayout, pad_id: int) -> HostMeta:
    """pack_batch for one sequence pooled into one row (a lone query: what latency is made of): a copy of the
    words every lone sequence of its length, span and layout shares (_lone_words, made once; layouts past
    LONE_WORDS_TOKENS are filled in place), then its ids. The same array as the general rule's
    (tests/rose/test_rose_batching.py holds the two equal)."""
    t = batch.num_tokens
    start, end = int(batch.spans[0, 0]), int(batch.spans[0, 1])
    if not 0 <= start < end <= t:
        raise BatchError(f"spans must be non-empty [start, end) ranges within the batch's {t} tokens")
    if layout.tokens <= LONE_WORDS_TOKENS:
        words, cu = _lone_words(layout, t, start, end, pad_id)
        packed = words.copy()
    else:
        packed = np.zeros(layout.words, dtype=np.int64)
        cu = _fill_lone(packed, layout, t, start, end, pad_id).copy()
    packed[0:t] = batch.token_ids
    return HostMeta(layout=layout, packed=packed, num_tokens=t, num_seqs=1, num_rows=1,
                    max_seqlen=max(t, layout.tokens - t), cu_seqlens=cu)


@functools.lru_cache(maxsize=LONE_WORDS_CACHED)
def _lone_words(layout: MetaLayout, t: int, start: int, end: int, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """The packed words of a lone sequence of `t` tokens pooling [start, end) at `layout`, its ids left 0, and its
    cu_seqlens; both read-only (shared by every batch of that key). ~15 array writes once instead of every step:
    7.9 -> ~2 us of _pack_one on the CPU VM (benchmarks/NOTES.md, "ROSE's host time per step")."""
    packed = np.zeros(layout.words, dtype=np.int64)
    cu = _fill_lone(packed, layout, t, start, end, pad_id).copy()
    packed.flags.writeable = cu.flags.writeable = False
    return packed, cu


def _fill_lone(packed: np.ndarray, layout: MetaLayout, t: int, start: int, end: int, pad_id: int) -> np.ndarray:
    """Write a lone sequence's words but its ids into zeroed `packed`; returns its cu_seqlens (a view into it)."""
    tb = layout.tokens
    packed[t:tb] = pad_id
    packed[tb:tb + t] = np.arange(t, dtype=np.int64)  # positions; padding's stay 0
    packed[2 * tb + t:3 * tb] = 1  # seq ids: 0 for the sequence (already), 1 for the padding pseudo-sequence
    span_index = packed[3 * tb:4 * tb]
    span_index[:] = layout.rows  # tokens outside the span pool into the dummy row
    span_index[start:end] = 0
    cu_at = 5 * tb
    count_at = cu_at + layout.cu_words
    cu = packed[cu_at:count_at].view(np.int32)[: layout.seqs + 1]
    cu[1] = t
    cu[2:] = tb
    counts = packed[count_at:count_at + layout.count_words].view(np.float32)[: layout.rows]
    counts[:] = 1.0
    counts[0] = end - start
    return cu


def _span_index(spans: np.ndarray, seq_ids: np.ndarray, t: int, layout: MetaLayout,
                cu_seqlens: np.ndarray | None = None) -> np.ndarray:
    """int64 [Tb]: the row each token pools into (layout.rows for none). Spans must be non-empty, lie
    inside one sequence, and not overlap (a token feeds at most one row). One row per sequence, pooling
    the whole sequence (mean) or one token of it (CLS, last) as every pooling but late chunking does, takes
    a shortcut: row i is sequence i's, so its spans are valid and disjoint by construction once each lies
    inside its sequence (half of pack_batch's host time at one 128-token query, before)."""
    out = np.full(layout.tokens, layout.rows, dtype=np.int64)
    n = spans.shape[0]
    if n == 0:
        return out
    if cu_seqlens is not None and n == cu_seqlens.shape[0] - 1:
        starts, ends = spans[:, 0], spans[:, 1]
        first, after = cu_seqlens[:-1], cu_seqlens[1:]
        if np.array_equal(starts, first) and np.array_equal(ends, after) and bool(np.all(after > first)):
            # each (non-empty) sequence whole, in order
            out[:t] = seq_ids
            return out
        if np.array_equal(ends - starts, np.ones(n, ends.dtype)) and bool(np.all(starts >= first)) \
                and bool(np.all(ends <= after)):  # one token of each sequence, in order
            out[starts] = np.arange(n, dtype=np.int64)
            return out
    starts, ends = spans[:, 0].astype(np.int64), spans[:, 1].astype(np.int64)
    if int(starts.min()) < 0 or int(ends.max()) > t or bool(np.any(ends <= starts)):
        raise BatchError(f"spans must be non-empty [start, end) ranges within the batch's {t} tokens")
    if bool(np.any(seq_ids[starts] != seq_ids[ends - 1])):
        raise BatchError("a span crosses a sequence boundary")
    order = np.argsort(starts, kind="stable")
    if bool(np.any(starts[order][1:] < ends[order][:-1])):
        raise BatchError("spans overlap: each token may pool into at most one output row")
    lengths = ends - starts
    rows = np.repeat(np.arange(spans.shape[0], dtype=np.int64), lengths)
    offsets = np.arange(int(lengths.sum()), dtype=np.int64) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    out[np.repeat(starts, lengths) + offsets] = rows
    return out
