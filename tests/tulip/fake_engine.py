"""A fake ROSE engine for Tulip's tests: same interface, a "device" thread instead of a GPU.

Each output row is the mean over its span of an integer-valued function of (token id, position within
its own sequence, dimension), so a row depends only on its own sequence's tokens and is exactly equal
(bit for bit) whatever batch it runs in: packing, offset or span bugs change the numbers.

`step()` returns at once and the work runs on one device thread in launch order, like a CUDA stream.
`express=True` gives it an express lane (rose.express): `step(batch, express=True)` runs on a second device
thread beside the first (a higher-priority stream), gated by `release_express(n)` only with
`express_gated=True`; `express_batches` records those batches.
Options: `step_seconds` (simulated device time per batch), `gated` (each batch waits for
`release(n)`; lets tests hold batches in flight deterministically), `fail_when(batch)` (True or an
exception instance: that batch fails on the "device"), `raise_in_step(batch)` (an exception instance or
None: raised by step() itself, as torch raises a CUDA OOM at launch).
Loaded by path (tulip.engine_loader.load_object) both in tests and in `tulip serve --engine-factory`.
"""

from __future__ import annotations

import asyncio
import os
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from rose.batch import Batch


@dataclass(frozen=True)
class FakeInfo:
    model_id: str = "fake-model"
    family: str = "bert"
    max_length: int = 128
    dimensions: int = 16
    pooling: str = "mean"
    tokenizer_fingerprint: str = "sha256:fake"
    native_int8: bool = False
    normalize_default: bool = True
    attention_backend: str = "fake"
    device: str = "cpu"
    vocab_size: int = 1000


def token_features(token_ids: np.ndarray, positions: np.ndarray, dims: int) -> np.ndarray:
    """float64 [T, dims], integer-valued (sums are exact in float64, so rows are batch-invariant)."""
    k = np.arange(dims, dtype=np.int64)
    x = token_ids.astype(np.int64)[:, None] * 31 + positions.astype(np.int64)[:, None] * 7 + k[None, :] * 13
    return (x % 97 - 48).astype(np.float64)


def reference_rows(batch: Batch, dims: int) -> np.ndarray:
    feats = token_features(batch.token_ids, batch.positions, dims)
    out = np.empty((batch.num_rows, dims), dtype=np.float32)
    for i, (start, end) in enumerate(batch.spans.tolist()):
        out[i] = feats[start:end].sum(axis=0) / (end - start)
    return out


