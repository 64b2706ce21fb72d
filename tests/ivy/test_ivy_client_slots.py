"""RELIABILITY 61: once a client under its share of a worker's request slots is refused as full, a client holding its
share or more may not take the last free slots (the reserve): it gets 429, so one client flooding the concurrency cap
cannot shut the others out; while no one is refused, any client may fill the cap."""

from __future__ import annotations

import threading
import time

import pytest
from fake_tulip import FakeTulip, wait_until
from ivy_testkit import gateway
from prometheus_client import REGISTRY

from ivy import client_slots
from ivy.client_slots import CONTENDED_S, ClientSlots, client_of
from ivy.errors import IvyError
from ivy.gateway import bearer_token

KEYS = ("key-a=interactive", "key-b=interactive")


def _auth(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class _Worker:
    """ClientSlots as Gateway.admit drives it: the worker's slots taken counted beside it."""

    def __init__(self, slots: int, share: float, clock) -> None:
        self.slots, self.in_flight = ClientSlots(slots, share, clock), 0

    def take(self, client) -> None:
        self.slots.take(client, self.in_flight)
        self.in_flight += 1

    def give(self, client) -> None:
        self.slots.give(client)
        self.in_flight -= 1


def test_a_heavy_client_leaves_the_reserve_only_once_another_was_refused_as_full() -> None:
    clock = _Clock()
    w = _Worker(8, 0.5, clock)  # a share of 4 slots, a reserve of 1
    for _ in range(8):
        w.take("a")  # alone: the whole cap
    w.slots.refused_as_full("a")  # its own refusal by the cap contends with no one
    for _ in range(5):
        w.give("a")
    w.take("b")
    w.take("a")
    w.take("a")  # a above its share beside b, no one refused: nothing is refused
    w.slots.refused_as_full("b")  # b, under its share, was refused as full: contended
    w.take("a")  # two slots free: a may take one, not the reserve
    with pytest.raises(IvyError, match="this client holds 6") as refused:
        w.take("a")
    assert refused.value.status == 429 and refused.value.retry_after() == 1
    w.take("b")  # the reserve is b's; b served beside heavy a: contended again from now
    w.give("b")
    clock.now += CONTENDED_S - 1
    with pytest.raises(IvyError):
        w.take("a")
    clock.now += 2
    w.take("a")  # no refusal and no light client served beside it for CONTENDED_S: a may fill the cap again
    assert w.slots.held == {"a": 7, "b": 1} and w.slots.heavy == 1 and w.in_flight == 8
    for _ in range(4):
        w.give("a")
    assert w.slots.heavy == 0  # a below its share
    w.slots.take(None, 0)  # a request outside open_request's path is not counted
    w.slots.give(None)
    off = _Worker(8, 1.0, clock)
    off.slots.refused_as_full("b")
    for _ in range(8):
        off.take("a")  # share 1: off, whatever happens
    assert off.slots.held == {} and ClientSlots(3, 0.1).limit == 1 and ClientSlots(128, 0.5).reserve == 16


def test_several_flooding_clients_are_each_held_to_an_even_split() -> None:
    clock = _Clock()
    w = _Worker(16, 0.5, clock)  # a share of 8, a reserve of 2: 14 slots to split
    for _ in range(5):
        for c in "abc":
            w.take(c)
    w.take("a")  # the cap full: a 6, b 5, c 5, each under its share of 8
    w.slots.refused_as_full("b")  # b holds over its split of 14 among three, 4: no one else wants a slot
    w.give("a")
    w.take("a")  # not contended: any client may take a free slot
    w.slots.refused_as_full("d")  # d holds none: contended, four clients want slots, 14 // 4 each
    for c in "abc":
        w.give(c)
    w.take("c")  # a 5, b 4, c 5, three slots free: c takes one short of the reserve
    for c in "abc":
        with pytest.raises(IvyError, match=f"this client holds {w.slots.held[c]} of this worker's 16") as refused:
            w.take(c)  # each over its split of 3, the last two free slots kept
        assert refused.value.status == 429
    w.take("d")
    w.take("e")  # a newcomer under its split of 14 // 5 takes the reserve's other slot
    assert w.in_flight == 16 and w.slots.held == {"a": 5, "b": 4, "c": 5, "d": 1, "e": 1}
    w.give("d")  # d between two requests still wants a slot: shut out, then served, it counts for CONTENDED_S
    assert w.slots.bound("f") == 14 // 6
    w.slots.refused_as_full("f")
    w.give("b")
    clock.now += CONTENDED_S - 0.5
    with pytest.raises(IvyError):
        w.take("a")  # a holds 5 of 14 split six ways
    w.take("d")  # d, back, finds the slot a was refused
    clock.now += 1  # d served at 102.5 beside heavy a: still contended
    with pytest.raises(IvyError):
        w.take("a")
    clock.now += CONTENDED_S  # no one refused or served beside the heavy for CONTENDED_S: over
    w.take("a")
    assert w.slots.held["a"] == 6 and w.in_flight == 16


def test_contention_ends_once_the_refused_client_stops_coming_back() -> None:
    clock = _Clock()
    w = _Worker(16, 0.5, clock)  # a share of 8, a reserve of 2
    for _ in range(5):
        for c in "abc":
            w.take(c)  # 15 in flight, none at its share
    w.take("d")
    w.slots.refused_as_full("d")  # d under its split of 14 // 4: contended
    w.give("d")
    clock.now += 0.5
    w.take("d")  # back and served beside the heavy ones: contended from now
    w.give("d")  # d stops here
    for _ in range(3):
        w.give("a")
    clock.now += 1
    w.take("a")  # a under its split of 14 // 4, b and c over it: not shut out, so it keeps nothing contended
    clock.now += CONTENDED_S - 0.4  # CONTENDED_S and a bit since d was served
    for _ in range(3):
        w.take("a")  # the cap full again with no one refused since: nothing is kept back
    assert w.in_flight == 16 and w.slots.held["a"] == 6


def test_contention_ends_when_the_refused_client_is_served_beyond_the_reserve() -> None:
    clock = _Clock()
    w = _Worker(16, 0.5, clock)  # a share of 8, a reserve of 2
    clients = [f"c{i}" for i in range(10)]
    for i, c in enumerate(clients):
        for _ in range(2 if i < 6 else 1):
            w.take(c)  # the cap full, no client near its share
    w.slots.refused_as_full("z")  # z under its split of 14 // 11: contended
    for c in clients[:4]:
        w.give(c)  # 12 in flight: slots to spare beyond the reserve
    for _ in range(3):
        clock.now += 1
        w.take("z")  # served, but not from the reserve: it no longer contends for the last slots
        w.give("z")
    for c in clients[:3]:
        w.take(c)  # the third at 14 in flight, into the reserve: no one refused for 3 s, nothing kept back
    assert w.in_flight == 15


def test_one_key_is_one_client_however_the_header_spells_it() -> None:
    spellings = ["Bearer k", "bearer k", "BEARER  k ", "Bearer k\t"]  # what authorize accepts as key k
    clients = {client_of(bearer_token(s), {}) for s in spellings}
    assert clients == {"k"}
    assert client_of(None, {"client": ("10.0.0.7", 5)}) == "10.0.0.7"
    assert client_of(None, {"client": None}) == ""


def test_an_ipv6_peer_is_its_slash_64() -> None:
    """A host rotating through its /64's addresses (or a subscriber's) is one client, not a fresh one each time,
    each fresh one free to take the reserve; an IPv4-mapped peer is its IPv4 address."""
    rotated = {client_of(None, {"client": (f"2001:db8:0:7::{i:x}", 5)}) for i in range(1, 300)}
    assert rotated == {"2001:db8:0:7::/64"}
    assert client_of(None, {"client": ("2001:db8:0:8::1", 5)}) == "2001:db8:0:8::/64"
    assert client_of(None, {"client": ("::ffff:10.0.0.7", 5)}) == "10.0.0.7"
    assert client_of(None, {"client": ("fe80::1%eth0", 5)}) == "fe80::/64"
    assert client_of(None, {"client": ("not:an address", 5)}) == "not:an address"


def test_through_the_gateway_a_flooding_key_leaves_room_for_another(monkeypatch) -> None:
    monkeypatch.setattr(client_slots, "CONTENDED_S", 1.5)
    fake = FakeTulip()
    fake.gate = threading.Event()
    with fake, gateway(fake, api_key_lanes=KEYS, max_concurrent_requests=4, workers=1, coalesce=False) as client:
        results: list = []

        def send(key: str) -> threading.Thread:
            t = threading.Thread(target=lambda: results.append(
                client.post("/v1/embeddings", json={"input": key}, headers=_auth(key))))
            t.start()
            return t

        def release(threads) -> None:
            fake.gate.set()
            for t in threads:
                t.join(timeout=10)
            fake.gate.clear()

        flood = [send("key-a") for _ in range(4)]  # alone, key-a fills the cap
        wait_until(lambda: fake.waiting == 4)
        full = client.post("/v1/embeddings", json={"input": "b"}, headers=_auth("key-b"))
        assert full.status_code == 429 and "concurrent requests" in full.json()["error"]["message"]
        release(flood)
        flood = [send("key-a") for _ in range(3)]  # over its share of 2, short of the reserve's 1
        wait_until(lambda: fake.waiting == 3)
        refusals = REGISTRY.get_sample_value("ivy_client_share_refusals_total") or 0
        fourth = client.post("/v1/embeddings", json={"input": "a"}, headers=_auth("key-a"))
        assert fourth.status_code == 429 and "this client holds 3" in fourth.json()["error"]["message"]
        assert fourth.headers["retry-after"] == "1"  # refused with a slot free: it is key-b's to take
        assert REGISTRY.get_sample_value("ivy_client_share_refusals_total") == refusals + 1
        flood.append(send("key-b"))
        wait_until(lambda: fake.waiting == 4)
        release(flood)
        assert [r.status_code for r in results] == [200] * 8  # nothing admitted is lost

        time.sleep(1.6)  # no one refused for CONTENDED_S: key-a may fill the cap again
        flood = [send("key-a") for _ in range(4)]
        wait_until(lambda: fake.waiting == 4)
        release(flood)
        assert [r.status_code for r in results[8:]] == [200] * 4
