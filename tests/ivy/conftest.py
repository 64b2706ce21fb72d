"""Fixtures for Ivy's tests: a fake Tulip replica on loopback and a gateway client in front of it."""

from __future__ import annotations

import logging
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


@pytest.fixture(autouse=True)
def _root_logging_restored():
    """A CLI's main run in-process (`ivy index`, `ivy up`) sets up the root logger on the stderr of the moment,
    pytest's capture: left in place, every later test's log records went to that closed stream ("--- Logging error
    ---" in their output, failing tulip health's one-line check)."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
