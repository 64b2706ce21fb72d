"""A captured larger layout for a batch whose own layout has no graph yet (torch-free).

A layout without its graph costs the request that meets it an eager run (launch-bound: ~6x a replay for the
0.6B at 128 tokens on the H200) and, at its next sight, a capture (~40 ms, queued requests wait it out):
the steady-state tails of a replica under mixed traffic. Most such batches fit a layout that is captured
(the prewarm sets hold the common ones): replaying that one costs only its padding. Bounds on the padding:
up to 2x the tokens of the batch's own bucket up to 1024 tokens (where a forward is launch-bound and padding
nearly free), 1.34x above (where compute grows with the tokens and an eager run costs little more than a
replay). A graph fits a batch when its tokens, sequences (with the padding pseudo-sequence) and rows hold
the batch's and its max-seqlen bound holds both the longest sequence and the padding (rose.buckets).
After SUBSTITUTE_SIGHTS sights a layout takes the lazy path (eager, then capture) like any other: a layout
that stays frequent gets its own graph once, a rare one never costs a capture.
"""

from __future__ import annotations

from typing import Iterable

from rose.meta import MetaLayout

SUBSTITUTE_SIGHTS = 32
SMALL_TOKENS = 1024
SMALL_RATIO, LARGE_RATIO = 2.0, 1.34


def padding_bound(exact: MetaLayout) -> int:
    """The most tokens a substitute for `exact` may have."""
    ratio = SMALL_RATIO if exact.tokens <= SMALL_TOKENS else LARGE_RATIO
    return int(exact.tokens * ratio)


def holds(graph: MetaLayout, num_tokens: int, num_seqs: int, num_rows: int, longest: int) -> bool:
    if not graph.fits(num_tokens, num_seqs, num_rows):
        return False
    return max(longest, graph.tokens - num_tokens, 1) <= graph.seqlen_bound


def find_substitute(exact: MetaLayout, captured: Iterable[MetaLayout], num_tokens: int, num_seqs: int,
                    num_rows: int, longest: int) -> MetaLayout | None:
    """The smallest captured layout within `exact`'s padding bound that holds the batch, or None. A linear
    scan of the captured layouts (~100): it runs only for batches whose own layout has no graph."""
    bound = padding_bound(exact)
    fits = [g for g in captured if g.tokens <= bound and holds(g, num_tokens, num_seqs, num_rows, longest)]
    return min(fits, key=lambda g: (g.tokens, g.seqs, g.rows, g.seqlen_bound)) if fits else None
