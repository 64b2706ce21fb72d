"""RELIABILITY 37: Tulip replicas found through a headless Service's DNS name join and leave live; a replica
that leaves finishes its calls in flight, then is closed; a failed resolution keeps the current set."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest

from fake_tulip import FakeTulip
from ivy.config import IvyConfig
from ivy.discovery import address_of, parse
from ivy.encode import embed_request
from ivy.replicas import Expected, ReplicaPool, State
from rose.head import Encoding

NAME = "tulip-headless.ns.svc"


class Resolver:
    """A socket.getaddrinfo stand-in: one record per port in `ports` (the fakes listen on 127.0.0.1, each on
    its own port), or a DNS failure; records the threads it was called on."""

    def __init__(self) -> None:
        self.ports: list[int] = []
        self.fail = False
        self.calls = 0
        self.threads: set[str] = set()

    def __call__(self, host: str, port: int, type: int = 0, **kwargs):
        assert (host, port, type) == (NAME, 50051, socket.SOCK_STREAM)
        self.calls += 1
        self.threads.add(threading.current_thread().name)
        if self.fail:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", p)) for p in self.ports]


async def until(predicate, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < end, "condition not reached in time"
        await asyncio.sleep(0.01)


def test_replicas_join_and_leave_with_the_dns_records() -> None:
    resolver = Resolver()
    gate = threading.Event()
    with FakeTulip(gate=gate) as a, FakeTulip() as b:
        expected = Expected(frozenset({a.model_id}), a.fingerprint, a.spec.dimensions, a.spec.max_length)
        request = embed_request([[101, 7592, 102]], 3, dimensions=0, normalize=None, encoding=Encoding.FLOAT32,
                                request_id="dns")

        async def run() -> None:
            resolver.ports = [a.port]
            pool = ReplicaPool((f"dns:///{NAME}:50051",), expected, health_interval_s=0.05,
                               max_message_bytes=1 << 24, resolver=resolver)
            await pool.start()
            try:
                assert [r.address for r in pool.replicas] == [a.address] and pool.ready()
                held = asyncio.ensure_future(pool.call(request, 3, time.monotonic() + 30))  # waits on a
                await until(lambda: a.waiting == 1)
                resolver.ports = [a.port, b.port]  # a pod joins
                await until(lambda: [r.state for r in pool.replicas] == [State.SERVING] * 2)
                assert {r.address for r in pool.replicas} == {a.address, b.address}
                resolver.ports = [b.port]  # a leaves: no new chunks, its call in flight still answered
                await until(lambda: [r.address for r in pool.replicas] == [b.address])
                (leaving,) = pool._leaving
                assert leaving.address == a.address and not held.done()
                for _ in range(3):
                    assert (await pool.call(request, 3, time.monotonic() + 10)).rows == 1
                assert len(b.calls) == 3 and a.calls == []
                gate.set()
                assert (await held).rows == 1 and len(a.calls) == 1
                await until(lambda: not pool._leaving)  # closed once its call was answered
                resolver.fail = True  # DNS outage: the current set stays
                seen = resolver.calls
                await until(lambda: resolver.calls >= seen + 3)
                assert [r.address for r in pool.replicas] == [b.address] and pool.ready()
            finally:
                await pool.close()

        asyncio.run(run())
    assert "MainThread" not in resolver.threads  # resolved off the event loop


def test_replicas_dns_flag_and_entry_forms() -> None:
    config = IvyConfig(replicas_dns=f"{NAME}:50051")
    assert config.replica_entries() == (f"dns:///{NAME}:50051",)  # replaces the default --replicas
    mixed = IvyConfig(replicas=("10.0.0.1:50051", f"dns:///{NAME}:50051"))
    assert mixed.replica_entries() == mixed.replicas
    assert parse(f"dns:///{NAME}:50051") == (NAME, 50051) and parse("dns:///[::1]:7") == ("::1", 7)
    assert address_of(("fd00::5", 50051, 0, 0)) == "[fd00::5]:50051" and address_of(("10.1.2.3", 1)) == "10.1.2.3:1"
    for bad in ("tulip-headless", "tulip:http", "tulip:0"):
        with pytest.raises(SystemExit, match="NAME:PORT"):
            IvyConfig(replicas_dns=bad)
    with pytest.raises(SystemExit, match="NAME:PORT"):
        IvyConfig(replicas=("dns:///no-port",))
