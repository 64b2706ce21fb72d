"""No client may keep every request slot of a worker while others are refused (RELIABILITY 61).

The concurrency cap (Gateway.admit) refuses what comes past it with a 429, whoever sends it: a client that keeps the
cap full (a flood, a runaway retry loop, an indexer with more connections than it needs) would leave every other
client nothing but 429s. So the slots each client holds are counted. Once a client under its bound (below) is
refused as full, it is shut out and the worker is contended for CONTENDED_S: meanwhile a client that holds its bound
or more is refused (429, Retry-After) rather than take the last `reserve` free slots (an eighth of the worker's, at
least 1), so the shut-out client finds room when it comes back; each time it is served from the reserve beside a
client at its bound, the time runs again, so contention lasts while it keeps coming back to a nearly full worker
and ends CONTENDED_S after it stops (or finds free slots beyond the reserve). The heavy clients keep all but the
reserve: the device stays as busy. What a client has in flight always finishes. Nothing is refused while slots are
free and no one was refused: a client alone, or beside light traffic, may fill the cap as before.

A client's bound is its share (`share` of the worker's slots), or less where more clients want slots: all but the
reserve split evenly among those holding slots, those refused or served while contended within CONTENDED_S (a
client between two requests still wants slots) and the one asking (at least 1), so that the reserve stays free while
each holds no more than its bound. Several clients flooding at once are held alike: three that split a 16-slot cap
five each are over their bound of (16 - 2) // 4 once a fourth is refused, and while it comes back.

A client is the key it sends where Ivy checks keys (the token authorize accepted), else the peer's address (an IPv6
one's /64) as uvicorn reads it (X-Forwarded-For from a proxy it trusts: FORWARDED_ALLOW_IPS, 127.0.0.1 by default);
behind a proxy it does not trust, every request is the proxy's, one client. A request outside open_request's path (no
client set) is not counted.
"""

from __future__ import annotations

import functools
import ipaddress
import time
from contextvars import ContextVar

from ivy import metrics
from ivy.errors import IvyError, Problem

__all__ = ["CLIENT", "CONTENDED_S", "ClientSlots", "client_of"]

CLIENT: ContextVar[str | None] = ContextVar("ivy_client", default=None)
CONTENDED_S = 3.0  # past the 429's Retry-After of 1 s: a refused client that comes back finds the worker contended


def client_of(key: str | None, scope) -> str:
    """The request's client: `key`, the Bearer token Ivy accepted where it checks keys (one key, however the header
    spells "Bearer"; ivy.gateway.bearer_token), else the ASGI scope's peer address ("" when the server gives none):
    an IPv4 address, or an IPv6 address's /64 (one host or subscriber's, whose addresses it may rotate through to
    pass for many clients), an IPv4-mapped one as its IPv4 address."""
    if key is not None:
        return key
    peer = scope.get("client")
    host = peer[0] if peer else ""
    return _ipv6_client(host) if ":" in host else host


@functools.lru_cache(maxsize=4096)
def _ipv6_client(host: str) -> str:
    try:
        address = ipaddress.IPv6Address(host.split("%", 1)[0])  # a link-local address's zone is the same host's
    except ValueError:
        return host
    if address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return str(ipaddress.IPv6Network((address, 64), strict=False))


class _Recent:
    """Clients seen within CONTENDED_S -> when last seen, oldest first; at most `most` of them."""

    def __init__(self, most: int) -> None:
        self.seen: dict[str, float] = {}
        self.most = most

    def note(self, client: str, now: float) -> None:
        self.seen.pop(client, None)
        if len(self.seen) < self.most:  # past the worker's slots every bound is 1 anyway
            self.seen[client] = now

    def forget(self, now: float) -> None:
        while self.seen:
            client, since = next(iter(self.seen.items()))
            if now - since < CONTENDED_S:
                return
            del self.seen[client]


class ClientSlots:
    def __init__(self, slots: int, share: float, clock=time.monotonic) -> None:
        self.off = share >= 1
        self.slots = slots
        self.limit = max(1, int(slots * share))  # a client's share, rounded down
        self.reserve = max(1, slots // 8)  # free slots a heavy client may not take while contended
        self.held: dict[str, int] = {}
        self.shut_out = _Recent(slots)  # refused as full under their bound, refreshed when served again
        self.wanting = _Recent(slots)  # refused as full under their bound or served while contended
        self.contended_until = 0.0
        self.clock = clock

    @property
    def heavy(self) -> int:
        """Clients holding their whole share or more."""
        return sum(held >= self.limit for held in self.held.values())

    def bound(self, client: str) -> int:
        """The slots `client` may hold while the worker is contended (the module's docstring)."""
        wanting = len(self.held) + sum(c not in self.held for c in self.wanting.seen)
        wanting += client not in self.held and client not in self.wanting.seen
        return max(1, min(self.limit, (self.slots - self.reserve) // wanting))

    def _forget(self, now: float) -> None:
        self.shut_out.forget(now)
        self.wanting.forget(now)

    def refused_as_full(self, client: str | None) -> None:
        """A request refused by the cap: if its client holds less than its bound, it is shut out and the worker
        contended."""
        if client is None or self.off:
            return
        now = self.clock()
        self._forget(now)
        if self.held.get(client, 0) < self.bound(client):
            self.contended_until = now + CONTENDED_S
            self.shut_out.note(client, now)
            self.wanting.note(client, now)

    def take(self, client: str | None, in_flight: int) -> None:
        """Count one slot for `client` (`in_flight` of the worker's slots taken), or refuse it (429) where it holds
        its bound and only the reserve is free while the worker is contended."""
        if client is None or self.off:
            return
        held = self.held.get(client, 0)
        now = self.clock()
        if now < self.contended_until:
            self._forget(now)
            bound = self.bound(client)
            if held < bound:
                self.wanting.note(client, now)
                if client in self.shut_out.seen and self.slots - in_flight <= self.reserve:
                    # back, and served from the reserve kept for it: still contending for the last slots
                    self.shut_out.note(client, now)
                    if max(self.held.values(), default=0) >= bound:
                        self.contended_until = now + CONTENDED_S  # beside a heavy client
            elif self.slots - in_flight <= self.reserve:
                metrics.CLIENT_SHARE_REFUSALS.inc()
                raise IvyError(Problem.OVERLOADED, f"this client holds {held} of this worker's {self.slots} request "
                               "slots, its share of them or more while another client was refused for want of one: "
                               f"the last {self.reserve} free ones are kept for that client; retry later",
                               limit=bound)
        self.held[client] = held + 1

    def give(self, client: str | None) -> None:
        if client is None or self.off:
            return
        held = self.held[client] - 1
        if held:
            self.held[client] = held
        else:
            del self.held[client]
