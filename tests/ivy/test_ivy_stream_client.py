"""ReplicaStream on a scripted call: a request cancelled while its message is being written leaves the
shared stream open (grpc.aio would cancel the whole call) and is cancelled on the wire once written."""

import asyncio

import grpc

from ivy.stream import ReplicaStream
from protos import embed_pb2


WAIT_S = 10.0  # a hang guard for the waits below, not a timing assertion


class ScriptedCall:
    """A stream-stream call whose writes wait for `release`; reads wait forever (no answers). The test waits
    on its events (a write begun, a message written), never for a fixed time."""

    def __init__(self) -> None:
        self.written: list[embed_pb2.StreamRequest] = []
        self.release = asyncio.Event()
        self.writing = asyncio.Event()  # a write has begun
        self.cancelled = False
        self._ended = asyncio.Event()
        self._wrote = asyncio.Condition()

    async def write(self, message) -> None:
        self.writing.set()
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled = True  # what grpc.aio does: a cancelled write cancels the call
            raise
        self.written.append(message)
        async with self._wrote:
            self._wrote.notify_all()

    async def wait_written(self, count: int) -> None:
        async with self._wrote:
            await asyncio.wait_for(self._wrote.wait_for(lambda: len(self.written) >= count), WAIT_S)

    async def read(self):
        await self._ended.wait()  # no answers; a cancelled call ends its reads, as grpc.aio's does
        raise asyncio.CancelledError

    def cancel(self) -> None:
        self.cancelled = True
        self._ended.set()


class Stub:
    def __init__(self) -> None:
        self.calls: list[ScriptedCall] = []
        self.opened = asyncio.Event()

    def EmbedStream(self):  # noqa: N802 - the generated stub's name
        self.calls.append(ScriptedCall())
        self.opened.set()
        return self.calls[-1]


def test_a_caller_cancelled_mid_write_leaves_the_stream_open_and_cancels_its_request() -> None:
    async def main() -> None:
        stub = Stub()
        stream = ReplicaStream(stub, "test")
        request = embed_pb2.EmbedRequest(token_ids=b"\x01\x00\x00\x00", seq_lens=b"\x01\x00\x00\x00")
        task = asyncio.ensure_future(stream.embed(request, timeout=30))
        await asyncio.wait_for(stub.opened.wait(), WAIT_S)
        await asyncio.wait_for(stub.calls[0].writing.wait(), WAIT_S)  # the write is in progress
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        call = stub.calls[0]
        assert not call.cancelled
        call.release.set()
        await call.wait_written(2)
        assert [m.cancel for m in call.written] == [False, True] and call.written[1].id == call.written[0].id
        assert not call.cancelled and len(stub.calls) == 1
        await asyncio.wait_for(stream.close(), 5)

    asyncio.run(main())


def test_a_timeout_is_deadline_exceeded_and_cancels_on_the_wire() -> None:
    async def main() -> None:
        stub = Stub()
        stream = ReplicaStream(stub, "test")
        request = embed_pb2.EmbedRequest(token_ids=b"\x01\x00\x00\x00", seq_lens=b"\x01\x00\x00\x00")
        task = asyncio.ensure_future(stream.embed(request, timeout=0.05))
        await asyncio.wait_for(stub.opened.wait(), WAIT_S)
        stub_call = stub.calls[0]
        stub_call.release.set()
        try:
            await task
        except Exception as exc:  # noqa: BLE001
            assert getattr(exc, "code", None) == grpc.StatusCode.DEADLINE_EXCEEDED
        else:
            raise AssertionError("no answer came: the call must time out")
        await stub_call.wait_written(2)
        assert [m.cancel for m in stub_call.written] == [False, True]
        await asyncio.wait_for(stream.close(), 5)

    asyncio.run(main())
