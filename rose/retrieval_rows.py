"""The host side of sparse and multi-vector outputs (numpy): which spans to ask for, and rows -> results.

A request for `token-vectors` / `token-weights` (BGE-M3) asks for one-token spans; the rows that come back are
turned into what users get here: sparse (ids, weights) pairs (ids ascending; `top_k` keeps the k largest
weights) and MaxSim late-interaction scores. rose.retrieval_spec describes the outputs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from rose.spec import _optional_json
from rose.tokenizer_configs import token_text

M3_EXCLUDED_TOKENS = ("cls_token", "eos_token", "pad_token", "unk_token")  # FlagEmbedding's unused_tokens


def m3_excluded_ids(model_dir: Path, tokenizer) -> frozenset[int]:
    """The ids BGE-M3 leaves out of its sparse weights: its tokenizer's cls, eos, pad and unk tokens."""
    found = {}
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        cfg = _optional_json(Path(model_dir) / name) or {}
        for key in M3_EXCLUDED_TOKENS:
            text = token_text(cfg.get(key))
            if text is not None:
                found[key] = text
    ids = {tokenizer.token_id(text) for text in found.values()}
    return frozenset(i for i in ids if i is not None)


def token_vector_spans(lengths: Sequence[int]) -> list[tuple[int, int, int]]:
    """(sequence, start, end) of every token but the first (BGE-M3 drops its CLS vector)."""
    return [(s, t, t + 1) for s, n in enumerate(lengths) for t in range(1, n)]


def token_weight_spans(sequences: Sequence[Sequence[int]], excluded: frozenset[int]) -> list[tuple[int, int, int]]:
    """(sequence, start, end) of every token whose id has a sparse weight (not an excluded special)."""
    return [(s, t, t + 1) for s, ids in enumerate(sequences) for t, tok in enumerate(ids) if int(tok) not in excluded]


def sparse_from_row(row: np.ndarray, top_k: int = 0) -> tuple[list[int], list[float]]:
    """A vocabulary-wide row (SPLADE) -> its non-zero entries, ids ascending; top_k > 0 keeps the k largest."""
    idx = np.flatnonzero(row > 0)
    return _top(idx, row[idx], top_k)


def sparse_from_tokens(ids: Sequence[int], weights: np.ndarray, top_k: int = 0) -> tuple[list[int], list[float]]:
    """Per-token weights (BGE-M3) -> one weight per id, the max over its occurrences, weights > 0 only."""
    ids_arr = np.asarray(ids, dtype=np.int64)
    w = np.asarray(weights, dtype=np.float32).reshape(-1)
    if ids_arr.size == 0:
        return [], []
    uniq, inverse = np.unique(ids_arr, return_inverse=True)
    best = np.zeros(uniq.shape[0], dtype=np.float32)
    np.maximum.at(best, inverse, w)
    keep = best > 0
    return _top(uniq[keep], best[keep], top_k)


def _top(idx: np.ndarray, values: np.ndarray, top_k: int) -> tuple[list[int], list[float]]:
    if top_k and idx.size > top_k:
        chosen = np.sort(np.argsort(-values, kind="stable")[:top_k])
        idx, values = idx[chosen], values[chosen]
    return idx.tolist(), values.tolist()  # Python ints and floats, 3x faster than one int()/float() each


def maxsim(query: np.ndarray, document: np.ndarray) -> float:
    """BGE-M3's late-interaction score: the mean over query vectors of the best dot product with a document vector
    (both sides L2-normalized, CLS left out). Follows FlagEmbedding's BGEM3FlagModel.colbert_score (inference):
    einsum('in,jn->ij'), max over the document's j, summed and divided by the query's vector count; its
    training BGEM3Model.colbert_score divides by q_mask[:, 1:].sum(), the same count without padding.
    0 when either side has no vectors (an input of its CLS only)."""
    if query.shape[0] == 0 or document.shape[0] == 0:
        return 0.0
    return float((query @ document.T).max(axis=1).mean())
