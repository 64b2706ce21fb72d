"""Warm-up verification: the stack's embeddings of a fixed probe set against a reference file.

Why first: a fast server that embeds wrongly (bad pooling, a broken kernel, the wrong model behind the
URL) must not produce a benchmark. Each probe's cosine divergence (1 - cos) must be at most the
tolerance (0.1 % by default) or the run stops with a non-zero exit. Cosine, not element-wise
comparison, so normalized, unnormalized and int8-quantized outputs compare alike.

The reference file (JSON, written by `python -m benchmarks.stack.reference`) carries its probe texts,
so the check always compares the same inputs, whatever corpus the client machine has.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.stack.client import StackClient
from benchmarks.stack.corpus import Corpus

FIXED_PROBES = (
    "What is the capital of France?",
    "Paris is the capital and largest city of France, on the Seine.",
    "def add(a, b):\n    return a + b",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "The meeting was moved to Thursday at 3 pm because two speakers were travelling.",
    "Größere Modelle brauchen mehr Speicher; la mémoire coûte cher.",
    "SELECT name, count(*) FROM users GROUP BY name HAVING count(*) > 1;",
    "1 2 3 4 5 6 7 8 9 10",
)
PROBE_WORDS = (8, 24, 48, 72, 96)  # corpus probes, also capped at PROBE_CHARS
PROBE_CHARS = 400  # code-like text runs ~2 chars a token: <= ~200 tokens, under every model's limit


class VerificationError(RuntimeError):
    """The stack's embeddings diverge from the reference (or cannot be compared to it)."""


def default_probes(seed: int = 1234) -> list[str]:
    """The fixed sentences plus corpus paragraphs cut to a few word counts (deterministic)."""
    corpus = Corpus.load()
    rng = random.Random(seed)
    probes = list(FIXED_PROBES)
    for n_words in PROBE_WORDS:
        for _ in range(2):
            start = rng.randrange(len(corpus.paragraphs))
            words: list[str] = []
            i = start
            while len(words) < n_words:
                words.extend(corpus.paragraphs[i % len(corpus.paragraphs)].split())
                i += 1
            text = " ".join(words[:n_words])
            if len(text) > PROBE_CHARS:
                text = text[: text.rfind(" ", 0, PROBE_CHARS)]
            probes.append(text)
    return probes


def write_reference(path: Path, probes: list[str], embeddings: np.ndarray, meta: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {**meta, "probes": probes, "dimensions": int(embeddings.shape[1]),
            "embeddings": [[float(x) for x in row] for row in np.asarray(embeddings, dtype=np.float32)]}
    path.write_text(json.dumps(body) + "\n")


def load_reference(path: Path) -> tuple[list[str], np.ndarray, dict[str, Any]]:
    try:
        body = json.loads(Path(path).read_text())
        probes = [str(p) for p in body["probes"]]
        matrix = np.asarray(body["embeddings"], dtype=np.float64)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise VerificationError(f"cannot read the reference file {path}: {exc}") from None
    if matrix.ndim != 2 or len(probes) != matrix.shape[0] or not probes:
        raise VerificationError(f"reference file {path}: {len(probes)} probes but embeddings of shape {matrix.shape}")
    meta = {k: v for k, v in body.items() if k not in ("probes", "embeddings")}
    return probes, matrix, meta


def cosine_divergence(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """1 - cos per row; a zero row counts as fully divergent."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    cos = np.where(norms > 0, np.sum(a * b, axis=1) / np.maximum(norms, 1e-300), 0.0)
    return 1.0 - cos


def verify(client: StackClient, reference: Path, tolerance: float) -> dict[str, Any]:
    """Embed the reference's probes through the stack (one request, floats) and compare by cosine."""
    probes, expected, meta = load_reference(reference)
    got, _ = client.embeddings(probes, encoding_format="float")
    if got.shape != expected.shape:
        raise VerificationError(f"the stack returned embeddings of shape {got.shape}; the reference has "
                                f"{expected.shape} (another model, or a dimensions default?)")
    divergence = cosine_divergence(got, expected)
    worst = int(np.argmax(divergence))
    summary = {"reference": str(reference), "reference_meta": meta, "probes": len(probes),
               "tolerance": tolerance, "max_divergence": float(divergence[worst]),
               "mean_divergence": float(divergence.mean()),
               "per_probe": [float(d) for d in divergence], "passed": bool(divergence[worst] <= tolerance)}
    if not summary["passed"]:
        bad = int(np.sum(divergence > tolerance))
        raise VerificationError(
            f"verification failed: {bad} of {len(probes)} probes diverge from {reference}; the worst, probe "
            f"{worst} ({probes[worst][:40]!r}...), by {100 * divergence[worst]:.4f} % "
            f"(limit {100 * tolerance:.4f} %). Is the right model behind the URL?")
    return summary