class FakeLazy:
    def __init__(self) -> None:
        self._done = threading.Event()
        self._rows: np.ndarray | None = None
        self._error: BaseException | None = None
        self.released = False
        self.padded_tokens: int | None = None

    def _set(self, rows: np.ndarray | None, error: BaseException | None = None) -> None:
        self._rows, self._error = rows, error
        self._done.set()

    def ready(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> np.ndarray:
        if not self._done.wait(timeout):
            raise TimeoutError("fake LazyTensor not ready")
        if self._error is not None:
            raise self._error
        return self._rows

    def result(self) -> np.ndarray:
        rows = self.wait().copy()
        self.release()
        return rows

    def release(self) -> None:
        self.released = True

    def __await__(self):
        return asyncio.get_running_loop().run_in_executor(None, self.wait).__await__()


ILLEGAL_ADDRESS = "CUDA error: an illegal memory access was encountered"


class FakeEngine:
    def __init__(self, info: FakeInfo | None = None, *, step_seconds: float = 0.0, gated: bool = False,
                 fail_when: Callable[[Batch], bool] | None = None,
                 raise_in_step: Callable[[Batch], BaseException | None] | None = None,
                 express: bool = False, express_gated: bool = False,
                 replays_when: Callable[[Batch], bool] | None = None,
                 poison_when: Callable[[Batch], bool] | None = None,
                 break_when: Callable[[Batch], bool] | None = None) -> None:
        self.info = info or FakeInfo()
        self.break_when = break_when  # a batch that poisons the device: it fails, and so does every later call
        self.broken = False
        self.poison_when = poison_when  # batches whose rows come back NaN (a stalled persistent kernel's)
        self.replays_when = replays_when  # Engine.replays: which batches count as captured-graph replays
        self.step_threads: list[str] = []  # the thread each step ran on, in launch order
        self.express = express
        self._express_gate = threading.Semaphore(0) if express_gated else None
        self.express_batches: list[Batch] = []
        self.raise_in_step = raise_in_step
        self.step_seconds = step_seconds
        self.fail_when = fail_when
        self._gate = threading.Semaphore(0) if gated else None
        self._lock = threading.Lock()
        self.batches: list[Batch] = []  # in launch order
        self.launched = 0
        self.completed = 0
        self.max_outstanding = 0
        self.launched_while_busy = 0  # launches that found an earlier batch still on the "device"
        self.warmed_up = False
        self.cold_when: Callable[[Batch], bool] | None = None  # batches reported as cold hits (no graph yet)
        self._work: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._device_loop, args=(self._work, self._gate), name="fake-device",
                         daemon=True).start()
        self._express_work: queue.SimpleQueue = queue.SimpleQueue()
        if express:
            threading.Thread(target=self._device_loop, args=(self._express_work, self._express_gate),
                             name="fake-express", daemon=True).start()

    @classmethod
    def from_pretrained(cls, model_dir: str, device: str = "cpu", dtype=None, attention: str = "auto",
                        pinned_cap_bytes: int = 0) -> FakeEngine:
        """The factory `tulip serve --engine-factory` calls; FAKE_ENGINE_STEP_SECONDS sets device time."""
        return cls(step_seconds=float(os.environ.get("FAKE_ENGINE_STEP_SECONDS", "0")))

    def warmup(self) -> None:
        self.warmed_up = True

    def replays(self, batch: Batch) -> bool:
        """rose.Engine.replays: only the batches replays_when names (none without it)."""
        return bool(self.replays_when is not None and self.replays_when(batch))

    def device_ok(self) -> bool:
        """rose.Engine.device_ok: False once a batch broke the device (break_when)."""
        return not self.broken

    def step(self, batch: Batch, express: bool = False) -> FakeLazy:
        if self.broken:  # as a launch on a poisoned CUDA context raises
            raise RuntimeError(ILLEGAL_ADDRESS)
        if express and not self.express:
            raise RuntimeError("express step without an express lane")
        error = self.raise_in_step(batch) if self.raise_in_step is not None else None
        if error is not None:
            raise error
        lazy = FakeLazy()
        lazy.padded_tokens = -(-batch.num_tokens // 64) * 64
        lazy.cold = bool(self.cold_when and self.cold_when(batch))
        with self._lock:
            outstanding = self.launched - self.completed
            if outstanding:
                self.launched_while_busy += 1
            self.launched += 1
            self.step_threads.append(threading.current_thread().name)
            self.max_outstanding = max(self.max_outstanding, outstanding + 1)
            self.batches.append(batch)
            if express:
                self.express_batches.append(batch)
        (self._express_work if express else self._work).put((batch, lazy))
        return lazy

    def release_express(self, n: int = 1) -> None:
        """Let n gated express batches run."""
        assert self._express_gate is not None, "the express lane is not gated"
        self._express_gate.release(n)

    def release(self, n: int = 1) -> None:
        """Let n gated batches run."""
        assert self._gate is not None, "engine is not gated"
        self._gate.release(n)

    def stats(self) -> dict:
        with self._lock:
            return {"pinned_bytes_in_use": 0, "pinned_bytes_cap": 1 << 20, "graphs_captured": 0,
                    "runs": {("t64", "eager"): self.launched}, "step_seconds_last": self.step_seconds}

    def seen_sequences(self) -> list[np.ndarray]:
        """Every sequence the engine was given, in launch order."""
        with self._lock:
            batches = list(self.batches)
        out = []
        for b in batches:
            out.extend(np.split(b.token_ids, b.cu_seqlens[1:-1]))
        return out

    def _device_loop(self, work: queue.SimpleQueue, gate: threading.Semaphore | None) -> None:
        while True:
            batch, lazy = work.get()
            if gate is not None:
                gate.acquire()
            if self.step_seconds:
                threading.Event().wait(self.step_seconds)  # simulated device time
            try:
                if self.broken or (self.break_when is not None and self.break_when(batch)):
                    self.broken = True
                    raise RuntimeError(ILLEGAL_ADDRESS)
                failure = self.fail_when(batch) if self.fail_when is not None else None
                if isinstance(failure, BaseException):
                    raise failure
                if failure:
                    raise RuntimeError("fake engine failure")
                rows = reference_rows(batch, self.info.dimensions)
                if self.poison_when is not None and self.poison_when(batch):
                    rows = np.full_like(rows, np.nan)
                error = None
            except Exception as exc:  # noqa: BLE001 - handed to the waiter, like a device error
                rows, error = None, exc
            with self._lock:
                self.completed += 1
            lazy._set(rows, error)


class PinnedPoolExhausted(RuntimeError):
    """Named like rose.lazy's error: Tulip recognises it by name as an overload."""


def breaking_factory(model_dir: str, **kwargs) -> FakeEngine:
    """A factory whose engine loses its device on a batch whose first token is 999 (RELIABILITY 62)."""
    return FakeEngine(break_when=lambda batch: int(batch.token_ids[0]) == 999)


def broken_factory(model_dir: str, **kwargs) -> FakeEngine:
    """A factory whose model cannot load: `tulip serve` must exit non-zero with this error."""
    raise RuntimeError(f"no weights in {model_dir}")
