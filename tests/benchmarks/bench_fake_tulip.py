"""A small fake Tulip (grpc.aio servicer: Embed, EmbedStream, Info, and the framed EmbedStream's port that Info
names) on loopback in a background thread.

Rows are the fake stack's (stack_bench_fake.FakeStack.embed of the token ids), so a layers run sees the
same embeddings through either fake. `fail_over_seqs`: requests with more sequences end with
DEADLINE_EXCEEDED (the throughput suite's 504 on a CPU); `delay_s`: seconds a request whose first id is
`delay_token` waits before it is answered (a late answer on a stream).
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from typing import Any

import grpc
import numpy as np

from protos import embed_pb2, embed_pb2_grpc
from protos.framing import FrameBuffer, frame


class FakeTulip(embed_pb2_grpc.EmbedderServicer):
    def __init__(self, embed: Any, max_length: int = 512) -> None:
        self.embed_rows, self.max_length = embed, max_length
        self.calls: Counter = Counter()
        self.received: list[list[int]] = []
        self.fail_over_seqs = 0
        self.delay_token, self.delay_s = -1, 0.0
        self.cancelled: list[int] = []
        self.framed_port = 0  # FakeTulipThread binds it

    async def serve_framed(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """The framed EmbedStream (protos.framing): StreamRequests in, their StreamResponses out, one at a time."""
        frames = FrameBuffer(1 << 30)
        while data := await reader.read(1 << 16):
            for payload in frames.feed(data):
                message = embed_pb2.StreamRequest.FromString(payload)
                if message.cancel:
                    self.cancelled.append(message.id)
                    continue
                self.calls["framed-messages"] += 1
                response, code, text = await self._answer(message.request)
                answer = (embed_pb2.StreamResponse(id=message.id, response=response) if response is not None else
                          embed_pb2.StreamResponse(id=message.id, code=code.value[0], message=text, reason="deadline"))
                writer.write(frame(answer))
        writer.close()

    async def _answer(self, request: embed_pb2.EmbedRequest) -> tuple[Any, grpc.StatusCode, str]:
        ids = np.frombuffer(request.token_ids, dtype="<i4")
        lens = np.frombuffer(request.seq_lens, dtype="<i4")
        seqs = [s.tolist() for s in np.split(ids, np.cumsum(lens)[:-1])]
        self.received.extend(seqs)
        if self.fail_over_seqs and len(seqs) > self.fail_over_seqs:
            return None, grpc.StatusCode.DEADLINE_EXCEEDED, "deadline passed in the queue"
        if seqs and seqs[0] and seqs[0][0] == self.delay_token:
            await asyncio.sleep(self.delay_s)
        rows = self.embed_rows(seqs).astype("<f4")
        return embed_pb2.EmbedResponse(embeddings=rows.tobytes(), rows=rows.shape[0], dimensions=rows.shape[1],
                                       tokens=int(ids.size)), grpc.StatusCode.OK, ""

    async def Embed(self, request, context):  # noqa: N802 - the gRPC method's name
        self.calls["Embed"] += 1
        response, code, message = await self._answer(request)
        if response is None:
            await context.abort(code, message)
        return response

    async def EmbedStream(self, request_iterator, context):  # noqa: N802
        self.calls["EmbedStream"] += 1
        async for message in request_iterator:
            if message.cancel:
                self.cancelled.append(message.id)
                continue
            self.calls["stream-messages"] += 1
            response, code, text = await self._answer(message.request)
            if response is None:
                yield embed_pb2.StreamResponse(id=message.id, code=code.value[0], message=text, reason="deadline")
            else:
                yield embed_pb2.StreamResponse(id=message.id, response=response)

    async def Info(self, request, context):  # noqa: N802
        self.calls["Info"] += 1
        return embed_pb2.InfoResponse(model_id="fake-minilm", max_length=self.max_length, dimensions=32,
                                      pooling="mean", max_batch_tokens=256, max_batch_seqs=16, device="cpu",
                                      framed_port=self.framed_port)


class FakeTulipThread:
    """The servicer on 127.0.0.1:<free port>, its own event loop in a daemon thread."""

    def __init__(self, servicer: FakeTulip) -> None:
        self.servicer = servicer
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.port = asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(20)
        self.address = f"127.0.0.1:{self.port}"

    async def _start(self) -> int:
        self.server = grpc.aio.server()
        embed_pb2_grpc.add_EmbedderServicer_to_server(self.servicer, self.server)
        port = self.server.add_insecure_port("127.0.0.1:0")
        await self.server.start()
        self.framed = await asyncio.start_server(self.servicer.serve_framed, "127.0.0.1", 0)
        self.servicer.framed_port = self.framed.sockets[0].getsockname()[1]
        return port

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.framed.close)
        asyncio.run_coroutine_threadsafe(self.server.stop(0), self.loop).result(20)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)


def start_fake_tulip(stack: Any) -> FakeTulipThread:
    """A fake Tulip whose rows are the fake stack's (the `fake_stack` fixture's) for the same ids."""
    return FakeTulipThread(FakeTulip(stack.embed))
