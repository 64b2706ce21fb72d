"""Host-side packing of a batch for the engine, and the small helpers the worker's threads share."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from rose.batch import Batch
from tulip.scheduler import PackedBatch, QueuedSequence

log = logging.getLogger("tulip.worker")


_ROW_ZERO = np.zeros(1, dtype=np.int64)
_ROW_ZERO.flags.writeable = False


def build_batch(sequences: list[QueuedSequence]) -> tuple[Batch, np.ndarray]:
    """Pack sequences back to back into a rose.Batch; returns it and each sequence's first output row."""
    if len(sequences) == 1 and sequences[0].types is None:  # a lone query: its own arrays, no concatenation
        seq = sequences[0]
        return Batch(token_ids=seq.tokens.astype(np.int32, copy=False), seq_lens=np.array([seq.num_tokens], np.int32),
                     spans=seq.spans.astype(np.int32, copy=False).reshape(-1, 2)), _ROW_ZERO
    lens = np.fromiter((s.num_tokens for s in sequences), dtype=np.int32, count=len(sequences))
    starts = np.zeros(len(sequences), dtype=np.int32)
    np.cumsum(lens[:-1], out=starts[1:])
    spans = np.concatenate([s.spans + start for s, start in zip(sequences, starts.tolist())]).astype(np.int32)
    row_counts = np.fromiter((s.spans.shape[0] for s in sequences), dtype=np.int64, count=len(sequences))
    row_starts = np.zeros(len(sequences), dtype=np.int64)
    np.cumsum(row_counts[:-1], out=row_starts[1:])
    token_ids = np.concatenate([s.tokens for s in sequences]).astype(np.int32, copy=False)
    types = None
    if any(s.types is not None for s in sequences):  # cross-encoder pairs: zeros for sequences without types
        types = np.concatenate([s.types if s.types is not None else np.zeros(s.num_tokens, np.uint8)
                                for s in sequences]).astype(np.int32)
    return Batch(token_ids=token_ids, seq_lens=lens, spans=spans.reshape(-1, 2), token_types=types), row_starts


@dataclass
class Launched:
    """A batch on the engine, waiting for the completer."""

    packed: PackedBatch
    row_starts: np.ndarray
    lazy: Any
    launched_at: float
    launched_mono: float = 0.0  # time.monotonic() at launch: the pacing clock
    done_mono: float = 0.0  # time.monotonic() when its rows were on the host


@dataclass
class FailedBatch:
    """Jobs to fail (a launch failed, their deadline passed in the queue, or the device is lost: requests waiting
    or taken but not launched): `error` a TulipError, or what the launch raised, which the completer maps
    (tulip.device_check: a probe of the device, on its thread alone). `slot`: the batch's launch slot, which the
    completer frees once the jobs are failed (after the probe: no batch is launched while it asks)."""

    jobs: list
    error: BaseException
    slot: bool = False


def jobs_of(sequences: list[QueuedSequence]) -> list:
    seen: dict[int, Any] = {}
    for s in sequences:
        seen.setdefault(id(s.ticket), s.ticket)
    return list(seen.values())


def release_lazy(lazy: Any) -> None:
    release = getattr(lazy, "release", None)
    if callable(release):
        try:
            release()
        except Exception:  # releasing twice or after a failure must not kill the completer
            log.debug("LazyTensor.release raised", exc_info=True)
