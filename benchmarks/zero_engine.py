"""An engine that costs nothing, so that a benchmark through Ivy and Tulip measures only their overhead.

It answers Info exactly like ROSE would for the model folder (model id, dimensions, max length, pooling,
tokenizer fingerprint: Ivy's replica check passes) but its step() does no math: it returns a LazyTensor
that is already complete (as ROSE's is on a CPU), holding a constant unit-norm row per output row.
Load it with `tulip serve --engine-factory benchmarks/zero_engine.py:ZeroEngine.from_pretrained`.
"""

from __future__ import annotations

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


class ZeroEngine:
    def __init__(self, info: EngineInfo, max_rows: int = 4096) -> None:
        self.info = info
        self._rows = np.full((max_rows, info.dimensions), 1.0 / np.sqrt(info.dimensions), dtype=np.float32)
        self.steps = 0

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
        n = batch.num_rows
        rows = self._rows[:n] if n <= self._rows.shape[0] else np.resize(self._rows, (n, self.info.dimensions))
        return DoneLazy(rows)

    def stats(self) -> dict:
        return {"steps": self.steps}
