"""`python -m benchmarks.ids_packing`: Ivy's work on a request of token ids before it leaves for Tulip.

Per request of N ids (N = 128, 512, 4096): the vocabulary check (ivy.tokenization.check_vocab, which returns
the ids as an int32 array) and the EmbedRequest built from the checked arrays (ivy.encode.packed_ids joins
them), against the same request built from the client's Python lists (read a second time, as before the
arrays were kept). Median µs of 2000 rounds after 200 of warm-up, both paths in one process; prints a table.
"""

from __future__ import annotations

import statistics

import numpy as np

from benchmarks.bert_normalizer import median_us
from ivy.encode import embed_request
from ivy.tokenization import check_vocab

VOCAB = 151_669


def main() -> int:
    print(f"{'ids':>6s} {'from lists µs':>14s} {'from arrays µs':>15s} {'saved µs':>9s}")
    for n in (128, 512, 4096):
        ids = [int(t) for t in np.random.default_rng(n).integers(1000, 30000, n)]

        def from_lists(ids=ids, n=n) -> None:
            check_vocab(ids, "input[0]", VOCAB)
            embed_request([ids], n, dimensions=0, normalize=None, encoding=0, request_id="r")

        def from_arrays(ids=ids, n=n) -> None:
            checked = check_vocab(ids, "input[0]", VOCAB)
            embed_request([checked], n, dimensions=0, normalize=None, encoding=0, request_id="r")

        a, b = [], []
        for _ in range(3):  # alternating, the median of three each
            a.append(median_us(from_lists, 2000))
            b.append(median_us(from_arrays, 2000))
        old, new = statistics.median(a), statistics.median(b)
        print(f"{n:6d} {old:14.1f} {new:15.1f} {old - new:9.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
