"""`python -m benchmarks.pack_batch_ab [REV]`: rose.meta.pack_batch of this tree against REV's (default 58ef75d~1,
before the one-row-per-sequence shortcut), in one process, alternating rounds of 2000 calls, medians of 7;
the packed arrays are asserted equal first. Host-only (numpy): runs on any machine."""
import subprocess
import sys
import time
import types
from pathlib import Path

import numpy as np

import rose.meta as meta
from rose.batch import Batch
from rose.buckets import choose_layout, DEFAULT_TOKEN_BUCKETS as T, DEFAULT_SEQ_BUCKETS as S
REPO = Path(__file__).resolve().parents[1]
REV = sys.argv[1] if len(sys.argv) > 1 else "58ef75d~1"
old_src = subprocess.run(["git", "-C", str(REPO), "show", f"{REV}:rose/meta.py"], capture_output=True, text=True,
                         check=True).stdout
old = types.ModuleType("old_meta")
sys.modules["old_meta"] = old  # dataclasses look their module up
exec(compile(old_src, "old_meta", "exec"), old.__dict__)
rng = np.random.default_rng(0)
cases = {"1x128 mean": ([128], "mean"), "1x128 last": ([128], "last"), "1x32 cls": ([32], "cls"),
         "16x512 mean": ([512] * 16, "mean")}
for name, (lengths, pooling) in cases.items():
    b = Batch.from_sequences([rng.integers(1, 30000, size=n).astype(np.int32) for n in lengths], pooling)
    lay = meta.MetaLayout(*choose_layout(T, S, sum(lengths), len(lengths), len(lengths), max(lengths)))
    old_lay = old.MetaLayout(lay.tokens, lay.seqs, lay.rows, lay.max_seqlen)
    assert np.array_equal(meta.pack_batch(b, lay).packed, old.pack_batch(b, old_lay).packed)
    res = {"old": [], "new": []}
    for r in range(7):
        for tag, mod, l in (("old", old, old_lay), ("new", meta, lay)):
            t0 = time.perf_counter()
            for _ in range(2000):
                mod.pack_batch(b, l, vocab_size=151669, max_length=32768)
            res[tag].append((time.perf_counter() - t0) / 2000 * 1e6)
    print(f"{name:12s} old {np.median(res['old']):6.1f} us  new {np.median(res['new']):6.1f} us")
