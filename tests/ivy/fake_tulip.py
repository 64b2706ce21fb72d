"""A small Tulip stand-in for Ivy's tests: the real gRPC contract (Embedder + grpc.health.v1), fake math.

Embeddings are deterministic and torch-free: each token id maps to a fixed pseudo-random vector, a row is
the mean over its span (rose.batch decides the spans, rose.head applies dimensions/normalize/encoding),
so span pooling, order and Matryoshka behave like the real thing. A cross-encoder folder (task rerank) gets
one fake score per sequence instead (`fake_scores`: its ids and token types decide it). Knobs let a test make it fail
(`fail_with`), stall (`delay_s`), report NOT_SERVING, or claim another model; `calls` records every Embed.
It runs its own event loop in a background thread so tests can drive Ivy from theirs.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import numpy as np
from grpc_health.v1 import health_pb2, health_pb2_grpc

from protos import embed_pb2, embed_pb2_grpc
from rose.batch import Batch
from rose.head import Encoding, OutputOptions, apply_head
from rose.spec import bundled_model_dir, load_spec
from rose.tokenizer import Tokenizer


def token_vector(token_id: int, dims: int) -> np.ndarray:
    return np.random.default_rng(token_id).standard_normal(dims).astype(np.float32)


def fake_rows(sequences: list[list[int]], dims: int, pooling: str = "mean",
              spans: list[tuple[int, int, int]] | None = None) -> np.ndarray:
    """The fake model's native rows (before the head), for tests to compute expectations."""
    batch = Batch.from_sequences(sequences, pooling=pooling, spans=spans)
    table = np.stack([token_vector(int(t), dims) for t in batch.token_ids])
    return np.stack([table[s:e].mean(axis=0) for s, e in batch.spans])


def fake_scores(sequences: list[list[int]], token_types: list[list[int]] | None = None,
                raw: bool = False) -> np.ndarray:
    """The fake cross-encoder's score per sequence (a pair): a sigmoid of its tokens' first fake dimension,
    shifted by its token types, so ids, their order across pairs and the types all show in the score; `raw`:
    the logit before the sigmoid (a reranker's `logit` output)."""
    out = []
    for i, seq in enumerate(sequences):
        x = np.mean([token_vector(int(t), 4)[0] for t in seq])
        if token_types is not None:
            x += 0.5 * float(np.mean(token_types[i]))
        out.append(x if raw else 1.0 / (1.0 + np.exp(-x)))
    return np.asarray(out, dtype=np.float32).reshape(-1, 1)


def fake_logits(sequences: list[list[int]], labels: int, token_types: list[list[int]] | None = None) -> np.ndarray:
    """The fake classifier's logits per sequence: its tokens' mean fake vector of width `labels`, scaled so the
    labels' scores spread, shifted by its token types (a pair's types show in every logit)."""
    out = []
    for i, seq in enumerate(sequences):
        x = 3 * np.mean([token_vector(int(t), labels) for t in seq], axis=0)
        if token_types is not None:
            x = x + float(np.mean(token_types[i]))
        out.append(x)
    return np.asarray(out, dtype=np.float32)


def fake_output_rows(spec, output: str, sequences, spans=None) -> tuple[np.ndarray, bool]:
    """A sparse / multi-vector model's fake rows of `output` (rose.retrieval_spec) and its normalize default:
    weights are relu of the fake rows (so some are 0), vectors the fake rows themselves."""
    chosen = spec.retrieval.output(output or spec.retrieval.outputs[0].name)
    if chosen is None:
        raise ValueError(f"output {output!r}")
    rows = fake_rows(sequences, chosen.width, spec.pooling, spans)
    return (np.maximum(rows, 0) if chosen.name.endswith("weights") else rows), chosen.normalize


@dataclass
class Call:
    seqs: int
    tokens: int
    rows: int
    dimensions: int
    encoding: int
    request_id: str = ""
    lane: int = 0  # protos Lane: 0 interactive, 1 bulk
    token_types: bytes = b""  # as sent (one uint8 per token id), empty when absent
    token_ids: bytes = b""  # as sent (int32 little-endian)
    output: str = ""  # as sent
    flow: str = ""  # as sent


