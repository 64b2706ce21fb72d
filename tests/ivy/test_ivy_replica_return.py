"""A cancel that lands on a DNS lookup that has just finished ends the lookup's caller, and a ReplicaPool
following DNS closes then.

The pool's watcher resolves its names with Discovery.addresses, a lookup on the default executor
(ivy/discovery.py). Bounded by asyncio.wait_for, on Python 3.11 that lookup returned its result, not the
CancelledError, when the cancel came while the lookup was done but its result not yet read: close()'s cancel of
the watcher was lost, the watcher went on with its rounds and close() waited on it for good. Seen as a hang of
about 1 run in 75 on a loaded 2-core VM in the replica-back-in-DNS scenario (a call held on a replica that leaves
DNS and comes back at once). Bounded by asyncio.timeout the cancel holds; the pool's `_closing` flag stays as a
second guard. These tests force that interleaving: the lookup's thread finishes while the loop is held, then the
cancel comes before the loop reads its result; the lookup's answer, never read, shows that it did.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import socket
import threading
import time

import pytest

from fake_tulip import FakeTulip
from ivy.discovery import Discovery
from ivy.encode import embed_request
from ivy.replicas import Expected, ReplicaPool, State
from rose.head import Encoding

NAME = "tulip-headless.ns.svc"


class Recording(concurrent.futures.ThreadPoolExecutor):
    """The loop's default executor, remembering the future of the last job (the DNS lookup's)."""

    last: concurrent.futures.Future | None = None

    def submit(self, *args, **kwargs) -> concurrent.futures.Future:
        self.last = future = super().submit(*args, **kwargs)
        return future


class Answer(list):
    """getaddrinfo's records, remembering whether they were read (Discovery.addresses iterates them)."""

    read = False

    def __iter__(self):
        self.read = True
        return super().__iter__()


