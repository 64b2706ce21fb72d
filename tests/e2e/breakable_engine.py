"""ROSE's engine with a device that a request can break (RELIABILITY 62 through `ivy up`), for
`TULIP_ENGINE_FACTORY=tests/e2e/breakable_engine.py:factory`: a batch whose first token is BREAK_TOKEN fails as
after a CUDA error that poisons the context, every later one fails too, and device_ok() says so. A new process
(a restarted Tulip) starts with a device that runs."""

from __future__ import annotations

from rose.engine import Engine

BREAK_TOKEN = 999
ILLEGAL_ADDRESS = "CUDA error: an illegal memory access was encountered"


class BreakableEngine:
    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self.broken = False

    def __getattr__(self, name: str):
        return getattr(self._engine, name)

    def device_ok(self) -> bool:
        return not self.broken

    def replays(self, batch) -> bool:
        return not self.broken and self._engine.replays(batch)

    def step(self, batch, express: bool = False):
        if self.broken or int(batch.token_ids[0]) == BREAK_TOKEN:
            self.broken = True
            raise RuntimeError(ILLEGAL_ADDRESS)
        return self._engine.step(batch, express=express)


def factory(model_dir: str, **kwargs) -> BreakableEngine:
    return BreakableEngine(Engine.from_pretrained(model_dir, **kwargs))