@dataclass
class FakeTulip:
    model_dir: Path | None = None
    model_id: str | None = None
    fingerprint: str | None = None
    port: int = 0
    fail_with: grpc.StatusCode | None = None
    fail_details: str = "injected failure"
    fail_reason: str = ""  # sent as Tulip's "tulip-reason" trailing metadata when set
    fail_retry_after_s: float | None = None  # sent as "tulip-retry-after-s" (StreamResponse.retry_after_s)
    fail_times: int = -1  # how many Embed calls fail (-1 = all while fail_with is set)
    delay_s: float = 0.0
    serving: bool = True
    gate: threading.Event | None = None  # when set on the fake, Embed waits until the event is set
    waiting: int = 0  # Embed calls currently held at the gate
    calls: list[Call] = field(default_factory=list)
    streams_opened: int = 0  # EmbedStream calls Ivy opened
    stream_cancels: int = 0  # cancel messages received on them
    unary_calls: int = 0  # Embed calls (not over a stream)
    timeouts: list[float] = field(default_factory=list)  # the time each Embed was given (stream or unary), s
    max_queue_tokens: int = 0  # > 0: an Embed that would put more tokens than this in progress gets queue_full
    in_progress_tokens: int = 0
    peak_calls: int = 0  # most Embed calls in progress at once
    queue_full: int = 0  # Embed calls refused by max_queue_tokens
    _in_progress: int = 0
    cold: bool = False  # answers say their batch ran without its CUDA graph yet
    timings: tuple | Callable = (0, 0, 0)  # answers' queue_us, inference_us, batcher_us (or request -> them)
    tasks: list[str] | None = None  # what Info claims (default: the folder's tasks)
    older_info: bool = False  # a Tulip older than InfoResponse.outputs: Info names none, "score" / "logit" refused

    def __post_init__(self) -> None:
        spec = load_spec(self.model_dir or bundled_model_dir())
        self.spec = spec
        self.model_id = self.model_id or spec.model_id
        self.fingerprint = self.fingerprint or Tokenizer(spec).fingerprint
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="fake-tulip")
        self._server: grpc.aio.Server | None = None
        self.address = ""

    # ---- lifecycle ----

    def start(self) -> "FakeTulip":
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=10)
        return self

    async def _start(self) -> None:
        self._server = grpc.aio.server(options=[
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.min_ping_interval_without_data_ms", 10000),
        ])
        embed_pb2_grpc.add_EmbedderServicer_to_server(_Embedder(self), self._server)
        health_pb2_grpc.add_HealthServicer_to_server(_Health(self), self._server)
        self.port = self._server.add_insecure_port(f"127.0.0.1:{self.port}")
        self.address = f"127.0.0.1:{self.port}"
        await self._server.start()

    def stop(self) -> None:
        """Stop serving (connections are closed, in-flight calls cancelled): like a killed replica."""
        if self._server is not None:
            asyncio.run_coroutine_threadsafe(self._server.stop(grace=None), self._loop).result(timeout=10)
            self._server = None

    def restart(self) -> None:
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=10)

    def close(self) -> None:
        self.stop()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)

    def __enter__(self) -> "FakeTulip":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def tokens_served(self) -> int:
        return sum(c.tokens for c in self.calls)


class _Fail(Exception):
    def __init__(self, code: grpc.StatusCode, details: str, reason: str, retry_after_s: float | None = None) -> None:
        super().__init__(details)
        self.code, self.details, self.reason, self.retry_after_s = code, details, reason, retry_after_s

    def metadata(self) -> tuple[tuple[str, str], ...]:
        pairs = (("tulip-reason", self.reason),) if self.reason else ()
        if self.retry_after_s is not None:
            pairs += (("tulip-retry-after-s", f"{self.retry_after_s:.3f}"),)
        return pairs


