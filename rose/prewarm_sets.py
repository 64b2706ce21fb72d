"""Named prewarm sets: graph layouts to capture before ready, beyond explicit TOKENSxSEQS keys (torch-free).

Every layout a replica meets without its graph costs a request an eager first run and, on its second
sight, a capture (~40-60 ms for the 0.6B on the H200, verification included): the tails of a fresh
replica. Two sets take the common ones off the request path at start:

- `singles:N`: every layout a single sequence of 1..N tokens can take (one query or one chunk per batch,
  the interactive case). Enumerated, not sampled: about 30 layouts for N = 512 with the default buckets.
- `mix:K`: the K most frequent layouts of simulated short-document traffic: batches of 1..16 documents of
  lognormal length (median 128 tokens, sigma 0.8, clipped to 16..512), as concurrent queries and RAG
  chunks form them. This assumes that shape of traffic (it is also the stack benchmark's concurrency mix);
  other traffic is covered after a restart by the manifest recorded from it (TULIP_GRAPH_MANIFEST).
Both yield (tokens, sequences, rows, longest) shapes; the prewarm dedupes them by layout.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from rose.buckets import DEFAULT_SEQ_BUCKETS, DEFAULT_TOKEN_BUCKETS, choose_layout

Shape = tuple[int, int, int, int]


def single_sequence_shapes(max_tokens: int) -> list[Shape]:
    """One shape per distinct layout of a lone sequence of 1..max_tokens tokens."""
    seen, out = set(), []
    for n in range(1, max_tokens + 1):
        layout = choose_layout(DEFAULT_TOKEN_BUCKETS, DEFAULT_SEQ_BUCKETS, n, 1, 1, n)
        if layout is not None and layout not in seen:
            seen.add(layout)
            out.append((n, 1, 1, n))
    return out


def short_document_mix_shapes(count: int, max_tokens: int = 8192, draws: int = 4000, seed: int = 0) -> list[Shape]:
    """The `count` most frequent layouts of the simulated mix (module docstring), hottest first."""
    rng = np.random.default_rng(seed)
    hits: Counter = Counter()
    example: dict = {}
    for _ in range(draws):
        lengths = np.clip(rng.lognormal(np.log(128), 0.8, int(rng.integers(1, 17))), 16, 512).astype(int)
        n, s, longest = int(lengths.sum()), len(lengths), int(lengths.max())
        if n > max_tokens:
            continue
        layout = choose_layout(DEFAULT_TOKEN_BUCKETS, DEFAULT_SEQ_BUCKETS, n, s, s, longest)
        if layout is None:
            continue
        hits[layout] += 1
        example.setdefault(layout, (n, s, s, longest))
    return [example[layout] for layout, _ in hits.most_common(count)]


def expand(word: str) -> list[Shape]:
    """'singles:512' or 'mix:48' -> shapes; ValueError naming the word otherwise."""
    name, _, arg = word.partition(":")
    if not arg.isdigit():
        raise ValueError(f"prewarm set {word!r} needs a count, e.g. singles:512 or mix:48")
    if name == "singles":
        return single_sequence_shapes(int(arg))
    if name == "mix":
        return short_document_mix_shapes(int(arg))
    raise ValueError(f"unknown prewarm set {name!r} (known: singles:N, mix:K)")
