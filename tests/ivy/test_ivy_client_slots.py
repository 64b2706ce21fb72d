"""RELIABILITY 61: a client that holds its share of a worker's request slots is refused (429) while other clients
want one, so one client flooding the concurrency cap cannot shut the others out; alone, it may fill the cap."""

from __future__ import annotations

import threading
import time

import pytest
from prometheus_client import REGISTRY
from fake_tulip import FakeTulip, wait_until
from ivy_testkit import gateway

from ivy import client_slots
from ivy.client_slots import CONTENDED_S, ClientSlots
from ivy.errors import IvyError

KEYS = ("key-a=interactive", "key-b=interactive")


def _auth(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_client_at_its_share_is_refused_only_while_others_want_a_slot() -> None:
    clock = _Clock()
    slots = ClientSlots(8, 0.5, clock)
    for _ in range(8):
        slots.take("a")  # alone: the whole cap
    slots.refused_as_full("a")  # its own refusal by the cap contends with no one
    slots.give("a")
    slots.take("a")
    slots.refused_as_full("b")  # b, holding nothing, was refused as full: contended
    for _ in range(4):
        slots.give("a")
    with pytest.raises(IvyError, match="this client holds 4") as refused:
        slots.take("a")  # holds its share (4 of 8) while b waits
    assert refused.value.status == 429 and refused.value.retry_after() == 1
    slots.take("b")
    clock.now += CONTENDED_S + 1
    with pytest.raises(IvyError):
        slots.take("a")  # b holds a slot: still contended
    slots.give("b")
    with pytest.raises(IvyError):
        slots.take("a")  # b gone, but it had a slot beside a's within CONTENDED_S: it may come back
    clock.now += CONTENDED_S + 1
    slots.take("a")  # b's last slot and refusal old: alone again
    assert slots.held == {"a": 5}
    slots.take(None)  # a request outside open_request's path is not counted
    slots.give(None)
    assert ClientSlots(8, 1.0).limit == 8 and ClientSlots(3, 0.1).limit == 1


def test_through_the_gateway_a_flooding_key_leaves_room_for_another(monkeypatch) -> None:
    monkeypatch.setattr(client_slots, "CONTENDED_S", 0.2)
    fake = FakeTulip()
    fake.gate = threading.Event()
    with fake, gateway(fake, api_key_lanes=KEYS, max_concurrent_requests=4, workers=1, coalesce=False) as client:
        results: list = []

        def send(key: str) -> threading.Thread:
            t = threading.Thread(target=lambda: results.append(
                client.post("/v1/embeddings", json={"input": key}, headers=_auth(key))))
            t.start()
            return t

        held = [send("key-a"), send("key-a")]
        wait_until(lambda: fake.waiting == 2)
        held.append(send("key-b"))
        wait_until(lambda: fake.waiting == 3)
        refusals = REGISTRY.get_sample_value("ivy_client_share_refusals_total") or 0
        third = client.post("/v1/embeddings", json={"input": "a"}, headers=_auth("key-a"))
        assert third.status_code == 429 and "this client holds 2" in third.json()["error"]["message"]
        assert REGISTRY.get_sample_value("ivy_client_share_refusals_total") == refusals + 1
        assert third.headers["retry-after"] == "1"
        held.append(send("key-b"))  # under its share: admitted, the fourth slot
        wait_until(lambda: fake.waiting == 4)
        fake.gate.set()
        for t in held:
            t.join(timeout=10)
        assert [r.status_code for r in results] == [200] * 4  # nothing admitted is lost

        fake.gate.clear()
        time.sleep(0.3)  # key-b's last slot beside key-a's is past CONTENDED_S
        alone = [send("key-a") for _ in range(4)]  # alone, one key may fill the cap
        wait_until(lambda: fake.waiting == 4)
        fake.gate.set()
        for t in alone:
            t.join(timeout=10)
        assert [r.status_code for r in results[4:]] == [200] * 4
