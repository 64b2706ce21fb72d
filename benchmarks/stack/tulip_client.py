"""Tulip-direct: the benchmark's client speaking gRPC to one Tulip with token ids (the tulip-grpc layer).

Three ways (`--tulip-call`): `unary`, one `Embed` call per request; `stream` (default), one long-lived
`EmbedStream` per client process, each request a `StreamRequest{id, request, timeout_s}` answered by
the `StreamResponse` with its id (a closed-loop client has one in flight: it writes one message and
reads one back; a late answer to a request it gave up on is skipped); `framed`, the same messages on
Tulip's framed EmbedStream (the port its Info names), through Ivy's own client (ivy.framed). Token ids travel as packed
little-endian int32 (`EmbedRequest.token_ids`, `seq_lens`), packed once per distinct request: what is
timed is the call, the server and decoding the float32 rows (and, scoring, the client cosine).

grpc.aio on one event loop per client; `tulip` is not imported and `ivy` only for `framed` (client processes
start light): the channel options mirror tulip.server.CLIENT_CHANNEL_OPTIONS.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from itertools import chain
from typing import Any, Sequence

import grpc
import numpy as np

from benchmarks.stack.client import Sample, StackError, cosine_scores
from protos import embed_pb2, embed_pb2_grpc

CALLS = ("stream", "unary", "framed")  # framed: Tulip's framed EmbedStream (the port its Info names), Ivy's client
MIB = 1024 * 1024
CHANNEL_OPTIONS = [("grpc.max_send_message_length", 16 * MIB), ("grpc.max_receive_message_length", 16 * MIB),
                   ("grpc.keepalive_time_ms", 30_000), ("grpc.keepalive_timeout_ms", 10_000),
                   ("grpc.keepalive_permit_without_calls", 1), ("grpc.http2.max_pings_without_data", 0)]
# gRPC codes as the HTTP statuses the suites understand (a 4xx in a warm-up skips the step)
_AS_HTTP = {grpc.StatusCode.INVALID_ARGUMENT: 400, grpc.StatusCode.OUT_OF_RANGE: 400,
            grpc.StatusCode.RESOURCE_EXHAUSTED: 429, grpc.StatusCode.UNAVAILABLE: 503,
            grpc.StatusCode.DEADLINE_EXCEEDED: 504}
_BY_VALUE = {code.value[0]: code for code in grpc.StatusCode}


def rpc_error(what: str, code: grpc.StatusCode | None, message: str, reason: str = "") -> StackError:
    name = code.name if code is not None else "UNKNOWN"
    return StackError(f"{what} -> {name}: {message}" + (f" ({reason})" if reason else ""), _AS_HTTP.get(code))


def pack(seqs: Sequence[Sequence[int]]) -> tuple[bytes, bytes]:
    """(token_ids, seq_lens) as EmbedRequest carries them: int32 little-endian, back to back."""
    lens = np.fromiter(map(len, seqs), dtype="<i4", count=len(seqs))
    ids = np.fromiter(chain.from_iterable(seqs), dtype="<i4", count=int(lens.sum()))
    return ids.tobytes(), lens.tobytes()


@dataclass(frozen=True)
class TulipSpec:
    """What a client process needs to build its own `TulipClient` (picklable, like load.ClientSpec)."""

    address: str
    call: str = "stream"
    timeout_s: float = 60.0
    cpus: tuple[int, ...] = ()

    def connect(self) -> "TulipClient":
        return TulipClient(self.address, self.call, self.timeout_s)


class TulipClient:
    """A synchronous face over grpc.aio, one per process; `embed_ids` returns a `Sample` like StackClient."""

    def __init__(self, address: str, call: str = "stream", timeout_s: float = 60.0) -> None:
        if call not in CALLS:
            raise ValueError(f"--tulip-call must be one of {', '.join(CALLS)}, not {call!r}")
        self.address, self.call, self.timeout_s = address, call, timeout_s
        self.last_cold = False
        self.last_timing: tuple[float, ...] | None = None
        self._loop = asyncio.new_event_loop()
        self._stream: Any = None
        self._reading: asyncio.Future | None = None
        self._closed = False
        self._next_id = 0
        self._packed: dict[int, tuple[object, bytes, bytes]] = {}
        self._framed_stream: Any = None  # ivy.framed.FramedStream, opened by the first framed request
        self._loop.run_until_complete(self._open())

    async def _open(self) -> None:
        self._channel = grpc.aio.insecure_channel(self.address, options=CHANNEL_OPTIONS)
        self._stub = embed_pb2_grpc.EmbedderStub(self._channel)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._loop.run_until_complete(self._close())
        # the loop is left open: grpc.aio's completion-queue poller may still post to it, and a closed
        # loop turns that into an "Event loop is closed" error in the log

    async def _close(self) -> None:
        if self._framed_stream is not None:
            await self._framed_stream.close()
        if self._stream is not None:
            self._stream.cancel()
            self._stream = None
        await self._channel.close()
        pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in pending:  # grpc's own status watchers: finished here, not destroyed with the loop
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    def __enter__(self) -> "TulipClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(self, seqs: Sequence[Sequence[int]]) -> embed_pb2.EmbedRequest:
        hit = self._packed.get(id(seqs))
        if hit is None or hit[0] is not seqs:
            hit = self._packed[id(seqs)] = (seqs, *pack(seqs))  # keeps seqs alive: its id stays its own
        return embed_pb2.EmbedRequest(token_ids=hit[1], seq_lens=hit[2], encoding=embed_pb2.ENCODING_FLOAT32)

    async def _unary(self, request: embed_pb2.EmbedRequest) -> embed_pb2.EmbedResponse:
        try:
            return await self._stub.Embed(request, timeout=self.timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise rpc_error("Embed", exc.code(), exc.details() or "") from None

    async def _framed(self, request: embed_pb2.EmbedRequest) -> embed_pb2.EmbedResponse:
        from ivy.framed import FramedStream, host_of
        from ivy.stream import CallFailed

        if self._framed_stream is None:
            port = (await self._info()).framed_port
            if not port:
                raise rpc_error("framed EmbedStream", grpc.StatusCode.UNAVAILABLE,
                                "the replica names no framed port (tulip serve --framed-port)")
            self._framed_stream = FramedStream(host_of(self.address), port, self.address, 1 << 30)
        try:
            return await self._framed_stream.embed(request, self.timeout_s)
        except CallFailed as exc:
            raise rpc_error("framed EmbedStream", exc.code, exc.details, exc.reason) from None

    async def _streamed(self, request: embed_pb2.EmbedRequest) -> embed_pb2.EmbedResponse:
        if self._stream is None:
            self._stream, self._reading = self._stub.EmbedStream(), None
        self._next_id += 1
        rid, stream = self._next_id, self._stream
        try:
            await stream.write(embed_pb2.StreamRequest(id=rid, request=request, timeout_s=self.timeout_s))
            deadline = time.monotonic() + self.timeout_s + min(1.0, self.timeout_s)  # Tulip's own comes first
            while True:
                # a read is never cancelled (that would end the whole stream): one given up on stays
                # pending, and the next request's wait picks up where it left off
                if self._reading is None:
                    self._reading = asyncio.ensure_future(stream.read())
                done, _ = await asyncio.wait((self._reading,), timeout=max(0.0, deadline - time.monotonic()))
                if not done:
                    await stream.write(embed_pb2.StreamRequest(id=rid, cancel=True))
                    raise rpc_error("EmbedStream", grpc.StatusCode.DEADLINE_EXCEEDED,
                                    f"no answer in {self.timeout_s} s")
                answer, self._reading = self._reading.result(), None
                if answer is grpc.aio.EOF:
                    raise rpc_error("EmbedStream", grpc.StatusCode.UNAVAILABLE, "the server ended the stream")
                if answer.id == rid:
                    break
        except (grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError) as exc:
            self._stream = None  # a broken stream: the next request opens a new one
            code = exc.code() if isinstance(exc, grpc.aio.AioRpcError) else None
            details = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else str(exc)
            raise rpc_error("EmbedStream", code, details or "") from None
        except StackError as exc:
            if exc.status != 504:
                self._stream = None
            raise
        if answer.code != 0:
            raise rpc_error("EmbedStream", _BY_VALUE.get(answer.code), answer.message, answer.reason)
        return answer.response

    def embed_matrix(self, seqs: Sequence[Sequence[int]]) -> tuple[np.ndarray, int]:
        """The float32 rows for `seqs` and the tokens Tulip reports."""
        request = self._request(seqs)
        call = {"stream": self._streamed, "unary": self._unary, "framed": self._framed}[self.call]
        response = self._loop.run_until_complete(call(request))
        self.last_cold = bool(response.cold)
        nan = float("nan")  # Tulip's account (EmbedResponse), in TIMING_KEYS order: no Ivy before it; 0 = not measured
        self.last_timing = ((nan, nan, response.queue_us / 1e3, response.inference_us / 1e3, response.batcher_us / 1e3)
                            if response.batcher_us else None)
        rows = np.frombuffer(response.embeddings, dtype="<f4")
        if response.rows != len(seqs) or rows.size != response.rows * response.dimensions:
            raise StackError(f"Tulip returned {response.rows} rows ({rows.size} values) for {len(seqs)} sequences")
        return rows.reshape(response.rows, response.dimensions), int(response.tokens)

    def embed_ids(self, seqs: Sequence[Sequence[int]], client_tokens: int, score: bool = False) -> Sample:
        """One timed request; `score`: seqs[0] is the query, scored against the rest by cosine."""
        start, cpu = time.perf_counter(), time.thread_time()
        matrix, tokens = self.embed_matrix(seqs)
        if score:
            cosine_scores(matrix[0], matrix[1:])
        latency = time.perf_counter() - start
        return Sample(start, latency, len(seqs) - score, tokens or client_tokens, tokens > 0, cold=self.last_cold,
                      timing=self.last_timing, client_cpu_s=time.thread_time() - cpu)

    def embed(self, texts: list[str], client_tokens: int, priority: str | None = None) -> Sample:
        raise StackError("Tulip takes token ids, not texts (the tulip-grpc layer sends --input ids)")

    def score(self, query: str, documents: list[str], client_tokens: int) -> Sample:
        return self.embed([query, *documents], client_tokens)

    def score_route(self, ids: bool) -> str:
        rpc = "EmbedStream" if self.call == "stream" else "Embed"
        return f"tulip {rpc}, query + documents as one request, + client cosine"

    async def _info(self) -> embed_pb2.InfoResponse:
        try:
            return await self._stub.Info(embed_pb2.InfoRequest(), timeout=min(self.timeout_s, 10.0))
        except grpc.aio.AioRpcError as exc:
            raise rpc_error(f"Info at {self.address}", exc.code(), exc.details() or "") from None

    def info(self) -> dict[str, Any]:
        """Tulip's Info RPC as a dict (model, max_length, dimensions, max_batch_tokens, ...)."""
        from google.protobuf.json_format import MessageToDict

        return MessageToDict(self._loop.run_until_complete(self._info()), preserving_proto_field_name=True,
                             always_print_fields_with_no_presence=True)

    def max_length(self) -> int | None:
        return int(self.info().get("max_length") or 0) or None

    def baseline_latency_ms(self, count: int = 50) -> dict[str, Any]:
        """Round trip of the trivial Info RPC: the client's and gRPC's own share of every latency."""
        times = []
        for _ in range(count):
            start = time.perf_counter()
            self._loop.run_until_complete(self._info())
            times.append(time.perf_counter() - start)
        return {"path": "Info (unary)", "requests": count, "p50_ms": float(np.percentile(times, 50) * 1e3)}
