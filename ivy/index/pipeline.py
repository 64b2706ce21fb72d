"""The job: windows of input positions -> length-sorted batches on `--concurrency` threads -> one shard each.

Window k is positions [k*W, (k+1)*W) of the input, whatever happened before: a resumed run starts reading at
the first uncommitted window and forms the same windows, sorts them the same way and writes the same shards,
so every input id ends up exactly once in the output (or in rejects.jsonl, as is a repeat of an earlier id).
Batches of up to two windows are in flight at once (bounded by a semaphore), so the replicas stay busy across a
window's boundary while memory holds at most a few windows, however large the input. Windows are committed in
order.
"""

from __future__ import annotations

import logging
import re
import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np

from ivy.index.client import FatalError, RowError
from ivy.index.config import IndexConfig
from ivy.index.progress import Progress
from ivy.index.sink import Layout, Sink
from ivy.index.sources import Doc, count_docs, detect_format, fingerprint, read_docs, unique_ids

log = logging.getLogger("ivy.index")
_INPUT_REF = re.compile(r"\binput\[\d+\]")
_PROBE = "dimension probe"


def request_options(config: IndexConfig) -> dict:
    """The /v1/embeddings options this job sends with every batch (truncate always: servers differ)."""
    out = {"truncate": config.truncate, "truncation_side": config.truncation_side}
    if config.dimensions:
        out["dimensions"] = config.dimensions
    if config.normalize is not None:
        out["normalize"] = config.normalize
    if config.input_type:
        out["input_type"] = config.input_type
    if config.prompt_name:
        out["prompt_name"] = config.prompt_name
    return out


def embed_resolving(embedder, texts: list[str]) -> tuple[list, list[tuple[int, str]], int]:
    """(row or None per text, [(index, reason)] of the texts refused, tokens). A refused batch is split: at
    the input the server named when it named one, else in halves, down to single texts."""
    rows: list = [None] * len(texts)
    bad: list[tuple[int, str]] = []
    tokens = 0
    todo = [list(range(len(texts)))]
    while todo:
        idx = todo.pop()
        try:
            got, used = embedder.embed([texts[i] for i in idx])
        except RowError as exc:
            if exc.param and not exc.param.startswith("input"):
                raise FatalError(f"the server refused an option, not a document: {exc}") from None
            if len(idx) == 1 or exc.index is not None and 0 <= exc.index < len(idx):
                k = 0 if len(idx) == 1 else exc.index
                bad.append((idx[k], _INPUT_REF.sub("text", str(exc))))
                rest = idx[:k] + idx[k + 1:]
            else:
                rest = []
                todo += [idx[: len(idx) // 2], idx[len(idx) // 2:]]
            if rest:
                todo.append(rest)
            continue
        tokens += used
        for i, row in zip(idx, got):
            rows[i] = row
    return rows, bad, tokens


@dataclass
class Window:
    index: int
    docs: list[Doc]
    good: list[Doc] = field(default_factory=list)
    batches: list[tuple[list[int], Future]] = field(default_factory=list)

    def done(self) -> bool:
        return all(f.done() for _, f in self.batches)


def windows(docs: Iterator[Doc], size: int, first: int) -> Iterator[Window]:
    chunk: list[Doc] = []
    k = first
    for doc in docs:
        assert doc.pos == k * size + len(chunk), "positions are consecutive"
        chunk.append(doc)
        if len(chunk) == size:
            yield Window(k, chunk)
            k, chunk = k + 1, []
    if chunk:
        yield Window(k, chunk)


class Job:
    def __init__(self, config: IndexConfig, input_path: Path, output: Path, embedder) -> None:
        self.config, self.embedder = config, embedder
        self.input, self.fmt = input_path, detect_format(input_path, config.format)
        try:  # the width, and the server's answer to our options, up front
            probe, _ = embedder.embed([_PROBE])
        except RowError as exc:  # one short text: what is refused is an option
            raise FatalError(f"the server refused this job's options: {exc}") from None
        width = int(probe.shape[1])
        dims = width if config.encoding != "base64_binary" else (
            config.dimensions or embedder.card_dimensions or 8 * width)
        self.layout = Layout(embedder.model_name, dims, config.encoding)
        identity = {"input": str(input_path.resolve()), "format": self.fmt, "model": embedder.model_name,
                    **fingerprint(input_path), "options": config.options(), "dimensions": dims}
        self.sink = Sink(output, identity, config.resume)
        self.extra = {"normalize": str(config.normalize), "truncate": str(config.truncate).lower(),
                      "input_type": config.input_type, "prompt_name": config.prompt_name}

    def run(self) -> Progress | None:
        """This run's progress and the output's totals; None when the output was complete already."""
        c, sink = self.config, self.sink
        if sink.complete:
            log.info("%s is complete already; nothing to do", sink.folder)
            sink.close()
            return None
        start = sink.next_window * c.sort_window
        progress = Progress(c.progress, count_docs(self.input, self.fmt), start, c.log_interval_s, sink.totals())
        slots = threading.BoundedSemaphore(2 * c.concurrency)
        pool = ThreadPoolExecutor(c.concurrency, thread_name_prefix="ivy-index")
        pending: deque[Window] = deque()
        try:
            seen = set(sink.committed_ids())  # a repeat of an id committed before the kill is one too
            docs = unique_ids(read_docs(self.input, self.fmt, c.id_field, c.text_field, start), seen)
            for window in windows(docs, c.sort_window, sink.next_window):
                self._submit(window, pool, slots)
                pending.append(window)
                while pending and (pending[0].done() or len(pending) > 2):
                    self._commit(pending.popleft(), progress)
            while pending:
                self._commit(pending.popleft(), progress)
            sink.finish()
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
            sink.close()
            progress.close()
        return progress

    def _submit(self, window: Window, pool: ThreadPoolExecutor, slots: threading.BoundedSemaphore) -> None:
        window.good = [d for d in window.docs if d.text is not None]
        order = sorted(range(len(window.good)), key=lambda i: len(window.good[i].text))  # stable: deterministic
        for i in range(0, len(order), self.config.batch_size):
            members = order[i: i + self.config.batch_size]
            slots.acquire()
            future = pool.submit(embed_resolving, self.embedder, [window.good[j].text for j in members])
            future.add_done_callback(lambda _: slots.release())
            window.batches.append((members, future))

    def _commit(self, window: Window, progress: Progress) -> None:
        rows: list = [None] * len(window.good)
        refused: dict[int, str] = {}
        tokens = 0
        for members, future in window.batches:
            got, bad, used = future.result()  # a FatalError from a worker stops the job here
            tokens += used
            for j, row in zip(members, got):
                rows[j] = row
            refused.update((members[i], reason) for i, reason in bad)
        rejects = [{"id": d.id, "position": d.pos, "reason": d.reason} for d in window.docs if d.text is None]
        rejects += [{"id": window.good[j].id, "position": window.good[j].pos, "reason": r} for j, r in refused.items()]
        rejects.sort(key=lambda r: r["position"])
        if rejects and self.config.fail_fast:
            first = rejects[0]
            raise FatalError(f"document {first['id']!r} (position {first['position']}): {first['reason']} "
                             "(--fail-fast)")
        kept = [j for j in range(len(window.good)) if j not in refused]
        matrix = np.stack([rows[j] for j in kept]) if kept else np.zeros((0, self.layout.dimensions), np.float32)
        table = self.layout.table([window.good[j].id for j in kept], matrix, self.extra)
        first = window.index * self.config.sort_window
        self.sink.commit(window.index, first, first + len(window.docs), table, rejects, tokens)
        progress.update(len(kept), len(rejects), tokens)