class _Embedder(embed_pb2_grpc.EmbedderServicer):
    def __init__(self, fake: FakeTulip) -> None:
        self.fake = fake

    async def Embed(self, request, context):
        self.fake.unary_calls += 1
        self.fake.timeouts.append(context.time_remaining() or 0.0)
        try:
            return await self._embed(request)
        except _Fail as fail:
            await context.abort(fail.code, fail.details, trailing_metadata=fail.metadata())

    async def EmbedStream(self, request_iterator, context):
        """The stream as Tulip serves it: each message answered by id when done; cancel drops it."""
        self.fake.streams_opened += 1
        out: asyncio.Queue = asyncio.Queue()
        tasks: dict[int, asyncio.Task] = {}

        async def answer(message) -> None:
            try:
                response = await self._embed(message.request)
                out.put_nowait(embed_pb2.StreamResponse(id=message.id, response=response))
            except _Fail as fail:
                out.put_nowait(embed_pb2.StreamResponse(id=message.id, code=fail.code.value[0],
                                                        message=fail.details, reason=fail.reason,
                                                        retry_after_s=fail.retry_after_s or 0.0))
            finally:
                tasks.pop(message.id, None)

        async def write() -> None:
            while True:
                await context.write(await out.get())

        writer = asyncio.ensure_future(write())
        try:
            async for message in request_iterator:
                if message.cancel:
                    self.fake.stream_cancels += 1
                    task = tasks.pop(message.id, None)
                    if task is not None:
                        task.cancel()
                else:
                    self.fake.timeouts.append(message.timeout_s)
                    tasks[message.id] = asyncio.ensure_future(answer(message))
        finally:
            for task in list(tasks.values()) + [writer]:
                task.cancel()

    async def _embed(self, request):
        """As Tulip: admitted into a bounded queue (max_queue_tokens), then the work."""
        fake = self.fake
        tokens = int(np.frombuffer(request.seq_lens, dtype="<i4").sum())
        if fake.max_queue_tokens and fake.in_progress_tokens + tokens > fake.max_queue_tokens:
            fake.queue_full += 1
            raise _Fail(grpc.StatusCode.RESOURCE_EXHAUSTED, f"queue full: {fake.in_progress_tokens} tokens waiting + "
                        f"{tokens} requested exceeds max_queue_tokens {fake.max_queue_tokens}", "queue_full")
        fake.in_progress_tokens += tokens
        fake._in_progress += 1
        fake.peak_calls = max(fake.peak_calls, fake._in_progress)
        try:
            return await self._work(request)
        finally:
            fake.in_progress_tokens -= tokens
            fake._in_progress -= 1

    async def _work(self, request):
        fake = self.fake
        if fake.delay_s:
            await asyncio.sleep(fake.delay_s)
        if fake.gate is not None:
            fake.waiting += 1
            try:
                while not fake.gate.is_set():
                    await asyncio.sleep(0.005)
            finally:
                fake.waiting -= 1
        if fake.fail_with is not None and fake.fail_times != 0:
            if fake.fail_times > 0:
                fake.fail_times -= 1
            raise _Fail(fake.fail_with, fake.fail_details, fake.fail_reason, fake.fail_retry_after_s)
        ids = np.frombuffer(request.token_ids, dtype="<i4")
        lens = np.frombuffer(request.seq_lens, dtype="<i4")
        offsets = np.concatenate([[0], np.cumsum(lens)])
        seqs = [ids[offsets[i]:offsets[i + 1]].tolist() for i in range(len(lens))]
        spans = None
        if request.spans:
            spans = [tuple(t) for t in np.frombuffer(request.spans, dtype="<i4").reshape(-1, 3).tolist()]
        if "rerank" in fake.spec.tasks or "classify" in fake.spec.tasks:
            types = None
            if request.token_types:
                flat = np.frombuffer(request.token_types, dtype=np.uint8)
                types = [flat[offsets[i]:offsets[i + 1]].tolist() for i in range(len(lens))]
            classify = "classify" in fake.spec.tasks
            served = () if fake.older_info else tuple(o.name for o in fake.spec.outputs)
            if request.output not in ("", *served):
                raise _Fail(grpc.StatusCode.INVALID_ARGUMENT, f"output = {request.output!r} is not one of this "
                            f"model's {['', *served]}", "")  # as Tulip's parse_embed_request
            native = (fake_logits(seqs, fake.spec.dimensions, types) if classify
                      else fake_scores(seqs, types, raw=request.output == "logit"))
        elif fake.spec.retrieval is not None:
            native, normalize_default = fake_output_rows(fake.spec, request.output, seqs, spans)
        else:
            native = fake_rows(seqs, fake.spec.dimensions, fake.spec.pooling, spans)
        if fake.spec.native_int8:  # pplx-embed's native output: round(127 * tanh(x)) as floats
            native = np.round(127 * np.tanh(4 * native)).astype(np.float32)
        options = OutputOptions(dimensions=request.dimensions,
                                normalize=request.normalize if request.HasField("normalize") else None,
                                encoding=Encoding(request.encoding))
        if fake.spec.retrieval is None:
            normalize_default = fake.spec.normalize
        out = apply_head(native, options, native_int8=fake.spec.native_int8, default_normalize=normalize_default)
        dims = request.dimensions or native.shape[1]
        fake.calls.append(Call(len(lens), int(lens.sum()), out.shape[0], dims, request.encoding, request.request_id,
                               request.lane, request.token_types, request.token_ids, request.output, request.flow))
        timings = fake.timings(request) if callable(fake.timings) else fake.timings
        return embed_pb2.EmbedResponse(embeddings=out.astype(out.dtype.newbyteorder("<")).tobytes(),
                                       rows=out.shape[0], dimensions=dims, encoding=request.encoding,
                                       tokens=int(lens.sum()), cold=fake.cold,
                                       queue_us=timings[0], inference_us=timings[1], batcher_us=timings[2])

    async def Info(self, request, context):
        fake = self.fake
        return embed_pb2.InfoResponse(
            model_id=fake.model_id, family=fake.spec.family, max_length=fake.spec.max_length,
            dimensions=fake.spec.dimensions, pooling=fake.spec.pooling, tokenizer_fingerprint=fake.fingerprint,
            native_dtype="int8" if fake.spec.native_int8 else "float32", normalized=fake.spec.normalize,
            max_batch_tokens=16384, max_batch_seqs=256, attention_backend="fake", device="cpu", version="fake",
            tasks=list(fake.tasks if fake.tasks is not None else fake.spec.tasks),
            outputs=[] if fake.older_info else [o.name for o in fake.spec.outputs])


class _Health(health_pb2_grpc.HealthServicer):
    def __init__(self, fake: FakeTulip) -> None:
        self.fake = fake

    async def Check(self, request, context):
        status = health_pb2.HealthCheckResponse.SERVING if self.fake.serving else \
            health_pb2.HealthCheckResponse.NOT_SERVING
        return health_pb2.HealthCheckResponse(status=status)


def wait_until(predicate, timeout: float = 10.0, interval: float = 0.02) -> None:
    """Poll a condition (for state changes driven by background probes); fails the test on timeout."""
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError("condition not reached in time")
        time.sleep(interval)
