"""How the gateway splits one request's sequences into chunks, each sent as one EmbedRequest (pure, no I/O).

ivy.gateway (Gateway.embed) plans a request's chunks here by the token budget and sequence count
(chunk_max_tokens, chunk_max_seqs) and reassembles their rows in input order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class Chunk:
    """A contiguous run of sequences sent as one EmbedRequest; `rows` output rows come back."""

    first: int  # index of the first sequence
    count: int
    tokens: int
    rows: int


def plan_chunks(lengths: Sequence[int], rows_per_seq: Sequence[int], max_tokens: int, max_seqs: int) -> list[Chunk]:
    """Greedy split in input order: a chunk takes sequences while its tokens fit `max_tokens` and its
    sequences `max_seqs`; a sequence longer than the budget goes alone."""
    chunks: list[Chunk] = []
    first, tokens, rows = 0, 0, 0
    for i, n in enumerate(lengths):
        count = i - first
        if count and (tokens + n > max_tokens or count >= max_seqs):
            chunks.append(Chunk(first, count, tokens, rows))
            first, tokens, rows = i, 0, 0
        tokens += n
        rows += rows_per_seq[i]
    if len(lengths) > first:
        chunks.append(Chunk(first, len(lengths) - first, tokens, rows))
    return chunks
