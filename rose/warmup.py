"""Before a replica reports ready: prewarm CUDA graphs and verify their replay against the eager forward.

Prewarm keys come from the caller (e.g. Tulip's --prewarm '128x1,512x1,2048x8') and from the manifest
of hot layouts recorded from earlier traffic (kept beside the model, `rose_graphs.json`), which also names the
layouts bulk was stepped layer by layer in (their chains of per-layer graphs are prewarmed as well,
`prewarm_chains`). Each key's
layout is run twice on probe inputs (eager warm-up, then capture), then once more by replay, and the
replayed rows are compared with a plain eager run of the same batch (rose.graph_checks.check_replay, the
check every lazily captured graph also gets): a cosine divergence above 0.1 % on any row raises
GraphVerificationError and the replica must refuse to serve. (Capturing at the first probe, without the eager
step, was measured slower per layout: benchmarks/NOTES.md, "Capture cost".)
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable


from rose.graphs import GraphVerificationError, check_replay, layout_label, load_manifest, probe_batch
from rose.layer_steps import step_paced
from rose.meta import MetaLayout

log = logging.getLogger("rose.warmup")
MANIFEST_NAME = "rose_graphs.json"
DEFAULT_PREWARM = ((128, 1), (512, 1), (2048, 8))
REFUSAL = "refusing to serve (driver/GPU/kernel problem?)"
UNREADABLE = (OSError, ValueError, KeyError, TypeError, AttributeError)  # a manifest file that is not one


@dataclass(frozen=True)
class VerifiedLayout:
    layout: MetaLayout
    max_divergence: float
    capture_s: float


def prewarm_shapes(runner, keys: Iterable[tuple[int, int]], manifest: Path | None,
                   limit: int = 64) -> list[tuple[int, int, int, int]]:
    """(tokens, sequences, rows, longest) shapes to capture: the (tokens, sequences) keys split evenly
    (within the model's max length), then the manifest's hot shapes; one per graph layout."""
    max_len = runner.spec.max_length
    shapes = []
    for key in keys:
        if len(key) == 4:  # a whole shape (a named prewarm set's)
            shapes.append(tuple(key))
            continue
        tokens, seqs = key
        seqs = max(seqs, -(-tokens // max_len))
        if seqs <= tokens:
            shapes.append((tokens, seqs, seqs, -(-tokens // seqs)))
    if manifest is not None and manifest.is_file():
        try:
            shapes.extend(load_manifest(manifest)[:limit])
        except UNREADABLE as exc:
            log.warning("ignoring unreadable graph manifest %s: %s", manifest, exc)
    return shapes


def prewarm_and_verify(runner, shapes: Iterable[tuple[int, int, int, int]], pooling: str,
                       express: bool = False) -> list[VerifiedLayout]:
    """Capture the graph of each shape and check replay == eager on fresh probes; raises
    GraphVerificationError on a mismatch. Shapes above the largest bucket or impossible are skipped.
    express: into the express lane's graphs (rose.express), every step (the eager checks too) on that lane."""
    done, seen = [], set()
    graphs = runner.express.graphs if express else runner.graphs
    for shape in shapes:
        batch = probe_batch(shape, runner.vocab_size, pooling, seed=0)
        if batch is None or int(batch.seq_lens.max()) > runner.spec.max_length:
            continue
        layout = graphs.layout_for(batch.num_tokens, batch.num_seqs, batch.num_rows, int(batch.seq_lens.max()))
        if layout is None or layout in seen:
            continue
        seen.add(layout)
        t0 = time.perf_counter()
        while layout not in graphs.graphs and layout not in graphs.eager_only:  # eager warm-up, then the capture
            runner.step(batch, own_layout=True, express=express).result()
        capture_s = time.perf_counter() - t0
        if layout in graphs.refused:  # its first replay already disagreed with eager (rose.graphs)
            raise GraphVerificationError(f"{graphs.eager_only[layout]}; {REFUSAL}")
        if layout in graphs.eager_only:  # the capture failed (logged by rose.graphs): this layout runs eagerly
            continue
        probe = probe_batch(shape, runner.vocab_size, pooling, seed=1)
        replayed = runner.step(probe, own_layout=True, express=express).result()
        eager = runner.step(probe, use_graphs=False, express=express).result()
        try:
            worst = check_replay(layout_label(layout), replayed, eager, graphs.scores)
        except GraphVerificationError as exc:
            raise GraphVerificationError(f"{exc}; {REFUSAL}") from None
        done.append(VerifiedLayout(layout, worst, capture_s))
    return done


def prewarm_chains(runner, manifest: Path | None, pooling: str) -> list[VerifiedLayout]:
    """Capture the layer chains (rose.layer_graphs) of the bulk layouts the manifest names, hottest first, up to the
    chains held: each probe batch stepped by layers until its chain is captured and checked against the eager run
    (the check every chain gets). A chain that disagrees raises GraphVerificationError, as whole-model graphs do;
    one whose capture fails is skipped, and so is a layout not captured within its steppings."""
    chains = runner.layer_chains()
    if chains is None or manifest is None or not manifest.is_file():
        return []
    try:
        shapes = load_manifest(manifest, "chains")
    except UNREADABLE as exc:
        log.warning("ignoring unreadable graph manifest %s: %s", manifest, exc)
        return []
    done = []
    for shape in shapes:
        batch = probe_batch(shape, runner.vocab_size, pooling, seed=0)
        if batch is None or int(batch.seq_lens.max()) > runner.spec.max_length:
            continue
        layout = chains.layout_for(batch.num_tokens, batch.num_seqs, batch.num_rows, int(batch.seq_lens.max()))
        if layout is None or layout in chains.chains:
            continue
        if len(chains.chains) >= chains.max_chains:
            break
        t0, sights = time.perf_counter(), chains.seen[layout]
        for _ in range(chains.capture_after + 1):  # eager warm-up(s), then the capture
            if layout in chains.chains or layout in chains.eager_only:
                break
            step_paced(runner, batch, ahead=len(chains.chunks) + 1).result()  # never waits: one batch in flight
        chains.seen[layout] = sights  # probes are not traffic: the manifest keeps what serving met
        if layout in chains.refused:
            raise GraphVerificationError(f"layer chain {layout_label(layout)}: {chains.eager_only[layout]}; {REFUSAL}")
        if layout not in chains.chains:  # its capture failed, or it was not captured (the chains' lock was held)
            continue
        done.append(VerifiedLayout(layout, chains.divergence[layout], time.perf_counter() - t0))
    if done:
        log.info("layer chains prewarmed: %s", ", ".join(layout_label(v.layout) for v in done))
    return done
