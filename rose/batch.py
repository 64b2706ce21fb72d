"""The host-side batch that ROSE embeds: ragged sequences back to back, and the spans to pool.

Every output row is the mean of the final hidden states over one span of absolute token positions.
That one rule covers every pooling: mean = the whole sequence, CLS = its first token, last-token = its
last token, late chunking = each chunk's span. So a batch can mix requests of any pooling, and the
device-side pooler is a single segment-mean.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

POOLINGS = ("mean", "cls", "last")


@dataclass(frozen=True)
class Batch:
    token_ids: np.ndarray  # int32 [T]: every sequence's ids back to back, no padding
    seq_lens: np.ndarray  # int32 [S]: length of each sequence, each >= 1
    spans: np.ndarray  # int32 [P, 2]: absolute [start, end) token offsets; one output row per span
    token_types: np.ndarray | None = None  # int32 [T]: BERT token types (a pair's second text is 1); None = 0

    def __post_init__(self) -> None:
        if self.token_ids.dtype != np.int32 or self.seq_lens.dtype != np.int32 or self.spans.dtype != np.int32:
            raise TypeError("Batch arrays must be int32")
        if self.token_ids.ndim != 1 or self.seq_lens.ndim != 1 or self.spans.ndim != 2 or self.spans.shape[1] != 2:
            raise ValueError("Batch shapes: token_ids [T], seq_lens [S], spans [P, 2]")
        if self.token_types is not None and (self.token_types.dtype != np.int32
                                             or self.token_types.shape != self.token_ids.shape):
            raise ValueError("Batch token_types must be int32 [T], like token_ids")
        if int(self.seq_lens.sum()) != self.token_ids.shape[0]:
            raise ValueError("sum(seq_lens) must equal len(token_ids)")
        if self.seq_lens.size and int(self.seq_lens.min()) < 1:
            raise ValueError("every sequence needs at least one token")

    @property
    def num_tokens(self) -> int:
        return int(self.token_ids.shape[0])

    @property
    def num_seqs(self) -> int:
        return int(self.seq_lens.shape[0])

    @property
    def num_rows(self) -> int:
        return int(self.spans.shape[0])

    @property
    def cu_seqlens(self) -> np.ndarray:
        """int32 [S + 1] cumulative sequence offsets, starting at 0."""
        out = np.zeros(self.num_seqs + 1, dtype=np.int32)
        np.cumsum(self.seq_lens, out=out[1:])
        return out

    @property
    def positions(self) -> np.ndarray:
        """int32 [T] position of each token within its own sequence."""
        starts = np.repeat(self.cu_seqlens[:-1], self.seq_lens)
        return (np.arange(self.num_tokens, dtype=np.int32) - starts).astype(np.int32)

    @classmethod
    def from_sequences(
        cls,
        sequences: Sequence[Sequence[int]] | Sequence[np.ndarray],
        pooling: str = "mean",
        spans: Sequence[tuple[int, int, int]] | None = None,
        token_types: Sequence[Sequence[int]] | None = None,
    ) -> "Batch":
        """Pack token-id lists; one row per sequence pooled by `pooling`, or one row per
        (sequence index, start, end) span, start/end relative to that sequence. `token_types`: one list per
        sequence, as long as its ids (BERT pairs), or None for type 0 everywhere."""
        arrays = [np.asarray(s, dtype=np.int32) for s in sequences]
        seq_lens = np.array([a.shape[0] for a in arrays], dtype=np.int32)
        token_ids = np.concatenate(arrays).astype(np.int32) if arrays else np.zeros(0, np.int32)
        starts = np.zeros(len(arrays), dtype=np.int64)
        if len(arrays) > 1:
            np.cumsum(seq_lens[:-1], out=starts[1:])
        if spans is None:
            rows = sequence_spans(starts, seq_lens, pooling)
        else:
            rows = np.zeros((len(spans), 2), dtype=np.int32)
            for i, (seq, start, end) in enumerate(spans):
                if not (0 <= seq < len(arrays)) or not (0 <= start < end <= seq_lens[seq]):
                    raise ValueError(f"span {i} ({seq}, {start}, {end}) is outside its sequence")
                rows[i] = (starts[seq] + start, starts[seq] + end)
        types = None
        if token_types is not None:
            if len(token_types) != len(arrays) or any(len(t) != a.shape[0] for t, a in zip(token_types, arrays)):
                raise ValueError("token_types needs one list per sequence, as long as its token ids")
            types = (np.concatenate([np.asarray(t, dtype=np.int32) for t in token_types]).astype(np.int32)
                     if len(token_types) else np.zeros(0, np.int32))
        return cls(token_ids=token_ids, seq_lens=seq_lens, spans=rows, token_types=types)


def sequence_spans(starts: np.ndarray, seq_lens: np.ndarray, pooling: str) -> np.ndarray:
    """[S, 2] absolute spans that pool each whole sequence the given way."""
    starts = np.asarray(starts, dtype=np.int64)
    ends = starts + np.asarray(seq_lens, dtype=np.int64)
    if pooling == "mean":
        rows = np.stack([starts, ends], axis=1)
    elif pooling == "cls":
        rows = np.stack([starts, starts + 1], axis=1)
    elif pooling == "last":
        rows = np.stack([ends - 1, ends], axis=1)
    else:
        raise ValueError(f"unknown pooling {pooling!r}; expected one of {POOLINGS}")
    return rows.astype(np.int32).reshape(-1, 2)