class Resolver:
    """getaddrinfo over 127.0.0.1 and `ports`; after hold(), the next lookup waits in its thread for release and
    its Answer is kept in `answer`."""

    def __init__(self, ports: list[int]) -> None:
        self.ports = ports
        self._hold = False
        self._release = threading.Event()
        self.entered: asyncio.Event | None = None
        self.answer: Answer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def hold(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.entered = asyncio.Event()
        self.answer = None
        self._release.clear()
        self._hold = True

    def release(self) -> None:
        self._release.set()

    def __call__(self, host, port, type=0, **kwargs):
        held, self._hold = self._hold, False
        if held:
            self._loop.call_soon_threadsafe(self.entered.set)
            self._release.wait(10)
        answer = Answer((socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", p)) for p in self.ports)
        if held:
            self.answer = answer
        return answer


async def finish_held_lookup(resolver: Resolver, executor: Recording) -> Answer:
    """Let the held lookup finish while the loop is held (deliberately, in this coroutine): on return the lookup
    is done and its result waits in the loop's queue, unread. Returns the lookup's answer."""
    await asyncio.wait_for(resolver.entered.wait(), 10)
    landed = threading.Event()
    executor.last.add_done_callback(lambda _: landed.set())  # after the loop's own callback: its result is queued
    resolver.release()
    assert landed.wait(10) and resolver.answer is not None
    return resolver.answer


@pytest.mark.parametrize("copied", [False, True], ids=["cancel-before-the-loop-copies-the-result", "cancel-after-it"])
def test_a_cancel_as_the_lookup_finishes_is_raised_out_of_addresses(copied: bool) -> None:
    async def run() -> None:
        loop = asyncio.get_running_loop()
        executor = Recording(max_workers=1)
        loop.set_default_executor(executor)
        resolver = Resolver([50051])
        resolver.hold()
        resolving = asyncio.ensure_future(Discovery([f"dns:///{NAME}:50051"], resolver).addresses())
        answer = await finish_held_lookup(resolver, executor)
        if copied:  # queued after the loop's copy of the result into the awaited future
            loop.call_soon(resolving.cancel)
        else:
            resolving.cancel()
        await asyncio.wait({resolving}, timeout=10)
        assert resolving.cancelled(), f"the cancel was lost: addresses() returned {resolving.result()}"
        assert not answer.read  # the cancel came while the lookup was done and its answer unread

    asyncio.run(run())


async def close_as_a_lookup_ends(pool: ReplicaPool, resolver: Resolver, executor: Recording) -> None:
    """close() called while the watcher's lookup is done in its thread but its result not yet read by the loop:
    close() returns, and the watcher ends by its cancel before it reads that result."""
    resolver.hold()
    answer = await finish_held_lookup(resolver, executor)
    closing = asyncio.ensure_future(pool.close())  # runs before the loop reads the lookup's result
    done, _ = await asyncio.wait({closing}, timeout=5)
    if not done:
        closing.cancel()
        await asyncio.gather(closing, return_exceptions=True)
        await pool.close()
        raise AssertionError("ReplicaPool.close() did not return")
    closing.result()
    assert pool._task.cancelled(), "the watcher's cancel was lost (it ended on the _closing flag)"
    assert not answer.read  # the cancel came while the lookup was done and its answer unread


def test_close_returns_when_its_cancel_lands_on_a_finished_dns_lookup() -> None:
    async def run() -> None:
        executor = Recording(max_workers=2)
        asyncio.get_running_loop().set_default_executor(executor)
        resolver = Resolver([])  # resolves to nothing: the pool keeps its (no) replicas, no channel is opened
        pool = ReplicaPool((f"dns:///{NAME}:50051",), Expected(frozenset({"m"}), "", 8, 16),
                           health_interval_s=0.01, max_message_bytes=1 << 20, resolver=resolver)
        await pool.start()
        await close_as_a_lookup_ends(pool, resolver, executor)

    asyncio.run(run())


def test_a_replica_back_in_dns_answers_its_held_call_and_the_pool_closes() -> None:
    """The scenario the hang was seen in: a call held on replica a; a leaves DNS and comes back at once (a new
    Replica for the same address while the old one still has the call in flight); the gate opens: the held call
    is answered, the old a closes, the new a takes chunks, and close() returns, also when it lands on a lookup."""
    gate = threading.Event()
    with FakeTulip(gate=gate) as a, FakeTulip() as b:
        resolver = Resolver([a.port])

        async def until(predicate) -> None:
            end = time.monotonic() + 10
            while not predicate():
                assert time.monotonic() < end, "condition not reached in time"
                await asyncio.sleep(0.01)

        async def run() -> None:
            executor = Recording(max_workers=2)
            asyncio.get_running_loop().set_default_executor(executor)
            expected = Expected(frozenset({a.model_id}), a.fingerprint, a.spec.dimensions, a.spec.max_length)
            request = embed_request([[101, 7592, 102]], 3, dimensions=0, normalize=None, encoding=Encoding.FLOAT32,
                                    request_id="back")
            pool = ReplicaPool((f"dns:///{NAME}:50051",), expected, health_interval_s=0.05,
                               max_message_bytes=1 << 24, resolver=resolver)
            await pool.start()
            held = asyncio.ensure_future(pool.call(request, 3, time.monotonic() + 30))  # on a, held
            try:
                await until(lambda: a.waiting == 1)
                old_a = pool.replicas[0]
                resolver.ports[:] = [b.port]  # a leaves, its call still in flight
                await until(lambda: [r.address for r in pool.replicas] == [b.address])
                resolver.ports[:] = [a.port, b.port]  # and comes back at once (the same IP)
                await until(lambda: [r.state for r in pool.replicas] == [State.SERVING] * 2)
                assert old_a in pool._leaving and old_a not in pool.replicas
                gate.set()
                response = await asyncio.wait_for(held, 10)
                assert response.rows == 1
                await until(lambda: not pool._leaving)  # the old a closed once its call was answered
                end = time.monotonic() + 10
                while len(a.calls) < 2:  # the new a takes a chunk
                    assert time.monotonic() < end, f"no chunk routed to the new a: {len(b.calls)} to b"
                    await pool.call(request, 3, time.monotonic() + 10)
            except BaseException:
                gate.set()
                await pool.close()
                raise
            await close_as_a_lookup_ends(pool, resolver, executor)

        asyncio.run(run())
