"""What a CUDA graph is checked with: the replay-vs-eager comparison, probe batches of a recorded shape, and the
manifest of hot shapes those probes come from (torch-free; rose.graphs re-exports all of it).

The comparison: per-row cosine divergence (1 - cos) between a graph's replayed rows and the eager forward's
rows of the same batch, at most VERIFY_MAX_DIVERGENCE (0.1 %) on every row, and every replayed value
finite. Rows of width 1 (a cross-encoder's scores, where a cosine only compares signs) and a score head's rows
(`scores`: a classifier's logits, a handful of numbers whose cosine swings where they lie near 0) are compared by
their difference instead: at most VERIFY_MAX_SCORE_ERROR, relative to the score where it is above 1. Prewarm (rose.warmup) refuses to serve on a mismatch; a graph captured lazily in serving that fails
it is dropped and its layout runs eagerly (rose.graphs).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from rose.batch import Batch

VERIFY_MAX_DIVERGENCE = 1e-3  # cosine divergence (1 - cos) between graph and eager output, per row
VERIFY_MAX_SCORE_ERROR = 1e-2  # |graph - eager| / max(1, |eager|) per score (sigmoid scores lie in [0, 1])


class GraphVerificationError(RuntimeError):
    """Graph replay disagrees with the eager forward: the graph must not be used."""


def check_replay(label: str, replayed: np.ndarray, eager: np.ndarray, scores: bool = False) -> float:
    """The worst row's divergence of `replayed` from `eager` (the real rows of one batch); raises
    GraphVerificationError above VERIFY_MAX_DIVERGENCE or when the replay is not finite. scores: the rows are a
    score head's (CudaGraphs.scores), compared by difference whatever their width."""
    scores = scores or (replayed.ndim == 2 and replayed.shape[1] == 1)
    what, bar = ("score error", VERIFY_MAX_SCORE_ERROR) if scores else ("cosine divergence", VERIFY_MAX_DIVERGENCE)
    if not len(replayed):
        worst = 0.0
    elif scores:
        worst = float((np.abs(replayed.astype(np.float64) - eager) / np.maximum(1.0, np.abs(eager))).max())
    else:
        worst = float(cosine_divergence(replayed, eager).max())
    if not np.isfinite(replayed).all() or not worst <= bar:
        raise GraphVerificationError(f"CUDA graph {label} disagrees with the eager forward: {what} "
                                     f"{worst:.2e} > {bar:.0e}")
    return worst


def load_manifest(path: Path, key: str = "shapes") -> list[tuple[int, int, int, int]]:
    """(tokens, sequences, rows, longest) batch shapes, hottest first: whole-model graphs' ("shapes") or the layer
    chains' ("chains")."""
    data = json.loads(Path(path).read_text())
    return [(int(t), int(s), int(p), int(m)) for t, s, p, m, *_ in data.get(key, [])]


def probe_batch(shape: tuple[int, int, int, int], vocab_size: int, pooling: str, seed: int = 0) -> Batch | None:
    """A random batch of the given (tokens, sequences, rows, longest) shape, so it maps to the same graph
    layout as the traffic it stands for: one sequence of `longest` tokens, the rest split evenly; rows
    beyond one per sequence become late-chunking spans. None when the shape is impossible."""
    tokens, seqs, rows, longest = shape
    rest = tokens - longest
    if seqs < 1 or longest < 1 or rest < seqs - 1 or (seqs == 1 and rest) or rows < seqs or rows > tokens:
        return None
    lengths = [longest] + [rest // (seqs - 1) + (1 if i < rest % (seqs - 1) else 0) for i in range(seqs - 1)]
    if max(lengths) > longest:
        return None
    rng = np.random.default_rng(seed + 7919 * tokens + 31 * seqs + rows)
    ids = [rng.integers(1, max(2, vocab_size), size=n).astype(np.int32) for n in lengths]
    if rows == seqs:
        return Batch.from_sequences(ids, pooling)
    spans, extra = [], rows - seqs  # split sequences into more spans until there are `rows` of them
    for i, n in enumerate(lengths):
        k = 1 + min(extra, n - 1)
        extra -= k - 1
        bounds = np.linspace(0, n, k + 1).astype(int)
        spans += [(i, int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]
    return Batch.from_sequences(ids, spans=spans) if extra == 0 else None


def cosine_divergence(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per-row 1 - cos(a, b) in float64."""
    a = a.astype(np.float64)
    b = b.astype(np.float64)
    num = (a * b).sum(axis=1)
    den = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    return 1.0 - num / np.maximum(den, 1e-30)
