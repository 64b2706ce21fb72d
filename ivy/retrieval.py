"""Sparse vectors and multi-vector (ColBERT) rows from the served model's outputs (no HTTP in here).

SPLADE answers one vocabulary-wide row per input (output vocab-weights), kept sparse here; BGE-M3 answers one
weight per token (token-weights, asked for with one-token spans of the tokens that count) and one vector
per token but its CLS (token-vectors). rose.retrieval_spec / rose.retrieval_rows hold the model-side rules.

Those rows are bounded before anything is sent (--max-output-values-per-request): token vectors are tokens x
width floats (BGE-M3: 1024 a token, 8192 tokens an input) and SPLADE's rows cross from Tulip vocabulary-wide
(inputs x vocabulary), so a body under the payload limit could otherwise make GBs in one worker.
"""

from __future__ import annotations

from functools import cached_property
from typing import Sequence

import numpy as np

from ivy.errors import IvyError, Problem
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

    async def sparse(self, seqs: Sequence[Sequence[int]], *, deadline: float, top_k: int | None = None,
                     lane: str | None = None, param: str) -> list[tuple[list[int], list[float]]]:
        """(ids, weights) per sequence, ids ascending. top_k: the k largest weights; 0 = every non-zero weight;
        None = the model's default (SPLADE's max_active_dims when its folder sets one, else every weight), so
        that a client can still ask for all of them from a model that keeps fewer by default. param: the field
        named when the rows would pass the output bound (refuse_large_output)."""
        if top_k is None:
            top_k = self.gw.spec.retrieval.max_active_dims if VOCAB_WEIGHTS in self.names else 0
        if VOCAB_WEIGHTS in self.names:
            self.refuse_large_output(len(seqs), VOCAB_WEIGHTS, param)
            rows = await self.gw.embed(seqs, deadline=deadline, lane=lane, output=VOCAB_WEIGHTS)
            return [sparse_from_row(row, top_k) for row in rows]
        per_seq = _per_sequence(token_weight_spans(seqs, self.excluded), len(seqs))
        weights = await self._span_rows(seqs, per_seq, TOKEN_WEIGHTS, deadline=deadline, lane=lane, param=param)
        return [sparse_from_tokens([ids[start] for start, _ in spans], w[:, 0], top_k)
                for ids, spans, w in zip(seqs, per_seq, weights)]

    async def vectors(self, seqs: Sequence[Sequence[int]], *, deadline: float, lane: str | None = None,
                      param: str) -> list[np.ndarray]:
        """float32 [tokens - 1, dim] L2-normalized vectors per sequence (BGE-M3: its CLS left out). param: the
        field named when they would pass the output bound (refuse_large_output)."""
        per_seq = _per_sequence(token_vector_spans([len(q) for q in seqs]), len(seqs))
        return await self._span_rows(seqs, per_seq, TOKEN_VECTORS, deadline=deadline, lane=lane, param=param)

    def refuse_large_output(self, rows: int, output: str, param: str) -> None:
        """413 naming `param` when `rows` rows of `output` would hold more than --max-output-values-per-request
        float values: refused before any work reaches a replica, as a body over the payload limit is refused
        before it is parsed."""
        width = self.gw.spec.retrieval.output(output).width
        limit = self.gw.config.max_output_values_per_request
        if rows * width > limit:
            raise IvyError(Problem.PAYLOAD_TOO_LARGE, f"{param} would make {rows} x {width} = {rows * width} output "
                           f"values ({output}); at most {limit} are allowed per request; send fewer or shorter "
                           "inputs", param=param, limit=limit)

    async def _span_rows(self, seqs: Sequence[Sequence[int]], per_seq: list[list[tuple[int, int]]], output: str, *,
                         deadline: float, lane: str | None, param: str) -> list[np.ndarray]:
        """One Gateway.embed of `output` over the sequences' spans; float32 [spans, width] per sequence (a
        sequence without spans, e.g. special tokens only, is not sent and gets no rows)."""
        self.refuse_large_output(sum(map(len, per_seq)), output, param)
        width = self.gw.spec.retrieval.output(output).width
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
