"""One client may not keep every request slot of a worker while others are refused (RELIABILITY 61).

The concurrency cap (Gateway.admit) refuses what comes past it with a 429, whoever sends it: a client that keeps the
cap full (a flood, a runaway retry loop, an indexer with more connections than it needs) would leave every other
client nothing but 429s. So the slots each client holds are counted. Once a client under its share (`share` of the
worker's slots) is refused as full, the worker is contended for CONTENDED_S: meanwhile a client that holds its share
or more is refused (429, Retry-After) rather than take the last `reserve` free slots (an eighth of the worker's,
at least 1), so the refused one finds room when it comes back; each time a client under its share is admitted beside
one at its share, the time runs again. The heavy client keeps all but the reserve: the device stays as busy.
What a client has in flight always finishes. Nothing is refused while slots are free and no one was refused: a
client alone, or beside light traffic, may fill the cap as before. With share 1/2 this protects against one
flooding client a worker; two that flood at once fill the cap between them.

A client is the key it sends where Ivy checks keys (the token authorize accepted), else the peer's address as
uvicorn reads it (X-Forwarded-For from a proxy it trusts: FORWARDED_ALLOW_IPS, 127.0.0.1 by default); behind a proxy
it does not trust, every request is the proxy's, one client. A request outside open_request's path (no client set)
is not counted.
"""

from __future__ import annotations

import time
from contextvars import ContextVar

from ivy import metrics
from ivy.errors import IvyError, Problem

__all__ = ["CLIENT", "CONTENDED_S", "ClientSlots", "client_of"]

CLIENT: ContextVar[str | None] = ContextVar("ivy_client", default=None)
CONTENDED_S = 3.0  # past the 429's Retry-After of 1 s: a refused client that comes back finds the worker contended


def client_of(key: str | None, scope) -> str:
    """The request's client: `key`, the Bearer token Ivy accepted where it checks keys (one key, however the header
    spells "Bearer"; ivy.gateway.bearer_token), else the ASGI scope's peer address ("" when the server gives none)."""
    if key is not None:
        return key
    peer = scope.get("client")
    return peer[0] if peer else ""


class ClientSlots:
    def __init__(self, slots: int, share: float, clock=time.monotonic) -> None:
        self.off = share >= 1
        self.slots = slots
        self.limit = max(1, int(slots * share))  # a client's share, rounded down
        self.reserve = max(1, slots // 8)  # free slots a heavy client may not take while contended
        self.held: dict[str, int] = {}
        self.heavy = 0  # clients holding their share or more
        self.contended_until = 0.0
        self.clock = clock

    def refused_as_full(self, client: str | None) -> None:
        """A request refused by the cap: if its client holds less than its share, the worker is contended."""
        if client is not None and not self.off and self.held.get(client, 0) < self.limit:
            self.contended_until = self.clock() + CONTENDED_S

    def take(self, client: str | None, in_flight: int) -> None:
        """Count one slot for `client` (`in_flight` of the worker's slots taken), or refuse it (429) where it holds
        its share and only the reserve is free while the worker is contended."""
        if client is None or self.off:
            return
        held = self.held.get(client, 0)
        if held >= self.limit:
            if self.slots - in_flight <= self.reserve and self.clock() < self.contended_until:
                metrics.CLIENT_SHARE_REFUSALS.inc()
                raise IvyError(Problem.OVERLOADED, f"this client holds {held} of this worker's request slots, more "
                               "than its share, and the last free ones are kept for another client that was refused "
                               "for want of one; retry later",
                               limit=self.limit)
        elif self.heavy and self.clock() < self.contended_until:
            self.contended_until = self.clock() + CONTENDED_S  # a light client served beside a heavy one
        self.held[client] = held + 1
        if held + 1 == self.limit:
            self.heavy += 1

    def give(self, client: str | None) -> None:
        if client is None or self.off:
            return
        held = self.held[client] - 1
        if held + 1 == self.limit:
            self.heavy -= 1
        if held:
            self.held[client] = held
        else:
            del self.held[client]
