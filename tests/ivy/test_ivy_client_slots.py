"""RELIABILITY 61: once a client under its share of a worker's request slots is refused as full, a client holding its
share or more is refused (429) instead, so one client flooding the concurrency cap cannot shut the others out;
while no one is refused, any client may fill the cap."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest
from fake_tulip import FakeTulip, wait_until
from ivy_testkit import gateway
from prometheus_client import REGISTRY

from ivy import client_slots
from ivy.client_slots import CONTENDED_S, ClientSlots, client_of
from ivy.errors import IvyError

KEYS = ("key-a=interactive", "key-b=interactive")


def _auth(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_client_at_its_share_is_refused_only_once_another_was_refused_as_full() -> None:
    clock = _Clock()
    slots = ClientSlots(8, 0.5, clock)
    for _ in range(8):
        slots.take("a")  # alone: the whole cap
    slots.refused_as_full("a")  # its own refusal by the cap contends with no one
    for _ in range(5):
        slots.give("a")
    slots.take("b")  # b beside a at its share, slots free, no one refused: nothing is refused
    slots.take("a")
    slots.take("a")
    slots.refused_as_full("b")  # b, under its share, was refused as full: contended
    with pytest.raises(IvyError, match="this client holds 5") as refused:
        slots.take("a")  # a holds its share or more: the slots its requests free are left to the others
    assert refused.value.status == 429 and refused.value.retry_after() == 1
    clock.now += CONTENDED_S - 1
    slots.take("b")  # b served beside heavy a: contended again from now
    clock.now += CONTENDED_S - 1
    with pytest.raises(IvyError):
        slots.take("a")
    clock.now += 2
    slots.take("a")  # no refusal and no light client served beside it for CONTENDED_S: a may grow again
    assert slots.held == {"a": 6, "b": 2} and slots.heavy == 1
    for _ in range(3):
        slots.give("a")
    assert slots.heavy == 0  # a below its share
    slots.take(None)  # a request outside open_request's path is not counted
    slots.give(None)
    off = ClientSlots(8, 1.0, clock)
    off.refused_as_full("b")
    for _ in range(9):
        off.take("a")  # share 1: off, whatever happens
    assert off.held == {} and ClientSlots(3, 0.1).limit == 1


def test_one_key_is_one_client_however_the_header_spells_it() -> None:
    spellings = ["Bearer k", "bearer k", "BEARER  k ", "Bearer k\t"]  # what authorize accepts as key k
    clients = {client_of(SimpleNamespace(headers={"authorization": s}, scope={}), keyed=True) for s in spellings}
    assert clients == {"k"}
    assert client_of(SimpleNamespace(headers={}, scope={"client": ("10.0.0.7", 5)}), keyed=False) == "10.0.0.7"
    assert client_of(SimpleNamespace(headers={}, scope={"client": None}), keyed=False) == ""


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
        flood = [send("key-a") for _ in range(2)]  # its share, 2 of 4
        wait_until(lambda: fake.waiting == 2)
        refusals = REGISTRY.get_sample_value("ivy_client_share_refusals_total") or 0
        third = client.post("/v1/embeddings", json={"input": "a"}, headers=_auth("key-a"))
        assert third.status_code == 429 and "this client holds 2" in third.json()["error"]["message"]
        assert third.headers["retry-after"] == "1"  # refused with two slots free: they are key-b's to take
        assert REGISTRY.get_sample_value("ivy_client_share_refusals_total") == refusals + 1
        flood += [send("key-b"), send("key-b")]
        wait_until(lambda: fake.waiting == 4)
        release(flood)
        assert [r.status_code for r in results] == [200] * 8  # nothing admitted is lost

        time.sleep(1.6)  # no one refused for CONTENDED_S: key-a may fill the cap again
        flood = [send("key-a") for _ in range(4)]
        wait_until(lambda: fake.waiting == 4)
        release(flood)
        assert [r.status_code for r in results[8:]] == [200] * 4
