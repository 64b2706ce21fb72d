"""CUDA-graph bucket edges and prewarm keys (torch-free: the CLIs and Tulip's config read them).

Why the default token buckets are not only powers of two: padding is paid on every layer, so the steps
grow by at most 1.25-1.33x from 128 tokens up (average waste about 12 %, worst 25 %) while the count of keys stays near
26 token buckets x 9 sequence buckets (and few of those pairs occur in practice). Above 16384 tokens
(Tulip's default batch budget) batches run eagerly: launch overhead is small against that much work,
and a 25 % padding step would cost more than it saves.
"""

from __future__ import annotations

import bisect
from typing import NamedTuple

DEFAULT_TOKEN_BUCKETS = (16, 32, 64, 96, 128, 160, 192, 256, 320, 384, 512, 640, 768, 1024, 1280, 1536,
                         2048, 2560, 3072, 4096, 5120, 6144, 8192, 10240, 12288, 16384)
DEFAULT_SEQ_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
# Mb, the longest-sequence bound in a graph's key, in 4x steps (capped at Tb): every distinct key is one
# more eager cold run and one ~40 ms capture in serving (H200, 0.6B), and mixed traffic makes many. A
# simulation of the stack benchmark's concurrency mix (lognormal documents, 1-16 per batch, 3000 batches;
# benchmarks/NOTES.md) gives 208 distinct keys with Mb on the token buckets and a separate row bucket,
# 66 with these steps and rows folded into the sequence bucket. The price: a varlen kernel's grid may
# hold up to 4x the query blocks a batch needs; the extra blocks find no rows and exit.
MAX_SEQLEN_BUCKETS = (128, 512, 2048, 8192, 32768)

def parse_layouts(text: str) -> list[tuple[int, ...]]:
    """'128x1,512x1,4096x4' -> [(128, 1), (512, 1), (4096, 4)]: (tokens, sequences) keys to prewarm; a named
    set ('singles:512', 'mix:48', rose.prewarm_sets) adds its (tokens, sequences, rows, longest) shapes."""
    from rose.prewarm_sets import expand

    out: list[tuple[int, ...]] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        if ":" in part:
            out.extend(expand(part))
            continue
        tokens, _, seqs = part.partition("x")
        out.append((int(tokens), int(seqs or 1)))
    return out


class Layout(NamedTuple):
    tokens: int  # Tb
    seqs: int  # Sb, counting the padding pseudo-sequence
    rows: int  # Pb
    max_seqlen: int  # Mb: the longest (pseudo-)sequence, bucketed like the tokens


def choose_layout(token_buckets: tuple[int, ...], seq_buckets: tuple[int, ...], num_tokens: int,
                  num_seqs: int, num_rows: int, longest: int) -> Layout | None:
    """The smallest (Tb, Sb, Pb, Mb) that fits a batch, or None above the largest bucket (run eagerly).
    Mb is in the key because varlen kernels size their grid by max_seqlen: passing Tb for a batch of
    short sequences launches Tb/128 query blocks per sequence and head, nearly all idle (measured: the
    100-document batch ran slower as a graph than eagerly); it steps by 4x (MAX_SEQLEN_BUCKETS) to keep
    the count of keys down. Pb (output rows) is at least Sb: one row per sequence is the common case, and
    a separate row bucket would only multiply the keys. Both bucket tuples must be sorted ascending."""
    ti = bisect.bisect_left(token_buckets, num_tokens)
    if ti == len(token_buckets):
        return None
    tb = token_buckets[ti]
    seqs_needed = num_seqs + (1 if tb > num_tokens else 0)  # padding tokens form one pseudo-sequence
    si = bisect.bisect_left(seq_buckets, seqs_needed)
    pi = bisect.bisect_left(seq_buckets, num_rows)
    if si == len(seq_buckets) or pi == len(seq_buckets):
        return None
    need = max(longest, tb - num_tokens, 1)
    mi = bisect.bisect_left(MAX_SEQLEN_BUCKETS, need)
    mb = min(MAX_SEQLEN_BUCKETS[mi], tb) if mi < len(MAX_SEQLEN_BUCKETS) else tb
    return Layout(tb, seq_buckets[si], max(seq_buckets[pi], seq_buckets[si]), mb)
