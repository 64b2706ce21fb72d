"""Fixtures for Ivy's tests: a fake Tulip replica on loopback and a gateway client in front of it."""

from __future__ import annotations

from typing import Iterator

import pytest
from starlette.testclient import TestClient

from fake_tulip import FakeTulip
from ivy_testkit import gateway


@pytest.fixture
def fake() -> Iterator[FakeTulip]:
    with FakeTulip() as f:
        yield f


@pytest.fixture
def client(fake: FakeTulip) -> Iterator[TestClient]:
    with gateway(fake) as c:
        yield c
