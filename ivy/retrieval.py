"""Sparse vectors and multi-vector (ColBERT) rows from the served model's outputs (no HTTP in here).

SPLADE answers one vocabulary-wide row per input (output vocab-weights), kept sparse here; BGE-M3 answers one
weight per token (token-weights, asked for with one-token spans of the tokens that count) and one vector
per token but its CLS (token-vectors). rose.retrieval_spec / rose.retrieval_rows hold the model-side rules.
"""

from __future__ import annotations

from functools import cached_property
from typing import Sequence

import numpy as np

from ivy.gateway import Gateway
from rose.retrieval_rows import (m3_excluded_ids, sparse_from_row, sparse_from_tokens, token_vector_spans,
                                 token_weight_spans)
from rose.retrieval_spec import TOKEN_VECTORS, TOKEN_WEIGHTS, VOCAB_WEIGHTS


class Retrieval:
    """One per gateway: which output serves sparse / multi-vector requests and the BGE-M3 excluded ids."""

    def __init__(self, gw: Gateway) -> None:
        self.gw = gw
        heads = gw.spec.retrieval
        self.names = {o.name for o in heads.outputs} if heads is not None else set()

    @cached_property
    def excluded(self) -> frozenset[int]:
        return m3_excluded_ids(self.gw.spec.model_dir, self.gw.tokenizer)

    async def sparse(self, seqs: Sequence[Sequence[int]], *, deadline: float, top_k: int = 0,
                     lane: str | None = None) -> list[tuple[list[int], list[float]]]:
        """(indices, values) per sequence; top_k 0 = the model's max_active_dims (SPLADE), else every weight."""
        if VOCAB_WEIGHTS in self.names:
            top_k = top_k or self.gw.spec.retrieval.max_active_dims
            rows = await self.gw.embed(seqs, deadline=deadline, lane=lane, output=VOCAB_WEIGHTS)
            return [sparse_from_row(row, top_k) for row in rows]
        per_seq = _per_sequence(token_weight_spans(seqs, self.excluded), len(seqs))
        weights = await self._span_rows(seqs, per_seq, TOKEN_WEIGHTS, 1, deadline=deadline, lane=lane)
        return [sparse_from_tokens([ids[start] for start, _ in spans], w[:, 0], top_k)
                for ids, spans, w in zip(seqs, per_seq, weights)]

    async def vectors(self, seqs: Sequence[Sequence[int]], *, deadline: float,
                      lane: str | None = None) -> list[np.ndarray]:
        """float32 [tokens - 1, dim] L2-normalized vectors per sequence (BGE-M3: its CLS left out)."""
        per_seq = _per_sequence(token_vector_spans([len(q) for q in seqs]), len(seqs))
        width = self.gw.spec.retrieval.output(TOKEN_VECTORS).width
        return await self._span_rows(seqs, per_seq, TOKEN_VECTORS, width, deadline=deadline, lane=lane)

    async def _span_rows(self, seqs: Sequence[Sequence[int]], per_seq: list[list[tuple[int, int]]], output: str,
                         width: int, *, deadline: float, lane: str | None) -> list[np.ndarray]:
        """One Gateway.embed of `output` over the sequences' spans; float32 [spans, width] per sequence (a
        sequence without spans, e.g. special tokens only, is not sent and gets no rows)."""
        out = [np.zeros((0, width), np.float32) for _ in seqs]
        keep = [i for i, spans in enumerate(per_seq) if spans]
        if not keep:
            return out
        rows = await self.gw.embed([seqs[i] for i in keep], spans=[per_seq[i] for i in keep], deadline=deadline,
                                   lane=lane, output=output)
        at = 0
        for i in keep:
            out[i] = rows[at:at + len(per_seq[i])]
            at += len(per_seq[i])
        return out


def _per_sequence(triples: Sequence[tuple[int, int, int]], count: int) -> list[list[tuple[int, int]]]:
    """(sequence, start, end) triples -> each sequence's (start, end) spans."""
    per_seq: list[list[tuple[int, int]]] = [[] for _ in range(count)]
    for s, start, end in triples:
        per_seq[s].append((start, end))
    return per_seq


def retrieval_of(gw: Gateway) -> Retrieval:
    """The gateway's Retrieval, made on first use (the multi-vector and sparse routes, MaxSim scoring)."""
    found = getattr(gw, "_retrieval", None)
    if found is None:
        found = gw._retrieval = Retrieval(gw)
    return found
