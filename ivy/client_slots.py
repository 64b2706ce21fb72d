"""One client may not hold every request slot of a worker while others want one (RELIABILITY 61).

The concurrency cap (Gateway.admit) refuses what comes past it with a 429, whoever sends it: a client that keeps the
cap full (a flood, a runaway retry loop, an indexer with more connections than it needs) would leave every other
client nothing but 429s. So the slots a client holds are counted, and a client that holds `share` of them or more is
refused (429, Retry-After) while the worker is contended: another client has a request in flight here, or within
CONTENDED_S two clients had requests in flight at once or a client under its share was refused as full (so a
client that sends one request at a time keeps its place between them). Its requests in flight finish; its next
ones wait until it holds fewer. Alone, a client may still fill the cap, as before.

A client is the Bearer key it sends where Ivy checks keys (its own key, never logged), else the peer's address;
behind a proxy every request is the proxy's, one client, and nothing changes. A request outside open_request's
path (no client set) is not counted.
"""

from __future__ import annotations

import time
from contextvars import ContextVar

from ivy import metrics
from ivy.errors import IvyError, Problem

__all__ = ["CLIENT", "CONTENDED_S", "ClientSlots", "client_of"]

CLIENT: ContextVar[str | None] = ContextVar("ivy_client", default=None)
CONTENDED_S = 3.0  # a refusal as full marks the worker contended this long: past the 429's Retry-After of 1 s


def client_of(request, keyed: bool) -> str:
    """The request's client: its Authorization header where keys are checked (authorize passed it), else its
    peer's address ("" when the server gives none)."""
    if keyed:
        return request.headers.get("authorization") or ""
    peer = request.scope.get("client")
    return peer[0] if peer else ""


class ClientSlots:
    def __init__(self, slots: int, share: float, clock=time.monotonic) -> None:
        self.limit = max(1, int(slots * share)) if share < 1 else slots  # 1: never below the cap itself
        self.held: dict[str, int] = {}
        self.contended_until = 0.0
        self.clock = clock

    def refused_as_full(self, client: str | None) -> None:
        """A request refused by the cap: if its client holds less than its share, the worker is contended."""
        if client is not None and self.held.get(client, 0) < self.limit:
            self.contended_until = self.clock() + CONTENDED_S

    def take(self, client: str | None) -> None:
        """Count one slot for `client`, or refuse it (429) where it holds its share while the worker is contended."""
        if client is None:
            return
        held = self.held.get(client, 0)
        others = len(self.held) - (held > 0)
        if others:  # two clients at once
            self.contended_until = self.clock() + CONTENDED_S
        if held >= self.limit and (others or self.clock() < self.contended_until):
            metrics.CLIENT_SHARE_REFUSALS.inc()
            raise IvyError(Problem.OVERLOADED, f"this client holds {held} of this worker's request slots, its share "
                           "while other clients wait for one; retry later", limit=self.limit)
        self.held[client] = held + 1

    def give(self, client: str | None) -> None:
        if client is None:
            return
        held = self.held[client] - 1
        if held:
            self.held[client] = held
        else:
            del self.held[client]
