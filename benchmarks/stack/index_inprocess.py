"""The index benchmark's denominator: the engine's own throughput on the same documents, in this process.

The engine is built as Tulip builds it (tulip.engine_loader.build_engine on a TulipConfig from TULIP_*
variables: the same prewarm sets, graph manifest and dtype, warmed up and verified), and the documents go
through it as `ivy index` and Tulip would send them, without HTTP, gRPC or a queue: each `--sort-window`
window sorted by text length (ivy index's order), packed into batches of at most Tulip's max_batch_tokens
and max_batch_seqs (benchmarks/stack/inprocess.pack_groups), two batches in flight, every result read back
to the host. Tokenizing is outside the timing (the gateway does it on its own cores, beside the GPU).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Sequence

from benchmarks.stack.inprocess import pack_groups


@dataclass
class EngineRun:
    engine: Any
    max_batch_tokens: int
    max_batch_seqs: int

    @classmethod
    def load(cls, model_dir: str, device: str = "") -> "EngineRun":
        from rose.flags import config_from_args
        from tulip.config import ENV_PREFIX, TulipConfig
        from tulip.engine_loader import build_engine

        given = {"model": model_dir, **({"device": device} if device else {})}
        config = config_from_args(TulipConfig, given, ENV_PREFIX)
        engine, _ = build_engine(config)
        return cls(engine, config.batch_tokens_for(str(engine.info.device)), config.max_batch_seqs)

    def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self.engine.tokenizer.encode_batch(list(texts))]

    def batches(self, texts: Sequence[str], seqs: Sequence[Sequence[int]], window: int) -> list[list[int]]:
        """Document indices per batch: windows in input order, each sorted by text length, then packed."""
        out: list[list[int]] = []
        for first in range(0, len(texts), window):
            order = sorted(range(first, min(first + window, len(texts))), key=lambda i: len(texts[i]))
            out += [[order[j] for j in group] for group in pack_groups([len(seqs[i]) for i in order],
                                                                      self.max_batch_tokens, self.max_batch_seqs)]
        return out

    def run(self, seqs: Sequence[Sequence[int]], batches: Sequence[list[int]]) -> dict[str, Any]:
        """One timed pass: documents/s and tokens/s with two batches in flight."""
        from rose import Batch

        pooling = self.engine.spec.pooling
        start = time.perf_counter()
        inflight: deque = deque()
        for group in batches:
            inflight.append(self.engine.step(Batch.from_sequences([seqs[i] for i in group], pooling)))
            if len(inflight) == 2:
                inflight.popleft().result()
        while inflight:
            inflight.popleft().result()
        seconds = time.perf_counter() - start
        docs = sum(map(len, batches))
        tokens = sum(len(seqs[i]) for group in batches for i in group)
        return {"documents": docs, "tokens": tokens, "batches": len(batches), "seconds": round(seconds, 3),
                "documents_per_s": round(docs / seconds, 1), "tokens_per_s": round(tokens / seconds, 1)}

    def describe(self) -> dict[str, Any]:
        info = self.engine.info
        return {"device": str(info.device), "dtype": getattr(info, "dtype", None),
                "attention_backend": getattr(info, "attention_backend", None),
                "max_batch_tokens": self.max_batch_tokens, "max_batch_seqs": self.max_batch_seqs}

    def close(self) -> None:
        self.engine.close()
        try:
            import torch

            if torch.cuda.is_available():
                torch.cuda.empty_cache()  # the stack's Tulip gets the memory back
        except ImportError:
            pass
