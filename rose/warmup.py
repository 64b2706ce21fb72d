"""Before a replica reports ready: prewarm CUDA graphs and verify their replay against the eager forward.

Prewarm keys come from the caller (e.g. Tulip's --prewarm '128x1,512x1,2048x8') and from the manifest
of hot layouts recorded from earlier traffic (kept beside the model, `rose_graphs.json`). Each key's
layout is run twice on probe inputs (eager warm-up, then capture), then once more by replay, and the
replayed rows are compared with a plain eager run of the same batch: a cosine divergence above 0.1 %
on any row raises GraphVerificationError and the replica must refuse to serve.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import numpy as np

from rose.batch import Batch
from rose.graphs import (VERIFY_MAX_DIVERGENCE, GraphVerificationError, cosine_divergence, layout_label,
                         load_manifest, probe_sequences)
from rose.meta import MetaLayout

log = logging.getLogger("rose.warmup")
MANIFEST_NAME = "rose_graphs.json"
DEFAULT_PREWARM = ((128, 1), (512, 1), (2048, 8))


@dataclass(frozen=True)
class VerifiedLayout:
    layout: MetaLayout
    max_divergence: float
    capture_s: float


def default_manifest_path(model_dir: Path) -> Path | None:
    """Beside the model when that folder is writable, else under ~/.cache/rose/<folder name>/."""
    if os.access(model_dir, os.W_OK):
        return model_dir / MANIFEST_NAME
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "rose" / model_dir.name
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return cache / MANIFEST_NAME


def prewarm_layouts(runner, keys: Iterable[tuple[int, int]], manifest: Path | None,
                    limit: int = 64) -> list[MetaLayout]:
    """Bucket layouts for (tokens, sequences) keys plus the manifest's hot layouts, de-duplicated."""
    graphs = runner.graphs
    out: list[MetaLayout] = []
    for tokens, seqs in keys:
        layout = graphs.layout_for(tokens, seqs, seqs)
        if layout is not None:
            out.append(layout)
    if manifest is not None and manifest.is_file():
        try:
            out.extend(load_manifest(manifest)[:limit])
        except (OSError, ValueError, KeyError) as exc:
            log.warning("ignoring unreadable graph manifest %s: %s", manifest, exc)
    seen, unique = set(), []
    for layout in out:
        if layout not in seen and layout.tokens in graphs.token_buckets:
            seen.add(layout)
            unique.append(layout)
    return unique


def prewarm_and_verify(runner, layouts: Iterable[MetaLayout], pooling: str) -> list[VerifiedLayout]:
    """Capture each layout and check replay == eager on fresh probes; raises GraphVerificationError."""
    done = []
    for layout in layouts:
        seqs = probe_sequences(layout, runner.vocab_size, runner.spec.max_length)
        if seqs is None:
            continue  # no valid batch has this layout for this model (sequences would exceed max_length)
        batch = Batch.from_sequences(seqs, pooling)
        if runner.graphs.layout_for(batch.num_tokens, batch.num_seqs, batch.num_rows) != layout:
            continue
        t0 = time.perf_counter()
        while layout not in runner.graphs.graphs:  # eager warm-up run(s), then the capture
            runner.step(batch).result()
        capture_s = time.perf_counter() - t0
        probe = Batch.from_sequences(probe_sequences(layout, runner.vocab_size, runner.spec.max_length, seed=1),
                                     pooling)
        replayed = runner.step(probe).result()
        eager = runner.step(probe, use_graphs=False).result()
        worst = float(cosine_divergence(replayed, eager).max())
        if not np.isfinite(replayed).all() or worst > VERIFY_MAX_DIVERGENCE:
            raise GraphVerificationError(
                f"CUDA graph {layout_label(layout)} disagrees with the eager forward: cosine divergence "
                f"{worst:.2e} > {VERIFY_MAX_DIVERGENCE:.0e}; refusing to serve (driver/GPU/kernel problem?)")
        done.append(VerifiedLayout(layout, worst, capture_s))
    return done
