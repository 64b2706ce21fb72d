"""Shared helpers for Tulip's tests: a server on loopback in a background thread, request builders,
the solo-embedding oracle, and condition waits (never sleeps used as timing assertions)."""

from __future__ import annotations

import asyncio
import dataclasses
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Self

import grpc
import numpy as np

from protos import embed_pb2, embed_pb2_grpc
from rose.batch import Batch
from rose.head import Encoding, OutputOptions, apply_head
from tulip.config import TulipConfig
from tulip.engine_loader import load_object
from tulip.server import CLIENT_CHANNEL_OPTIONS, TulipServer

FAKE_ENGINE_PATH = Path(__file__).with_name("fake_engine.py")
FAKE_FACTORY = f"{FAKE_ENGINE_PATH}:FakeEngine.from_pretrained"
fake = sys.modules[load_object(f"{FAKE_ENGINE_PATH}:FakeEngine").__module__]
FakeEngine = fake.FakeEngine
FakeInfo = fake.FakeInfo


def make_config(**overrides) -> TulipConfig:
    base = {"port": 0, "max_batch_tokens": 256, "max_batch_seqs": 16, "max_queue_tokens": 65536,
            "warmup_full_batch": "false", "shutdown_timeout_s": 10.0, "device": "cpu"}
    base.update(overrides)
    return TulipConfig(**base)


class ServerThread:
    """A real TulipServer on 127.0.0.1 with its own event loop in a background thread."""

    def __init__(self, config: TulipConfig, engine=None, *, load: bool = True,
                 loop_factory: Callable[[], asyncio.AbstractEventLoop] = asyncio.new_event_loop) -> None:
        self.loop = loop_factory()
        self._thread = threading.Thread(target=self.loop.run_forever, name="test-tulip-loop", daemon=True)
        self._thread.start()
        self.server = TulipServer(config, engine=engine)
        self.run(self.server.start() if load else self.server.start_listening())
        self.address = f"127.0.0.1:{self.server.port}"
        self.channel = grpc.insecure_channel(self.address, options=CLIENT_CHANNEL_OPTIONS)
        self.stub = embed_pb2_grpc.EmbedderStub(self.channel)

    def run(self, coro, timeout: float = 30.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.channel.close()
        if not self.server.draining:
            self.run(self.server.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def pack_i32(values) -> bytes:
    return np.asarray(values, dtype="<i4").tobytes()


def encode_request(seqs: Sequence[Sequence[int]], spans=None, dimensions: int = 0, normalize=None,
                   encoding: int = 0, request_id: str = "") -> embed_pb2.EmbedRequest:
    req = embed_pb2.EmbedRequest(
        token_ids=pack_i32(np.concatenate([np.asarray(s) for s in seqs])),
        seq_lens=pack_i32([len(s) for s in seqs]), dimensions=dimensions, encoding=encoding,
        request_id=request_id)
    if spans is not None:
        req.spans = pack_i32(np.asarray(spans).reshape(-1))
    if normalize is not None:
        req.normalize = normalize
    return req


def decode_response(resp: embed_pb2.EmbedResponse) -> np.ndarray:
    if resp.encoding == Encoding.FLOAT32:
        return np.frombuffer(resp.embeddings, dtype="<f4").reshape(resp.rows, resp.dimensions)
    if resp.encoding == Encoding.INT8:
        return np.frombuffer(resp.embeddings, dtype=np.int8).reshape(resp.rows, resp.dimensions)
    return np.frombuffer(resp.embeddings, dtype=np.uint8).reshape(resp.rows, (resp.dimensions + 7) // 8)


def solo_embedding(req: embed_pb2.EmbedRequest, info=None) -> np.ndarray:
    """What the request gets when it is the only thing in its batch (the fake engine's oracle)."""
    info = info or FakeInfo()
    ids = np.frombuffer(req.token_ids, dtype="<i4")
    lens = np.frombuffer(req.seq_lens, dtype="<i4")
    seqs = np.split(ids, np.cumsum(lens)[:-1])
    spans = None
    if req.spans:
        spans = [tuple(t) for t in np.frombuffer(req.spans, dtype="<i4").reshape(-1, 3).tolist()]
    rows = fake.reference_rows(Batch.from_sequences(seqs, pooling=info.pooling, spans=spans), info.dimensions)
    options = OutputOptions(dimensions=req.dimensions,
                            normalize=req.normalize if req.HasField("normalize") else None,
                            encoding=Encoding(req.encoding))
    return apply_head(rows, options, native_int8=info.native_int8, default_normalize=info.normalize_default)


def wait_until(predicate: Callable[[], bool], timeout: float = 20.0, what: str = "condition") -> None:
    """Poll until predicate() holds; fail after `timeout` (a hang guard, not a timing assertion)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.002)


def first_tokens(engine) -> list[int]:
    """The first token of every sequence the fake engine ran, in launch order (markers identify requests)."""
    return [int(s[0]) for s in engine.seen_sequences()]


def marked_sequence(marker: int, length: int) -> list[int]:
    """A sequence whose first token identifies it (markers < 1000 = FakeInfo.vocab_size)."""
    rng = np.random.default_rng(marker)
    return [marker] + rng.integers(1, 1000, size=length - 1).tolist()


def replace(config: TulipConfig, **changes) -> TulipConfig:
    return dataclasses.replace(config, **changes)


__all__ = [
    "FAKE_FACTORY",
    "FakeEngine",
    "FakeInfo",
    "ServerThread",
    "decode_response",
    "encode_request",
    "first_tokens",
    "make_config",
    "marked_sequence",
    "replace",
    "solo_embedding",
    "wait_until",
]
