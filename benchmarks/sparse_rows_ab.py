"""`python -m benchmarks.sparse_rows_ab`: what 100 SPLADE rows (BERT's 30522-wide vocabulary, ~450 non-zeros each,
like real SPLADE documents) cost on the host between ROSE's copy out and Ivy's JSON, in one process, medians of
15; the results are asserted equal first. Host-only (numpy + protobuf): runs on any machine.

  ivy-lists-per-entry  Ivy: flatnonzero per row, then an int() / float() per entry (before 6ee62eb)
  ivy-lists-tolist     Ivy: flatnonzero per row, then tolist() (now)
  tulip-dense          Tulip: the rows' bytes into the response (now)
  tulip-compact        Tulip: the non-zeros found on the host and sent as (index, value) pairs instead
  wire-dense / wire-compact  the payload built, then the response serialized and parsed once (the gRPC hop's
                             copies; fresh 12 MB buffers each round, page faults included, as in a server)
"""
import time

import numpy as np

from protos import embed_pb2

ROWS, VOCAB, NONZERO = 100, 30522, 450
rng = np.random.default_rng(0)
rows = np.zeros((ROWS, VOCAB), np.float32)
for row in rows:
    row[rng.choice(VOCAB, NONZERO, replace=False)] = rng.random(NONZERO, dtype=np.float32) + 0.01


def ivy_lists_per_entry():
    out = []
    for row in rows:
        idx = np.flatnonzero(row > 0)
        out.append(([int(i) for i in idx], [float(v) for v in row[idx]]))
    return out


def ivy_lists_tolist():
    out = []
    for row in rows:
        idx = np.flatnonzero(row > 0)
        out.append((idx.tolist(), row[idx].tolist()))
    return out


def tulip_dense():
    return rows.tobytes()


def tulip_compact():
    mask = rows > 0
    return np.nonzero(mask)[1].astype(np.int32).tobytes() + rows[mask].tobytes() + mask.sum(1, dtype=np.int32).tobytes()


def _wire(payload: bytes):
    return embed_pb2.EmbedResponse.FromString(embed_pb2.EmbedResponse(embeddings=payload, rows=ROWS).SerializeToString())


def wire_dense():
    return _wire(tulip_dense())


def wire_compact():
    return _wire(tulip_compact())


def median_ms(fn, rounds: int = 15) -> float:
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times)) * 1e3


if __name__ == "__main__":
    assert ivy_lists_per_entry() == ivy_lists_tolist()
    for fn in (ivy_lists_per_entry, ivy_lists_tolist, tulip_dense, tulip_compact, wire_dense, wire_compact):
        size = len(fn()) if fn.__name__.startswith("tulip") else ""
        print(f"{fn.__name__.replace('_', '-'):22s} {median_ms(fn):7.2f} ms  {size}")
