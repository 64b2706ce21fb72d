"""An engine that costs nothing, so that a benchmark through Ivy and Tulip measures only their overhead.

It answers Info exactly like ROSE would for the model folder (model id, dimensions, max length, pooling,
tokenizer fingerprint: Ivy's replica check passes) but its step() does no math: it returns a LazyTensor
that is already complete (as ROSE's is on a CPU), holding a constant unit-norm row per output row.
Load it with `tulip serve --engine-factory benchmarks/zero_engine.py:ZeroEngine.from_pretrained`.

`ZERO_ENGINE_DEVICE_MS` (default 0) gives it a device that takes that long per batch (plus
`ZERO_ENGINE_US_PER_TOKEN` microseconds per token of the batch, default 0), batches one after
another as on one CUDA stream: step() still returns at once, and wait() sleeps until the batch's end
without the GIL, as a thread blocked on a CUDA event does. The harness's thread hand-offs then cost what
they cost beside a GPU (a completer asleep, not handed a finished result).

`ZERO_ENGINE_GIL_CALLS` (default 0): step() gives up the GIL and takes it back that many times, as ROSE's step
does once per torch call (benchmarks.gil_takebacks): each a numpy copy of 4 000 words (~2 µs alone), which releases
the GIL as a torch call does (no system call), so what it adds is the wait for the GIL back while Tulip's other
threads run Python.
"""

from __future__ import annotations

import os
import threading
import time

import numpy as np

from rose.spec import EngineInfo, load_spec
from rose.tokenizer import Tokenizer


class DoneLazy:
    """A LazyTensor that is complete when returned."""

    __slots__ = ("rows",)

    def __init__(self, rows: np.ndarray) -> None:
        self.rows = rows

    def ready(self) -> bool:
        return True

    def wait(self, timeout: float | None = None) -> np.ndarray:
        return self.rows

    def result(self) -> np.ndarray:
        return self.rows.copy()

    def release(self) -> None:
        pass


class DeviceLazy(DoneLazy):
    """Complete at `done_at` (time.monotonic()); wait() sleeps until then."""

    __slots__ = ("done_at",)

    def __init__(self, rows: np.ndarray, done_at: float) -> None:
        super().__init__(rows)
        self.done_at = done_at

    def ready(self) -> bool:
        return time.monotonic() >= self.done_at

    def wait(self, timeout: float | None = None) -> np.ndarray:
        remaining = self.done_at - time.monotonic()
        if remaining > 0:
            time.sleep(remaining)
        return self.rows


class ZeroEngine:
    def __init__(self, info: EngineInfo, max_rows: int = 4096) -> None:
        self.info = info
        self._rows = np.full((max_rows, info.dimensions), 1.0 / np.sqrt(info.dimensions), dtype=np.float32)
        self.steps = 0
        self.device_s = float(os.environ.get("ZERO_ENGINE_DEVICE_MS", "0")) / 1e3
        self.token_s = float(os.environ.get("ZERO_ENGINE_US_PER_TOKEN", "0")) / 1e6
        self.gil_calls = int(os.environ.get("ZERO_ENGINE_GIL_CALLS", "0"))
        self._words, self._scratch = np.arange(4000, dtype=np.int64), np.zeros(4000, dtype=np.int64)
        self._device_free_at = 0.0  # when the last batch leaves the fake device
        self._lock = threading.Lock()

    @classmethod
    def from_pretrained(cls, model_dir: str, **_ignored) -> ZeroEngine:
        spec = load_spec(model_dir)
        tokenizer = Tokenizer(spec)
        info = EngineInfo(model_id=spec.model_id, family=spec.family, max_length=spec.max_length,
                          dimensions=spec.dimensions, pooling=spec.pooling,
                          tokenizer_fingerprint=tokenizer.fingerprint, native_int8=spec.native_int8,
                          normalize_default=spec.normalize, attention_backend="none", device="cpu",
                          dtype="float32")
        return cls(info)

    def warmup(self) -> None:
        pass

    def step(self, batch) -> DoneLazy:
        self.steps += 1
        for _ in range(self.gil_calls):
            self._scratch[:] = self._words  # the GIL given up and taken back, as by a torch call
        n = batch.num_rows
        rows = self._rows[:n] if n <= self._rows.shape[0] else np.resize(self._rows, (n, self.info.dimensions))
        device_s = self.device_s + self.token_s * batch.num_tokens
        if device_s <= 0:
            return DoneLazy(rows)
        with self._lock:  # an express lane's steps would queue on the same device
            done_at = self._device_free_at = max(time.monotonic(), self._device_free_at) + device_s
        return DeviceLazy(rows, done_at)

    def replays(self, batch) -> bool:
        """Every step is as cheap as a graph replay (Tulip may launch it from its event loop)."""
        return True

    def stats(self) -> dict:
        return {"steps": self.steps}
